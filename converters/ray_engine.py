"""Conversion on a Ray cluster (``fastdata convert SRC OUT --engine ray``).

The driver scans the source once and cuts it into the ranges the local converter cuts
(``units.range_end``); each range goes to a Ray task (a window of them in flight), which
reads its images itself (files by path; a source's pieces by byte range or row group: the
part of a tar, a parquet file or an Arrow file the range covers, ``converters.sources``),
decodes, resizes and writes its shard straight into OUT (on a cluster, shared storage every
node mounts at the same path) and returns its checksum, count and skipped inputs. Which shard
number a range gets and where its samples start depend on the ranges before it, so the driver
takes the results in range order, writes that into each shard and renames it into place; then
the manifest, last.
The shards hold what the local converter's hold (the same ``manifest["shards"]`` checksums), so
``--resume`` works across engines: the complete shards are kept, the ranges after them redone.

Into a store (OUT a URL): each task writes its shard into the staging folder on its node, and
a second task on that node writes its place in, uploads it and removes it
(``converters.bucket``).

A task that fails is retried by Ray where its worker died (``max_retries``); one that raised
(``on_error="raise"``) fails the conversion with the task's error. Every node needs fastdata
installed (``pip install 'fastdata-shards[ray]'``) and the source and OUT at the same paths.
"""
from __future__ import annotations

import logging
import os
import socket

from fastdata._optional import require
from fastdata.converters.decode import prepare_batch
from fastdata.converters.geometry import cut_away, placed
from fastdata.converters.resume import kept_entries
from fastdata.converters.units import ConversionError, range_end
from fastdata.converters.writers import WRITERS
from fastdata.format import ShardMeta, shard_file

log = logging.getLogger("fastdata")

#: retries of a task whose worker process died (Ray's default for tasks is 3)
RETRIES = 3


def ranges(first: int, files: int, shard_size: int) -> list[tuple[int, int]]:
    """The ranges ``[a, b)`` of source positions from ``first`` on, cut where the local
    converter cuts its shards."""

    out, a = [], first
    while a < files:
        b = range_end(a, shard_size, files)
        out.append((a, b))
        a = b
    return out


def convert_range(images, out: str, container: str, opts, options: dict, fp: str,
                  files: list[tuple[str, int]], first: int, on_error: str,
                  fields: dict | None = None, values: list[tuple] | None = None) -> dict:
    """A Ray task: the samples at positions ``first, first + 1, ...`` (``files``: their keys
    and labels; ``values``: their ``fields``' values; ``images``: their files' paths, or the
    source's ``Images`` of them, read here) into one shard, left complete under a temporary
    name; returns ``{"tmp", "count", "sha256", "skipped"}`` (``tmp`` None where none was
    readable)."""

    writer, skipped = None, []
    end = first + len(files)
    items = images if isinstance(images, list) else images.items(0, len(files))
    os.makedirs(out, exist_ok=True)     # a staging folder, on a node that had none yet
    try:
        for pos, ((path, label), v, item) in enumerate(
                zip(files, values or [()] * len(files), items), first):
            (_, payloads, crcs, error, shape), = prepare_batch([(pos, item)], opts)
            if error is not None:
                if on_error == "raise":
                    raise ConversionError(f"cannot read {path!r}: {error}")
                skipped.append({"path": path, "reason": error, "kind": "unreadable"})
                continue
            if writer is None:      # its final name is the driver's to give
                writer = WRITERS[container](os.path.join(out, shard_file(container, 0)),
                                            sizes=opts.sizes, encoding=opts.encoding,
                                            capacity=end - pos, fields=fields)
            stored = placed(fields or {}, v, shape, opts)
            skipped += cut_away(path, fields or {}, v, stored, opts.fit)
            writer.add(label, payloads, crcs, stored)
            writer.write_pending()
        if writer is None:
            return {"tmp": None, "count": 0, "sha256": None, "skipped": skipped}
        draft = ShardMeta(index=0, start=0, count=len(writer), sha256=writer.checksum(),
                          config=fp, sources=(first, end), skipped=skipped)
        writer.finish(draft, options, place=False)
        return {"tmp": writer.tmp, "count": len(writer), "sha256": draft.sha256,
                "skipped": skipped, "node": _node()}
    except BaseException:
        if writer is not None:
            writer.abort()
        raise


def _node() -> str | None:
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def place_and_upload(container: str, tmp: str, path: str, meta: ShardMeta,
                     remote) -> tuple[int, str]:
    """A Ray task on the node that wrote the shard ``tmp``: ``meta`` written into it, renamed to
    ``path``, uploaded and removed there; returns its size and whole-file SHA-256."""
    from fastdata.converters.bucket import upload_shard

    WRITERS[container].place(tmp, path, meta)
    return upload_shard(remote, path)


