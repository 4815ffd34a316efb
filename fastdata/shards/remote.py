"""A remote set's files made local: its manifest and label files fetched into the node
cache at each open (``fetch_manifest``), each shard fetched once per node and checked
(``Fetch``), from any store (``fastdata.shards.stores``)."""
from __future__ import annotations

import os

from fastdata.shards.stores import Store


def fetch_manifest(remote: Store, cache) -> str:
    """The set's manifest (and targets) copied from the store into a folder of the cache
    (``sets/<digest of the URL>``); returns that folder, which ``ShardSet`` reads."""
    import hashlib
    import json

    from fastdata.format import ANNOTATIONS, MANIFEST, MAX_MANIFEST_BYTES, TARGETS
    from fastdata.shards.cache import disk_errors

    view = os.path.join(cache.root, "sets", hashlib.sha256(remote.shown.encode()).hexdigest()[:32])
    data = remote.read(MANIFEST, MAX_MANIFEST_BYTES)
    with disk_errors(cache.root, f"{remote.shown}/{MANIFEST}"):
        os.makedirs(view, exist_ok=True)
        _write(view, MANIFEST, data)
    for name, key in ((TARGETS, "targets"), (ANNOTATIONS, "annotations")):
        if f'"{key}"'.encode() not in data:     # a set with no such file
            continue
        try:
            entry = json.loads(data)[key]
            limit = (4096 + 4 * int(entry["shape"][0]) * int(entry["shape"][1])
                     if key == "targets" else int(entry["bytes"]))  # as each is read
        except (ValueError, TypeError, KeyError, IndexError):
            return view                     # ShardSet names what is wrong with the manifest
        blob = remote.read(name, limit)
        with disk_errors(cache.root, f"{remote.shown}/{name}"):
            _write(view, name, blob)
    return view


def _write(folder: str, name: str, data: bytes) -> None:
    from fastdata.outdir import replace_atomically

    replace_atomically(os.path.join(folder, name), data, durable=False)    # fetched again


class Fetch:
    """A remote shard made local: ``fetch()`` returns its cached file, downloaded and checked
    first where the cache does not hold it (``ShardReader.fetch``). Picklable."""

    def __init__(self, remote: Store, cache, entry: dict, container: str, sizes, encoding: str,
                 fields: dict | None = None):
        from fastdata.shards.cache import shard_key

        self.remote, self.cache, self.entry = remote, cache, entry
        self.container, self.sizes, self.encoding = container, tuple(sizes), encoding
        self.fields = fields
        self.key = shard_key(entry, container)
        self.path = cache.path(self.key)

    def __call__(self) -> str:
        # what one download found lives in this call, not on the object: a Fetch is pickled
        # to spawned workers, a hash object is not picklable
        found: dict = {}

        def download(fd: int) -> None:
            import hashlib

            found["hash"] = hashlib.sha256() if "file_sha256" in self.entry else None
            found["bytes"] = self.remote.download(
                self.entry["file"], fd, None if found["hash"] is None else found["hash"].update,
                limit=self.entry["bytes"])
        return self.cache.get(self.key, self.entry["bytes"], download,
                              lambda path: self._check(path, found),
                              f"{self.remote.shown}/{self.entry['file']}")

    def _check(self, path: str, found: dict) -> str | None:
        """What is wrong with the download at ``path`` (None: it matches the manifest)."""
        want = self.entry["bytes"]
        if found["bytes"] != want:
            return f"{found['bytes']} bytes arrived, the manifest says {want}"
        if found["hash"] is not None:
            if found["hash"].hexdigest() != self.entry["file_sha256"]:
                return "its SHA-256 is not the manifest's"
            return None
        from fastdata.shards.integrity import verify_shard
        from fastdata.shards.reader import READERS

        reader = READERS[self.container](path, sizes=self.sizes, encoding=self.encoding,
                                         count=self.entry["count"], start=self.entry["start"],
                                         fields=self.fields)
        problems = verify_shard(reader, {**self.entry}, decode=False)
        return str(problems[0]).split(": ", 1)[-1] if problems else None

