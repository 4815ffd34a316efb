"""What a conversion finds in its output folder: whether it may write there, the shards a
resumed run keeps, and the options the interrupted run was started with."""
from __future__ import annotations

import hashlib
import json
import logging
import os

from fastdata.converters.decode import DecodeOptions
from fastdata.converters.units import manifest_options, output_folder
from fastdata.converters.writers import WRITERS
from fastdata.format import (
    CONTAINERS,
    FORMAT_VERSION,
    MANIFEST,
    SHARD_SUFFIX,
    ShardMeta,
    shard_file,
)
from fastdata.outdir import (
    CONVERT_NAMES,
    LOCK,
    foreign_at_own_names,
    is_regular,
    leftover_temps,
    remove_own,
)
from fastdata.shards import READERS
from fastdata.shards.verify import verify_shard

log = logging.getLogger("fastdata")


def fingerprint(scan, opts: DecodeOptions, container: str, shard_size: int) -> str:
    h = hashlib.sha256(json.dumps([FORMAT_VERSION, container, list(opts.sizes), opts.fit,
                                   opts.encoding, opts.quality, shard_size, scan.classes,
                                   scan.label_kind]).encode())
    for path, label in scan.files:
        h.update(f"{label}\0{path}\0".encode("utf-8", "surrogateescape"))
    if scan.targets is not None:
        h.update(scan.targets.tobytes())
    if scan.masks is not None:
        h.update(scan.masks[1].encode())
    if scan.values is not None:
        h.update(scan.values.digest())
    if scan.images is not None:
        h.update(scan.images.digest())
    return h.hexdigest()


def prepare_out(out: str, src: str, *, overwrite: bool, resume: bool) -> None:
    """Check ``out`` (locked by the caller) for this run: empty, or resumable, or emptied of
    what fastdata wrote there with ``overwrite``."""
    real_out, real_src = os.path.realpath(out), os.path.realpath(src)
    if real_out == real_src or real_out.startswith(real_src + os.sep):
        raise ValueError(f"output {out!r} is inside the source folder {src!r}; "
                         f"choose a directory outside it (the source is never modified)")
    foreign = foreign_at_own_names(out)
    if foreign:
        raise ValueError(f"{out}: {', '.join(foreign[:3])} {'is' if len(foreign) == 1 else 'are'} "
                         f"not a file fastdata wrote (a link, a folder or a special file at a "
                         f"name it writes): move {'it' if len(foreign) == 1 else 'them'} away "
                         f"or choose another output folder")
    entries = [n for n in os.listdir(out) if n != LOCK]
    if not entries or resume:
        return
    if not overwrite:
        raise FileExistsError(f"output {out!r} is not empty; pass --overwrite to replace it or "
                              f"--resume to finish an interrupted conversion")
    gone = remove_own(out, sorted(n for n in entries if CONVERT_NAMES.fullmatch(n)))
    log.info("--overwrite removed %d file%s fastdata had written in %s%s", len(gone),
             "" if len(gone) == 1 else "s", out, f": {', '.join(gone[:5])}" +
             (", ..." if len(gone) > 5 else "") if gone else "")
    others = [n for n in os.listdir(out) if n != LOCK]
    if others:
        log.warning("--overwrite left %d entr%s in %s that fastdata did not write (e.g. %s)",
                    len(others), "y" if len(others) == 1 else "ies", out, others[0])


def reusable_shards(out: str, container: str, sizes, encoding: str, fp: str,
                    fields: dict | None = None) -> list[ShardMeta]:
    """The longest run of complete, checksum-valid shards 0..k-1 of this very job (whose
    shards hold ``fields``). Shards of another job (other options or inputs) are refused, not
    deleted."""
    other = [n for n in os.listdir(out) if n.startswith("shard-") and n.endswith(tuple(
        x for c, x in SHARD_SUFFIX.items() if c != container))]
    first = os.path.join(out, shard_file(container, 0))
    if other or job_of(first, container) not in (fp, None):
        raise ValueError(f"{out}: {min(other) if other else os.path.basename(first)} is from a "
                         f"conversion with other options or inputs (format, sizes, fit, "
                         f"encoding, quality, shard size or the source's files); resume with "
                         f"the ones it was started with, or use --overwrite to start again")
    kept: list[ShardMeta] = []
    while True:
        path = os.path.join(out, shard_file(container, len(kept)))
        if not os.path.isfile(path):
            break
        reader = READERS[container](path, sizes=sizes, encoding=encoding, count=None,
                                    fields=fields)
        try:
            meta = reader.meta()
        except Exception:   # noqa: BLE001 - an unreadable shard is simply redone
            break
        finally:
            reader.close()
        expected_start = kept[-1].start + kept[-1].count if kept else 0
        if meta.config != fp or meta.index != len(kept) or meta.start != expected_start:
            break
        if verify_shard(reader, {"file": os.path.basename(path), "start": meta.start,
                                 "count": meta.count, "sha256": meta.sha256}):
            break
        kept.append(meta)
    drop_unfinished(out, container, len(kept))
    return kept


