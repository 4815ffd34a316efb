"""Conversion into an object store: ``fastdata convert SRC s3://bucket/set`` (``gs://`` and
``az://`` through the same client; a ``file://`` URL is converted as a folder).

The shards are written as for a folder, into a staging folder of the node-local cache
(``<cache>/uploads/<digest of the URL>``), and each goes up as soon as it is complete (in
parts where large) and leaves the staging folder: the disk holds a shard or two, whatever the
set's size. Every upload is recorded in a journal object beside the shards
(``convert-journal.json``: each shard's metadata, size and whole-file SHA-256); the manifest
goes up last, with ``file_sha256`` for every shard. ``resume`` keeps the journal's shards that
the store holds at their recorded size and continues after them; ``overwrite`` removes the
objects at the names fastdata writes, and nothing else. One conversion per URL at a time:
two on one node are refused by the staging folder's lock, two on two nodes by a lock object
(``convert-lock.json``, created only where there is none, which the store decides; renewed at
every upload, removed at the end). A lock left by a conversion that was killed is taken over
once it is stale: at once on the node that wrote it where its process is gone, else after
``STALE_SECONDS`` without renewal.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import socket
import time

from fastdata.converters.units import manifest_options
from fastdata.format import (
    MANIFEST,
    MAX_MANIFEST_BYTES,
    ShardFormatError,
    ShardMeta,
)
from fastdata.outdir import FINAL_NAMES, FolderBusyError
from fastdata.shards.cache import ShardCache
from fastdata.shards.stores import Store, open_store

log = logging.getLogger("fastdata.convert")

JOURNAL = "convert-journal.json"
JOURNAL_FORMAT = "fastdata-convert-journal"
#: the most bytes of a journal read back (a shard's entry is a few hundred bytes, more with
#: skipped files)
MAX_JOURNAL_BYTES = 256 << 20
LOCK = "convert-lock.json"
#: a lock not renewed for this long is a stopped conversion's (one renews it at every upload)
STALE_SECONDS = 600


def staging_folder(url: str, cache_dir: str | os.PathLike | None = None) -> str:
    """The local folder a conversion into ``url`` writes its shards in before they go up: in
    the node cache at ``cache_dir`` (default ``default_cache_dir()``)."""
    digest = hashlib.sha256(open_store(url).shown.encode()).hexdigest()[:32]
    return os.path.join(ShardCache(cache_dir).root, "uploads", digest)


def upload_shard(remote: Store, path: str) -> tuple[int, str]:
    """The finished shard at ``path`` into the store under its name, then removed here;
    returns its size and whole-file SHA-256."""
    size = os.path.getsize(path)
    digest = remote.put_file(os.path.basename(path), path)
    os.remove(path)
    return size, digest


class Bucket:
    """A conversion's output in a store: what is there, what a resumed run keeps, the uploads
    and the journal.

    Args:
        url: the set's URL (its folder in the store).
    """

    def __init__(self, url: str):
        self.remote = open_store(url)
        self.url, self.shown = self.remote.url, self.remote.shown
        self.journal: list[dict] = []       # the uploaded shards' entries, in order
        self._header: dict = {}
        self._lock: dict | None = None      # this run's lock object, while it holds it

    def lock(self) -> None:
        """Hold the URL for this conversion (``convert-lock.json``, see the module).

        Raises:
            FolderBusyError: another conversion holds it (the message names its node,
                process and when it was last active).
        """
        me = {"host": socket.gethostname(), "pid": os.getpid(), "token": secrets.token_hex(8)}
        for _ in range(3):
            try:
                self.remote.create(LOCK, json.dumps({**me, "beat": time.time()}).encode())
                self._lock = me
                return
            except FileExistsError:
                held = self._read_json(LOCK, 4096)
            why = _stopped(held)
            if why is None:
                raise FolderBusyError(
                    f"{self.shown}: another conversion is writing there ({_holder(held)}); "
                    f"wait for it to finish, or stop it (its lock is taken over "
                    f"{STALE_SECONDS // 60} minutes after it was last active, at once on "
                    f"its node once it is gone)")
            log.warning("%s: taking over the lock of a conversion that stopped (%s: %s)",
                        self.shown, _holder(held), why)
            self.remote.delete([LOCK])
        raise FolderBusyError(f"{self.shown}: the lock {LOCK} keeps being taken")

    def _beat(self) -> None:
        """Renew this run's lock (it is active)."""
        if self._lock is not None:
            self.remote.put(LOCK, json.dumps({**self._lock, "beat": time.time()}).encode())

    def unlock(self) -> None:
        """Let the URL go (a no-op where this run holds no lock)."""
        if self._lock is not None:
            self._lock = None
            self.remote.delete([LOCK])

    def prepare(self, *, overwrite: bool, resume: bool) -> None:
        """Check the store's folder for this run: empty, or resumable, or emptied of what
        fastdata wrote there with ``overwrite``.

        Raises:
            FileExistsError: it holds objects, and neither ``overwrite`` nor ``resume``.
        """
        if resume:
            return
        present = {k: v for k, v in self.remote.objects().items() if k != LOCK}    # this run's
        if not present:
            return
        if not overwrite:
            raise FileExistsError(f"output {self.shown} is not empty; pass --overwrite to "
                                  f"replace it or --resume to finish an interrupted conversion")
        own = sorted(n for n in present if FINAL_NAMES.fullmatch(n) or n == JOURNAL)
        # the manifest first: the set is never a manifest over missing shards
        self.remote.delete(sorted(own, key=lambda n: n != MANIFEST))
        log.info("--overwrite removed %d object%s fastdata had written in %s", len(own),
                 "" if len(own) == 1 else "s", self.shown)
        others = sorted(set(present) - set(own))
        if others:
            log.warning("--overwrite left %d object%s in %s that fastdata did not write (e.g. "
                        "%s)", len(others), "" if len(others) == 1 else "s", self.shown,
                        others[0])

    def _read_json(self, name: str, limit: int) -> dict | None:
        """The JSON object ``name``; None where it is missing or not a JSON object."""
        try:
            data = json.loads(self.remote.read(name, limit))
        except FileNotFoundError:
            return None
        except (ValueError, UnicodeDecodeError):
            data = None
        if not isinstance(data, dict):
            log.warning("%s/%s is damaged: not used", self.shown, name)
            return None
        return data

    def finished(self, fp: str, differs) -> dict | None:
        """The manifest of a finished conversion of this job at the URL, all of its shards
        there at their sizes; None otherwise (a manifest over missing shards is removed).
        ``differs(manifest)`` names what another job's manifest has otherwise.

        Raises:
            ValueError: the URL holds a finished conversion of another job.
        """
        done = self._read_json(MANIFEST, MAX_MANIFEST_BYTES)
        if done is None:
            return None
        if done.get("config") != fp:
            raise ValueError(f"{self.shown} holds a finished conversion with other options or "
                             f"inputs ({differs(done)}); use --overwrite to replace it")
        present = self.remote.objects()
        shards = done.get("shards")
        for entry in shards if isinstance(shards, list) and shards else [None]:
            name = entry.get("file") if isinstance(entry, dict) else None
            if not isinstance(name, str) or present.get(name) != entry.get("bytes"):  # type: ignore[union-attr]
                log.warning("%s: %s; redoing from there", self.shown,
                            f"{name} is missing or of another size" if isinstance(name, str)
                            else "its manifest is damaged")
                self.remote.delete([MANIFEST])
                return None
        log.info("%s is already complete", self.shown)
        return done

    def kept(self, fp: str, options: dict, container: str) -> list[ShardMeta]:
        """The shards of this job (fingerprint ``fp``) that the journal records and the store
        holds at their recorded sizes, from the first on; the shards after them removed."""
        journal = self._read_json(JOURNAL, MAX_JOURNAL_BYTES)
        self._header = {"format": JOURNAL_FORMAT, "config": fp, "options": options}
        if journal is not None and journal.get("config") != fp:
            raise ValueError(f"{self.shown}: {JOURNAL} is from a conversion with other options "
                             f"or inputs; resume with the ones it was started with, or use "
                             f"--overwrite to start again")
        present = self.remote.objects()
        self.journal = _recorded(journal.get("shards") if journal else None, present,
                                 container)
        names = {e["file"] for e in self.journal}
        self.remote.delete(sorted(n for n in present if n.startswith("shard-")
                                  and FINAL_NAMES.fullmatch(n) and n not in names))
        return [ShardMeta.from_json(json.dumps(e["meta"])) for e in self.journal]

    def saved_options(self) -> tuple[dict, str] | None:
        """The options the conversion at the URL was started with, and where they were found;
        None where neither the manifest nor the journal says."""
        done = self._read_json(MANIFEST, MAX_MANIFEST_BYTES)
        if done is not None and manifest_options(done) is not None:
            return manifest_options(done), f"{self.shown}/{MANIFEST}"
        journal = self._read_json(JOURNAL, MAX_JOURNAL_BYTES)
        if journal is not None and isinstance(journal.get("options"), dict):
            return journal["options"], f"{self.shown}/{JOURNAL}"
        return None

    def entries(self) -> list[dict]:
        """The manifest entries of the shards kept from an earlier run."""
        return [{k: e[k] for k in ("file", "start", "count", "sha256", "bytes", "file_sha256")}
                for e in self.journal]

    def record(self, entry: dict, meta: ShardMeta) -> None:
        """An uploaded shard (its manifest ``entry``, with ``file_sha256``) into the journal."""
        self.journal.append({**entry, "meta": json.loads(meta.to_json())})
        self.remote.put(JOURNAL, json.dumps({**self._header, "shards": self.journal}).encode())
        self._beat()

    def finish(self, folder: str) -> None:
        """The manifest from ``folder`` into the store, after every shard."""
        with open(os.path.join(folder, MANIFEST), "rb") as f:
            self.remote.put(MANIFEST, f.read())