class _Placer:
    """Takes the tasks' results in range order: gives each shard its number, first sample and
    the skips of empty ranges before it, and renames it into place (for a store: on the node
    that wrote it, which uploads it)."""

    def __init__(self, job, kept: list[ShardMeta], ray=None):
        self.job, self.ray, self.skipped = job, ray, [s for m in kept for s in m.skipped]
        self.shards = kept_entries(job, kept)
        self.n_done = kept[-1].start + kept[-1].count if kept else 0
        # empty ranges' skips, for the next shard
        self.carry_first: int | None = None
        self.carry: list = []

    def take(self, first: int, end: int, result: dict) -> None:
        if result["tmp"] is None:
            self.carry_first = first if self.carry_first is None else self.carry_first
            self.carry.extend(result["skipped"])
            return
        job, index = self.job, len(self.shards)
        start = first if self.carry_first is None else self.carry_first
        meta = ShardMeta(index=index, start=self.n_done, count=result["count"],
                         sha256=result["sha256"], config=job.fp, sources=(start, end),
                         skipped=self.carry + result["skipped"])
        name = shard_file(job.container, index)
        entry = {"file": name, "start": meta.start, "count": meta.count, "sha256": meta.sha256}
        path = os.path.join(job.out, name)
        if job.bucket is None:
            entry["bytes"] = WRITERS[job.container].place(result["tmp"], path, meta)
        else:
            self._upload(result, path, meta, entry)
        self.shards.append(entry)
        self.skipped.extend(meta.skipped)
        self.n_done += meta.count
        self.carry_first, self.carry = None, []

    def _upload(self, result: dict, path: str, meta: ShardMeta, entry: dict) -> None:
        ray, job = self.ray, self.job
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        task = ray.remote(max_retries=0)(place_and_upload).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(result["node"], soft=False))
        entry["bytes"], entry["file_sha256"] = ray.get(task.remote(
            job.container, result["tmp"], path, meta, job.bucket.remote))
        job.bucket.record(entry, meta)

    def finish(self) -> tuple[list[dict], list[dict]]:
        return self.shards, self.skipped + self.carry


#: how long a cluster's address may take to answer before the conversion gives up
CONNECT_TIMEOUT_S = 15.0


def check_reachable(address: str | None, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Where ``address`` names a cluster as ``HOST:PORT``, that something answers there: Ray
    itself retries a silent address for many minutes.

    Raises:
        ConversionError: nothing answers, in one line naming the address.
    """
    if not address or address in ("auto", "local") or "://" in address or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return
    except ValueError:
        raise ConversionError(f"--address {address!r} is not HOST:PORT") from None
    except OSError as e:
        why = "timed out" if isinstance(e, TimeoutError) else e.strerror or str(e)
        raise ConversionError(f"no Ray cluster answers at {address} ({why} after up to "
                              f"{timeout:.0f} s): start one there (`ray start --head`), or "
                              f"leave out --address to start a local one") from None


def cluster_address(address: str | None) -> str:
    """What ``ray.init`` is given: ``address`` (else ``RAY_ADDRESS``) checked to answer;
    where neither names a cluster, ``"local"``: a cluster of the conversion's own, never one
    that a file left by a cluster killed without ``ray stop`` names (Ray would wait for it
    without end).

    Raises:
        ConversionError: the cluster named, or the one ``"auto"`` finds, does not answer.
    """
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is None:
        return "local"
    if address == "auto":
        path = os.path.join(_ray_temp_dir(), "ray_current_cluster")
        try:
            with open(path) as f:
                named = f.read(200).strip()
        except OSError:
            return address          # Ray looks for a running cluster itself
        try:
            check_reachable(named)
        except ConversionError as e:
            raise ConversionError(f"{path} (the latest cluster's address, for --address auto) "
                                  f"names {named}: {str(e).split(': ', 1)[-1]}") from None
        return address
    check_reachable(address)
    return address


def _ray_temp_dir() -> str:
    """Ray's temporary folder, as Ray finds it (``$RAY_TMPDIR``, else ``$TMPDIR``,
    else ``/tmp``; then ``ray``)."""
    return os.path.join(os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp",
                        "ray")


def write_shards(job, kept: list[ShardMeta], *, address: str | None, on_error: str,
                 progress: bool) -> tuple[list[dict], list[dict]]:
    """``convert``'s shards on a Ray cluster (``address``: an existing cluster's, or None to
    join or start one as ``ray.init`` does); returns the manifest's ``shards`` and ``skipped``
    entries, as the local engine does."""
    from tqdm import tqdm

    ray = require("ray", "--engine ray")
    if not ray.is_initialized():
        ray.init(address=cluster_address(address), logging_level=logging.WARNING,
                 log_to_driver=False)
    task = ray.remote(max_retries=RETRIES)(convert_range)
    files, fp, options = job.scan.files, job.fp, job.options()
    first = kept[-1].sources[1] if kept else 0
    todo = ranges(first, len(files), job.shard_size)
    # tasks in flight: enough to keep every CPU busy, few enough that the driver holds the
    # file lists of a window, not of the whole source
    window = max(4, 2 * int(ray.cluster_resources().get("CPU", 1)))
    refs: dict = {}

    def submit(k: int) -> None:
        if k < len(todo):
            a, b = todo[k]
            values = job.scan.values.rows(a, b) if job.scan.values is not None else None
            part = files[a:b]
            images = (job.scan.images.part(a, b) if job.scan.images is not None else
                      [os.path.join(job.src, path) for path, _ in part])
            refs[k] = task.remote(images, job.out, job.container, job.opts, options, fp,
                                  part, a, on_error, job.scan.fields, values)

    for k in range(window):
        submit(k)
    placer = _Placer(job, kept, ray)
    bar = tqdm(total=len(files), initial=first, unit="img", desc="convert (ray)",
               disable=not progress, dynamic_ncols=True)
    try:
        # in range order (the tasks run meanwhile): each shard's number and start are then
        # known, and an error is the first in the source's order, as the local engine's
        for k, (a, b) in enumerate(todo):
            result = ray.get(refs.pop(k))
            submit(k + window)
            bar.update(b - a)
            placer.take(a, b, result)
    except BaseException as e:
        for ref in refs.values():
            ray.cancel(ref, force=True)
        cause = getattr(e, "cause", None)       # a task's own error, as the local engine's
        if isinstance(cause, ConversionError):
            raise ConversionError(str(cause)) from None
        log.error("stopped: %d complete shards kept in %s; finish with --resume",
                  len(placer.shards), job.out)
        raise
    finally:
        bar.close()
    return placer.finish()
