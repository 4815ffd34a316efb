"""The conversion pipeline: scan → decode/resize in worker processes → one writer → manifest.

Workers return payloads in input order through a bounded window of in-flight batches, so memory
stays flat (the window, plus a shard's JPEG payloads until it is written; raw pixels go straight
into the shard file) whatever the dataset size. A worker that dies or hangs is detected: its
batch is retried one image at a time in a fresh pool (``fastdata.converters.pool``) and the
image that kills a worker is skipped and reported. Shards are written atomically; ``manifest.json``
last. ``resume=True`` keeps every complete shard whose checksum verifies and continues after it.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from fastdata.checks import choice, flag, integer, printable
from fastdata.converters.decode import DecodeOptions
from fastdata.converters.geometry import cut_away, placed
from fastdata.converters.pool import Decoder, in_flight
from fastdata.converters.resume import (
    changed_shards,
    drop_unfinished,
    fingerprint,
    finished_manifest,
    kept_entries,
    prepare_out,
    reusable_shards,
    uploaded,
    what_differs,
)
from fastdata.converters.scan import Scan
from fastdata.converters.sources import source_for
from fastdata.converters.units import ConversionError, output_folder, range_end
from fastdata.converters.writers import WRITERS
from fastdata.env import usable_cpus, usable_memory, warn_if_not_simd
from fastdata.fields import FieldKind
from fastdata.fields.infer import field_option
from fastdata.fields.schema import entries
from fastdata.format import (
    CONTAINERS,
    ENCODINGS,
    FIELDS_VERSION,
    FITS,
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST,
    ShardMeta,
    check_size,
    shard_file,
    skip_summary,
    write_json_atomic,
)
from fastdata.interrupt import SigintLatch
from fastdata.outdir import (
    FolderLock,
    leftover_temps,
    remove_own,
)
from fastdata.shards.stores import is_url

log = logging.getLogger("fastdata.convert")

SHARD_BYTES = 256 << 20             # default --shard-size keeps a shard near this


ENGINES = ("local", "ray")
#: the sources a conversion records by name, so that ``--resume`` reads the same kind
_DETECTED_KINDS = ("webdataset", "parquet", "hf")


def _sample_bytes(sizes, encoding: str) -> int:
    """Bytes of one sample in a shard (JPEG: a rough 1/8 of raw)."""
    return sum(3 * s * s for s in sizes) // (1 if encoding == "raw" else 8)


def default_shard_size(sizes, encoding: str) -> int:
    return max(64, min(100_000, SHARD_BYTES // _sample_bytes(sizes, encoding)))


def _check_memory(shard_size: int, files: int, sizes, encoding: str, workers: int) -> None:
    """Refuse a job whose samples in memory would take more than half of it (it was a
    MemoryError traceback, or the OOM killer): a JPEG shard's payloads until it is written,
    the raw images in flight."""
    memory = usable_memory()
    if memory is None:
        return
    per_sample = _sample_bytes(sizes, encoding)
    if encoding == "jpeg" and min(shard_size, files) * per_sample > memory // 2:
        raise ValueError(f"shard_size={shard_size} makes shards of "
                         f"{min(shard_size, files) * per_sample / 2**30:.1f} GiB, each held in "
                         f"memory while it is written, and this process may use "
                         f"{memory / 2**30:.1f} GiB: use --shard-size "
                         f"{max(1, memory // 2 // per_sample)} or less")
    if encoding == "raw" and in_flight(workers, sizes) * per_sample > memory // 2:
        raise ValueError(f"sizes {list(sizes)} make raw images of {per_sample / 2**30:.1f} GiB, "
                         f"{in_flight(workers, sizes)} of them in flight between {workers} decode "
                         f"worker{'s' if workers > 1 else ''} and the writer, and this process "
                         f"may use {memory / 2**30:.1f} GiB: use smaller sizes or fewer "
                         f"--num-workers")


def _field_kinds(fields) -> dict[str, str] | None:
    """``fields`` checked: a column's kind by name, each kind a registered one.

    Raises:
        ValueError: not a mapping of names to kinds, or an unknown kind (naming the kinds).
    """
    if fields is None:
        return None
    if not isinstance(fields, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                               for k, v in fields.items()):
        raise ValueError(f"fields={fields!r} is not valid; give column names and kinds, e.g. "
                         f"{{'caption': 'text'}}")
    for name, kind in fields.items():
        field_option(f"{name}={kind}")      # names the kinds
    return dict(fields) or None


def _check_placed(fields: dict | None, fit: str) -> None:
    """Refuse a kind that moves with the pixels but cannot be placed on the square a crop or
    pad fit makes (a kind of one's own without ``place``), before anything is written.

    Raises:
        ValueError: naming the field and the fit that works.
    """
    for name, kind in (fields or {}).items():
        if kind.moves and fit != "stretch" and type(kind).place is FieldKind.place:
            raise ValueError(f"field {name!r} ({kind.kind}) moves with the pixels but its kind "
                             f"has no place() for --fit {fit}: give it one, or convert with "
                             f"fit='stretch' (--fit stretch)")


def _validated(*, engine, address, container, sizes, encoding, quality, fit, workers,
             shard_size, on_error, overwrite, resume) -> tuple:
    """``convert()``'s arguments checked: ``(sizes, quality, workers, shard_size)`` as used;
    raises ValueError naming a bad one and the valid choices."""
    choice("engine", engine, ENGINES)
    if address is not None and engine != "ray":
        raise ValueError(f"address={address!r} is for engine='ray', not {engine!r}")
    choice("container", container, CONTAINERS)
    choice("encoding", encoding, ENCODINGS)
    choice("fit", fit, FITS)
    choice("on_error", on_error, ("skip", "raise"))
    if isinstance(sizes, (int, str)):
        sizes = [sizes]
    sizes = tuple(sorted({check_size(s) for s in sizes}))
    if not sizes:
        raise ValueError("give at least one size (a power of two >= 8)")
    quality = integer("quality", quality, 1, 100)
    workers = integer("num_workers", workers, 1, optional=True) or usable_cpus()
    shard_size = (integer("shard_size", shard_size, 1, optional=True)
                  or default_shard_size(sizes, encoding))
    if overwrite and resume:
        raise ValueError("overwrite and resume exclude each other")
    return sizes, quality, workers, shard_size


def convert(src: str, out: str, *, container: str = "hdf5", sizes: Sequence[int] = (256,),
            encoding: str = "raw",
            quality: int = 90, fit: str = "crop", num_workers: int | None = None,
            shard_size: int | None = None, on_error: str = "skip", overwrite: bool = False,
            resume: bool = False, progress: bool = True, labels: str | None = None,
            engine: str = "local", address: str | None = None, shuffle: bool = False,
            coco: str | None = None, masks: str | None = None,
            cache_dir: str | os.PathLike | None = None,
            fields: dict[str, str] | None = None, source: str | None = None,
            split: str | None = None, image_column: str | None = None) -> dict:
    """Pack the images of ``src`` into a shard set at ``out``.

    Args:
        src: where the images are (``fastdata.converters.sources``): an ImageFolder-style
            folder (a subfolder per class), any folder with ``labels``, ``coco`` or
            ``masks``; WebDataset tars, parquet files or a Hugging Face dataset (a file, a
            folder of them, a pattern such as ``shard-{000000..000127}.tar``; tars and
            parquet files also as ``s3://``, ``gs://``, ``az://`` or ``https://`` URLs).
        out: the shard set's folder (made if missing; refused if it holds other files).
        container: ``"hdf5"`` or ``"lmdb"``.
        sizes: the stored square sizes, powers of two >= 8.
        encoding: ``"raw"`` uint8 pixels or ``"jpeg"`` records (at ``quality``, 1-100).
        fit: how a non-square image becomes a square: ``"crop"``, ``"pad"`` or ``"stretch"``.
        num_workers: decode processes of the local engine (default: the usable cores).
        shard_size: source files per shard (default: ~256 MiB of raw pixels a shard). A shard
            holds the readable ones of one such range of the file list (sorted, or in the
            order ``shuffle`` draws).
        on_error: ``"skip"`` an unreadable input (reported in the manifest) or ``"raise"``.
        overwrite: replace a set at ``out`` (only files fastdata wrote there).
        resume: finish an interrupted conversion, keeping every shard that verifies.
        progress: show progress bars.
        labels: a labels file (CSV, JSON Lines or parquet: ``fastdata.converters.labels``)
            instead of class folder names: a row per image, its path (``path`` or
            ``file_name``), its label and any other columns, each a field of the set.
        fields: the kind of a labels file's or a source's column by name (``{"caption":
            "text"}``; the command line's ``--field caption=text``; a tar member's by its
            extension), where it is not to be inferred; kinds from ``fastdata.fields.FIELDS``.
        source: what ``src`` is, by name in ``fastdata.converters.sources.SOURCES``
            (``"folder"``, ``"labels"``, ``"coco"``, ``"masks"``, ``"webdataset"``,
            ``"parquet"``, ``"hf"``); default: what its options and its look say.
        split: the split of a Hugging Face ``DatasetDict`` (default ``"train"``) or of a
            folder of parquet files that holds several.
        image_column: the image's column of a parquet source or Hugging Face dataset, where
            it is not found by its type or name.
        engine: ``"local"`` (``num_workers`` decode processes) or ``"ray"`` (a task per shard on a
            Ray cluster: ``fastdata.converters.ray_engine``); the same shards either way.
        address: the Ray cluster's address (default: ``RAY_ADDRESS``, or a local cluster that
            ``ray.init`` starts).
        shuffle: write the files in an order drawn from a fixed seed instead of the folder's
            (class after class), so that every shard mixes the classes: what a loader's
            ``shuffle_window`` needs. The same order every time (``resume`` included).
        coco: a COCO annotations file (``fastdata.converters.coco``): a detection set of the
            images it lists under ``src``, with their boxes (and instance masks where it has
            segmentations).
        masks: a folder of PNG class maps parallel to the images
            (``fastdata.converters.masks``): a segmentation set of the images that have one.
        cache_dir: the node cache whose ``uploads/`` stages the shards of a conversion into a
            store (default: ``$FASTDATA_CACHE``, else ``~/.cache/fastdata``).

    Returns:
        The manifest written to ``out/manifest.json``.

    Raises:
        ValueError: a bad argument, a source that is not of its kind, or ``out`` holds
            another conversion or foreign files.
        ConversionError: no image could be read, or one could not with ``on_error="raise"``.
        FolderBusyError: another conversion holds ``out``.
        KeyboardInterrupt: Ctrl-C, after keeping the complete shards for ``resume``.
    """
    sizes, quality, workers, shard_size = _validated(
        engine=engine, address=address, container=container, sizes=sizes, encoding=encoding,
        quality=quality, fit=fit, workers=num_workers, shard_size=shard_size, on_error=on_error,
        overwrite=overwrite, resume=resume)
    bucket, folder = None, output_folder(out)
    if folder is None:
        from fastdata.converters.bucket import Bucket, staging_folder

        bucket, folder = Bucket(out), staging_folder(out, cache_dir)
    out = os.path.abspath(folder)
    warn_if_not_simd()

    fields = _field_kinds(fields)
    reader = source_for(src if is_url(src) else os.path.abspath(src), source, labels=labels,
                        coco=coco, masks=masks, fields=fields, split=split,
                        image_column=image_column, workers=workers)
    scan = _shuffled(reader.scan(progress=progress), flag("shuffle", shuffle)).labels_as_field()
    _check_placed(scan.fields, fit)
    labels, coco, masks = (None if v is None else os.path.abspath(v) for v in (labels, coco,
                                                                             masks))
    _check_memory(shard_size, len(scan.files), sizes, encoding, workers)
    job = _Job(src=scan.root, out=out, scan=scan, container=container, shard_size=shard_size,
               opts=DecodeOptions(sizes=sizes, fit=fit, encoding=encoding, quality=quality),
               labels=labels, coco=coco, masks=masks, shuffle=shuffle, bucket=bucket,
               fields=fields, source=reader.kind, split=split, image_column=image_column,
               progress=progress)
    if os.path.lexists(out) and not os.path.isdir(out):
        raise NotADirectoryError(f"output {out!r} is a file; give a directory")
    created = not os.path.lexists(out)
    os.makedirs(out, exist_ok=True)
    lock = FolderLock(out, "fastdata convert")
    try:
        lock.acquire()
        if bucket is not None:      # another node's conversion into the same URL
            bucket.lock()
        done, kept = _start(job, overwrite=overwrite, resume=resume)
        if done is not None:
            return done
        if kept:
            log.info("resuming: reusing %d complete shards (%d samples)", len(kept),
                     kept[-1].start + kept[-1].count)
        shards, skipped = _make_shards(job, kept, engine=engine, address=address,
                                       workers=workers, on_error=on_error, progress=progress)
        return _write_manifest(job, shards, skipped)
    except BaseException:
        lock.release()
        if created:         # leave no empty folder behind that this run made
            with contextlib.suppress(OSError):
                os.rmdir(out)
        raise
    finally:
        lock.release()
        if bucket is not None:      # the staging folder, emptied as the shards went up
            with contextlib.suppress(OSError):
                os.rmdir(out)
            _unlock(bucket)


def _shuffled(scan: Scan, shuffle: bool) -> Scan:
    """``scan``, or its samples in a seeded order where ``shuffle`` (refused for a source
    read in order only)."""
    if not shuffle:
        return scan
    if scan.images is not None and not scan.images.random_access:
        raise ValueError(f"--shuffle writes the samples in a drawn order, and {scan.root} is "
                         f"read in its own order (a parquet file a row group at a time, a "
                         f"compressed tar or one in a store from its start): convert it in "
                         f"order and read it with Loader(shuffle=True)")
    return scan.shuffled()


def _unlock(bucket) -> None:
    """Let the bucket's URL go; where the store cannot be reached, say what that leaves."""
    try:
        bucket.unlock()
    except OSError as e:
        log.warning("%s: its lock could not be removed (%s); another node's conversion into it "
                    "waits until the lock is stale", bucket.shown, e)


def _start(job: _Job, *, overwrite: bool, resume: bool) -> tuple[dict | None, list[ShardMeta]]:
    """The output checked for this run: the manifest of a finished set of this very job (or
    None), and the complete shards a resumed run keeps."""
    if job.bucket is None:
        prepare_out(job.out, job.src, overwrite=overwrite, resume=resume)
        done = _finished(job) if resume else None
        return done, (reusable_shards(job.out, job.container, job.opts.sizes, job.opts.encoding,
                                      job.fp, job.scan.fields) if resume and done is None
                      else [])
    job.bucket.prepare(overwrite=overwrite, resume=resume)
    drop_unfinished(job.out, job.container, 0)      # what a killed run left in the staging
    done = job.bucket.finished(job.fp, lambda m: what_differs(
        m, job.container, job.opts, job.scan)) if resume else None
    return done, (job.bucket.kept(job.fp, job.options(), job.container)
                  if done is None else [])


@dataclass
class _Job:
    """What one conversion writes: its inputs, options and their fingerprint."""
    src: str
    out: str
    scan: Scan
    container: str
    shard_size: int
    opts: DecodeOptions
    labels: str | None = None       # the labels file, if labels do not come from folders
    coco: str | None = None         # the COCO annotations file of a detection set
    masks: str | None = None        # the class maps' folder of a segmentation set
    progress: bool = False
    shuffle: bool = False           # the files in a seeded order, not the folder's
    fields: dict | None = None      # the kinds given for a labels file's columns
    source: str = "folder"          # the source's kind (converters.sources)
    split: str | None = None        # a dataset's split
    image_column: str | None = None     # the image's column of a table source
    bucket: Any = None              # a store's folder the shards go up to (converters.bucket)
    fp: str = ""

    def __post_init__(self):
        self.fp = fingerprint(self.scan, self.opts, self.container, self.shard_size)

    def options(self) -> dict:
        """The options that made this job, as ``convert()`` takes them (kept in each shard and
        in the manifest, for ``convert --resume`` without them)."""
        o = self.opts
        return {"container": self.container, "sizes": list(o.sizes), "encoding": o.encoding,
                "quality": o.quality if o.encoding == "jpeg" else None, "fit": o.fit,
                "shard_size": self.shard_size, "labels": self.labels, "coco": self.coco,
                "masks": self.masks, "shuffle": self.shuffle,
                **{k: v for k, v in (("fields", self.fields), ("split", self.split),
                                     ("image_column", self.image_column)) if v},
                **({"source": self.source} if self.source in _DETECTED_KINDS else {})}


def _finished(job: _Job) -> dict | None:
    """The manifest of ``job`` if ``out`` holds it complete already; else None, with a
    manifest of an incomplete set removed (a manifest means complete)."""
    done = finished_manifest(job.out)
    if done is None:
        return None
    if done.get("config") != job.fp:
        raise ValueError(f"{job.out} holds a finished conversion with other options or inputs "
                         f"({what_differs(done, job.container, job.opts, job.scan)}); use "
                         f"--overwrite to replace it")
    gone = changed_shards(job.out, done)
    if not gone:
        log.info("%s is already complete", job.out)
        return done
    log.warning("%s: %s; redoing from there (the shards before it are reused if they "
                "verify)", job.out, gone)
    remove_own(job.out, [MANIFEST])
    return None


def _make_shards(job: _Job, kept: list[ShardMeta], *, engine: str, address: str | None,
                 workers: int, on_error: str, progress: bool) -> tuple[list[dict], list[dict]]:
    """The shards after the ``kept`` ones, by ``engine``; the manifest's ``shards`` and
    ``skipped`` entries."""
    if engine == "local":
        return _write_shards(job, kept, workers=workers, on_error=on_error, progress=progress)
    from fastdata.converters import ray_engine

    try:
        return ray_engine.write_shards(job, kept, address=address, on_error=on_error,
                                       progress=progress)
    finally:        # shards of tasks whose worker died, or never placed
        remove_own(job.out, leftover_temps(job.out))


def _write_shards(job: _Job, kept: list[ShardMeta], *, workers: int, on_error: str,
                  progress: bool) -> tuple[list[dict], list[dict]]:
    """Decode the files after the ``kept`` shards and write them into shards; returns the
    manifest's ``shards`` and ``skipped`` entries."""
    files, out, container = job.scan.files, job.out, job.container
    shards = kept_entries(job, kept)
    skipped = [s for m in kept for s in m.skipped]
    first = kept[-1].sources[1] if kept else 0
    n_done = kept[-1].start + kept[-1].count if kept else 0
    shard: Any = None
    shard_skipped: list = []
    shard_first = first

    def flush(end: int) -> None:
        nonlocal shard, shard_skipped, shard_first, n_done
        meta = ShardMeta(index=len(shards), start=n_done, count=len(shard),
                         sha256=shard.checksum(), config=job.fp, sources=(shard_first, end),
                         skipped=shard_skipped)
        nbytes = shard.finish(meta, job.options())
        shards.append(uploaded(job, {"file": os.path.basename(shard.path), "start": meta.start,
                                     "count": meta.count, "sha256": meta.sha256,
                                     "bytes": nbytes}, meta))
        skipped.extend(shard_skipped)
        n_done += len(shard)
        shard, shard_skipped, shard_first = None, [], end

    latch = SigintLatch()
    decoder = Decoder(workers, job.opts)
    inflight: dict[int, tuple] = {}     # (path, label, field values) of the positions sent

    def jobs():
        values = job.scan.values.iter_from(first) if job.scan.values is not None else \
            itertools.repeat(())
        for pos, ((path, label), v, item) in enumerate(zip(files.iter_from(first), values,
                                                           _items(job, first)), first):
            inflight[pos] = path, label, v
            yield pos, item

    bar = tqdm(total=len(files), initial=first, unit="img", desc="convert",
               disable=not progress, dynamic_ncols=True)
    try:
        for results in decoder.run(jobs()):
            latch.check()
            bar.update(len(results))
            for pos, payloads, crcs, error, shape in results:
                end = range_end(pos, job.shard_size, len(files))
                path, label, values = inflight.pop(pos)
                if error is not None:
                    if on_error == "raise":
                        raise ConversionError(f"cannot read {path!r}: {error}")
                    shard_skipped.append({"path": path, "reason": error, "kind": "unreadable"})
                else:
                    if shard is None:
                        shard = WRITERS[container](
                            os.path.join(out, shard_file(container, len(shards))),
                            sizes=job.opts.sizes, encoding=job.opts.encoding, capacity=end - pos,
                            fields=job.scan.fields)
                    stored = placed(job.scan.fields, values, shape, job.opts)
                    shard_skipped += cut_away(path, job.scan.fields, values, stored,
                                              job.opts.fit)
                    shard.add(label, payloads, crcs, stored)
                # a range of the source ends (the last one after the workers are told to stop)
                if shard is not None and pos + 1 == end < len(files):
                    flush(end)
            if shard is not None:   # before the next batch: its pixels reuse the ring's slots
                shard.write_pending()
        decoder.stop()      # they exit while the last shard is written; joined below
        if shard is not None:
            flush(len(files))
        latch.check()
    except KeyboardInterrupt:
        log.error("interrupted: %d complete shards kept in %s; finish with --resume",
                  len(shards), out)
        raise
    finally:
        if shard is not None:
            shard.abort()
        latch.restore()
        decoder.close()
        bar.close()
    skipped.extend(shard_skipped)
    return shards, skipped


def _items(job: _Job, first: int):
    """What the decode workers are handed for the samples from ``first`` on: their files'
    paths, or what the source's images are (``converters.sources.base.Images``)."""
    if job.scan.images is not None:
        return job.scan.images.items(first, len(job.scan.files))
    return (os.path.join(job.src, path) for path, _ in job.scan.files.iter_from(first))


def _manifest(job: _Job, shards: list[dict], skipped: list[dict]) -> dict:
    """The finished set's manifest."""
    scan, opts = job.scan, job.opts
    # a class whose images were all unreadable is as empty as an empty folder
    dropped = {s["path"] for s in skipped}
    # an input not converted has one entry, why: no note on its labels as if it were kept
    notes = [s for s in scan.skipped if s.get("kind") != "note" or s["path"] not in dropped]
    have = {label for path, label in scan.files if path not in dropped}
    empty = [c for i, c in enumerate(scan.classes) if i not in have] \
        if scan.label_kind == "class" else []
    manifest = {
        "format": FORMAT_NAME, "version": FORMAT_VERSION, "container": job.container,
        "encoding": opts.encoding,
        "quality": int(opts.quality) if opts.encoding == "jpeg" else None,
        "sizes": list(opts.sizes), "fit": opts.fit, "classes": scan.classes,
        "label_kind": scan.label_kind,
        "num_samples": shards[-1]["start"] + shards[-1]["count"], "shards": shards,
        "skipped": notes + skipped, "ignored": scan.ignored, "empty_classes": empty,
        "source": job.src, "config": job.fp, "shard_size": job.shard_size,
        "labels_file": job.labels, "shuffle": job.shuffle,
        **({"source_kind": job.source, "split": job.split, "image_column": job.image_column}
           if job.source in _DETECTED_KINDS else {}),
    }
    if scan.label_kind == "class":      # what `info` shows without reading the shards
        counts = [0] * len(scan.classes)
        for path, label in scan.files:
            if path not in dropped:
                counts[label] += 1
        if sum(counts) == manifest["num_samples"]:
            manifest["class_counts"] = counts
    manifest.update(_fields_entries(job))
    if job.coco is not None:            # the boxes are the field "label"
        manifest["coco_file"] = job.coco
    elif scan.masks is not None:        # the class maps are the field "label"
        manifest["masks_dir"] = job.masks
    return manifest


def _fields_entries(job: _Job) -> dict:
    """The manifest's entries of a set with fields (its version, fields and the kinds given
    for them), else none."""
    if not job.scan.fields:
        return {}
    out = {"version": FIELDS_VERSION, "fields": entries(job.scan.fields)}
    return {**out, "field_kinds": job.fields} if job.fields else out


def _log_summary(job: _Job, manifest: dict, out: str) -> None:
    """What was converted and what was not: the skipped inputs by kind (the first 20 named),
    a warning where most inputs were not converted, the classes left without an image."""
    n_done, skipped, empty = manifest["num_samples"], manifest["skipped"], \
        manifest["empty_classes"]
    shards = len(manifest["shards"])
    dropped = [s for s in skipped if s.get("kind", "unreadable") != "note"]
    log.info("converted %d image%s into %d %s shard%s in %s (%s; %d other files ignored)",
             n_done, "" if n_done == 1 else "s", shards, job.container,
             "" if shards == 1 else "s", out, skip_summary(skipped) or "none skipped",
             sum(job.scan.ignored.values()))
    for s in skipped[:20]:
        log.warning("%s %s: %s", "note on" if s.get("kind") == "note" else "skipped",
                    printable(s["path"]), printable(s["reason"]))
    if len(skipped) > 20:
        log.warning("... and %d more (every one: the manifest's \"skipped\", or `fastdata "
                    "info %s --json`)", len(skipped) - 20, out)
    if len(dropped) > n_done:       # exit 0 stays: the set is sound, but is it the one meant?
        log.warning("only %d of the %d inputs were converted (%s): check the source and its "
                    "labels", n_done, n_done + len(dropped), skip_summary(dropped))
    # a model built from len(classes) gets an output per class; a dataset's own class names
    # (a ClassLabel's) are its to keep
    if empty and job.source in ("folder", "labels"):
        where = (f"remove {'its' if len(empty) == 1 else 'their'} rows from {job.labels}"
                 if job.labels else f"remove {'it' if len(empty) == 1 else 'them'} from "
                 f"{job.src}")
        log.warning("%d class%s without a readable image, kept so that labels match the %s: "
                    "%s (%s and convert again to drop %s)", len(empty),
                    "" if len(empty) == 1 else "es",
                    "labels file's classes" if job.labels else "folder names",
                    ", ".join(map(printable, empty[:10])) + (", ..." if len(empty) > 10 else ""),
                    where, "it" if len(empty) == 1 else "them")


def _write_manifest(job: _Job, shards: list[dict], skipped: list[dict]) -> dict:
    """Write the finished set's manifest, last; log what was converted and what was not."""
    scan, out = job.scan, job.out
    if not shards:
        examples = "; ".join(f"{s['path']}: {s['reason']}" for s in skipped[:3])
        raise ConversionError(f"none of the {len(scan.files)} images in {job.src!r} could "
                              f"be read ({len(skipped)} skipped, e.g. {examples})")
    manifest = _manifest(job, shards, skipped)
    write_json_atomic(os.path.join(out, MANIFEST), manifest)
    if job.bucket is not None:
        job.bucket.finish(out)
        remove_own(out, [MANIFEST])
        out = job.bucket.shown
    _log_summary(job, manifest, out)
    return manifest