def _holder(held: dict | None) -> str:
    """Who holds a lock, in words."""
    if held is None:
        return "its lock is unreadable"
    beat = held.get("beat")
    ago = f", last active {time.time() - beat:.0f} s ago" if isinstance(beat, (int, float)) \
        else ""
    return f"process {held.get('pid')} on {str(held.get('host'))[:100]}{ago}"


def _stopped(held: dict | None) -> str | None:
    """Why the conversion holding a lock has stopped, or None while it may be running."""
    if held is None:
        return "its lock is gone or unreadable"
    beat = held.get("beat")
    if not isinstance(beat, (int, float)) or time.time() - beat > STALE_SECONDS:
        return f"not active for {STALE_SECONDS // 60} minutes"
    pid = held.get("pid")
    if held.get("host") == socket.gethostname() and isinstance(pid, int) and pid > 0:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return "its process is gone"
        except PermissionError:         # another user's: running
            return None
    return None


def _recorded(shards, present: dict[str, int], container: str) -> list[dict]:
    """The journal's entries, from the first on, that are consistent and whose shards the
    store holds at their recorded sizes."""
    from fastdata.format import shard_file

    kept: list[dict] = []
    end = 0                             # where the next shard's samples start
    for e in shards if isinstance(shards, list) else []:
        try:
            meta = ShardMeta.from_json(json.dumps(e["meta"]))
            sound = (e["file"] == shard_file(container, len(kept)) == shard_file(
                container, meta.index) and e["start"] == meta.start == end
                and e["count"] == meta.count and e["sha256"] == meta.sha256
                and isinstance(e["file_sha256"], str) and present.get(e["file"]) == e["bytes"])
        except (KeyError, TypeError, ShardFormatError):
            sound = False
        if not sound:
            break
        kept.append(e)
        end = meta.start + meta.count
    return kept