def kept_entries(job, kept: list[ShardMeta]) -> list[dict]:
    """The manifest entries of the ``kept`` shards of a resumed run."""
    if job.bucket is not None:
        return job.bucket.entries()
    return [{"file": shard_file(job.container, m.index), "start": m.start, "count": m.count,
             "sha256": m.sha256, "bytes": os.path.getsize(os.path.join(
                 job.out, shard_file(job.container, m.index)))} for m in kept]


def uploaded(job, entry: dict, meta: ShardMeta) -> dict:
    """A shard just placed in ``job.out``, for a conversion into a store: uploaded, recorded in
    the journal and removed here; its ``entry`` with the whole file's SHA-256."""
    if job.bucket is None:
        return entry
    from fastdata.converters.bucket import upload_shard

    entry["bytes"], entry["file_sha256"] = upload_shard(
        job.bucket.remote, os.path.join(job.out, entry["file"]))
    job.bucket.record(entry, meta)
    return entry


def drop_unfinished(out: str, container: str, kept: int) -> None:
    """Remove what an interrupted run left half-written, and the shards after the ``kept``
    ones (regular files of fastdata's names only)."""
    suffix = SHARD_SUFFIX[container]
    later = [n for n in os.listdir(out) if CONVERT_NAMES.fullmatch(n) and n.startswith("shard-")
             and n.endswith(suffix) and int(n[6:-len(suffix)]) >= kept]
    gone = remove_own(out, leftover_temps(out) + later)
    if gone:
        log.info("removed %d unfinished file%s of the interrupted run: %s", len(gone),
                 "" if len(gone) == 1 else "s", ", ".join(gone[:5]) +
                 (", ..." if len(gone) > 5 else ""))


def job_of(path: str, container: str) -> str | None:
    """The fingerprint of the job that wrote shard ``path``; None if it is missing or cannot be
    read (a damaged shard is redone)."""
    if not os.path.isfile(path):
        return None
    reader = READERS[container](path, sizes=(), encoding="raw", count=None)
    try:
        return reader.meta().config
    except Exception:       # noqa: BLE001
        return None
    finally:
        reader.close()


def finished_manifest(out: str) -> dict | None:
    """The manifest of a finished conversion in ``out``; None if there is none or it is
    damaged (then the shards that verify are reused and the manifest is written anew)."""
    path = os.path.join(out, MANIFEST)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            m = json.load(f)
        if isinstance(m, dict):
            return m
    except (json.JSONDecodeError, UnicodeDecodeError):
        pass
    log.warning("%s is damaged: rebuilding it from the shards that verify", path)
    return None


def what_differs(done: dict, container: str, opts: DecodeOptions, scan) -> str:
    """The options (or inputs) a finished set's manifest has and this run does not, named."""
    quality = opts.quality if opts.encoding == "jpeg" else None
    asked = (("format", "container", container), ("sizes", "sizes", list(opts.sizes)),
             ("fit", "fit", opts.fit), ("encoding", "encoding", opts.encoding),
             ("quality", "quality", quality), ("classes", "classes", scan.classes))
    diffs = [f"{name} {done.get(key)!r} there, {value!r} here" for name, key, value in asked
             if done.get(key) != value]
    return "; ".join(diffs) or "the source's files or the shard size"


def changed_shards(out: str, manifest: dict) -> str:
    """What is wrong at a glance (no checksums) with a finished set's shards: the first shard
    missing, or of another size than the manifest's, named; '' if none."""
    for entry in manifest["shards"]:
        path = os.path.join(out, entry["file"])
        size = os.path.getsize(path) if os.path.isfile(path) else None
        if size != entry["bytes"]:
            return f"{entry['file']} is " + ("missing" if size is None else
                                              f"{size} bytes, written with {entry['bytes']}")
    return ""


def saved_options(out: str) -> tuple[dict, str] | None:
    """The options a conversion into ``out`` was made with, and where they were found (its
    manifest, or for one that did not finish its first shard); None where neither says.
    Nothing found there is trusted beyond being passed back to ``convert()``, which checks it.
    """
    folder = output_folder(out)
    if folder is None:
        from fastdata.converters.bucket import Bucket

        return Bucket(out).saved_options()
    out = folder
    done = finished_manifest(out) if is_regular(os.path.join(out, MANIFEST)) else None
    if done is not None and manifest_options(done) is not None:
        return manifest_options(done), os.path.join(out, MANIFEST)
    for container in CONTAINERS:
        path = os.path.join(out, shard_file(container, 0))
        if not is_regular(path):
            continue
        try:
            options = json.loads(WRITERS[container].options(path))
        except Exception:       # noqa: BLE001 - a damaged shard says nothing
            continue
        if isinstance(options, dict):
            return options, path
    return None
