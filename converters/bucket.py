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
two on one node are refused (the staging folder's lock), two on two nodes are not detected.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os

from fastdata.converters.units import manifest_options
from fastdata.format import (
    ANNOTATIONS,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    TARGETS,
    ShardFormatError,
    ShardMeta,
)
from fastdata.outdir import FINAL_NAMES
from fastdata.shards.cache import default_cache_dir
from fastdata.shards.remote import Remote

log = logging.getLogger("fastdata.convert")

JOURNAL = "convert-journal.json"
JOURNAL_FORMAT = "fastdata-convert-journal"
#: the most bytes of a journal read back (a shard's entry is a few hundred bytes, more with
#: skipped files)
MAX_JOURNAL_BYTES = 256 << 20


def staging_folder(url: str) -> str:
    """The local folder a conversion into ``url`` writes its shards in before they go up."""
    digest = hashlib.sha256(Remote(url).shown.encode()).hexdigest()[:32]
    return os.path.join(default_cache_dir(), "uploads", digest)


def upload_shard(remote: Remote, path: str) -> tuple[int, str]:
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
        self.remote = Remote(url)
        self.url, self.shown = self.remote.url, self.remote.shown
        self.journal: list[dict] = []       # the uploaded shards' entries, in order
        self._header: dict = {}

    def prepare(self, *, overwrite: bool, resume: bool) -> None:
        """Check the store's folder for this run: empty, or resumable, or emptied of what
        fastdata wrote there with ``overwrite``.

        Raises:
            FileExistsError: it holds objects, and neither ``overwrite`` nor ``resume``.
        """
        if resume:
            return
        present = self.remote.objects()
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

    def finish(self, folder: str, manifest: dict) -> None:
        """The targets or annotations (if any) and the manifest from ``folder`` into the
        store, the manifest last."""
        for name, key in ((TARGETS, "targets"), (ANNOTATIONS, "annotations")):
            if key in manifest:
                self.remote.put_file(name, os.path.join(folder, name))
        with open(os.path.join(folder, MANIFEST), "rb") as f:
            self.remote.put(MANIFEST, f.read())


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
