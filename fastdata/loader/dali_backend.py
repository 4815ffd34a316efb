"""The DALI backend: the same batches as the torch backend, decoded and augmented by DALI.

``fn.external_source`` (batch mode) is fed by ``_Source``, which reads this rank's batches from
``Order`` (the shared order module) through ``ShardSet`` in reader threads, ahead of DALI. Raw
shards go in as uint8 HWC batches; JPEG shards as encoded bytes for ``fn.decoders.image``
(``device="mixed"``, nvJPEG, on CUDA; CPU decoding on CPU). DALI's own shuffling, sharding and
last-batch policies are not used: an epoch ends when our batches do (``StopIteration``), so
every rank gets exactly what ``Order`` gives it, partial eval batches included.

Augmentation: ``fn.random_resized_crop`` (torchvision's scale/ratio) + a coin-flip mirror in
``fn.crop_mirror_normalize``; eval: the centre box the torch backend uses, resized with
``fn.resize`` (antialiased linear), then normalised. bfloat16 is produced from float32 by torch,
as DALI has no bfloat16. ``channels_last`` output comes from an HWC layout viewed as NCHW.
A CPU ``device`` runs DALI's CPU-only mode (``device_id=None``).
"""
from __future__ import annotations

import collections
import concurrent.futures as cf
import functools
import itertools
import os
import queue
import warnings
import weakref

import numpy as np
import torch

from fastdata._optional import require
from fastdata.format import SPATIAL_KINDS
from fastdata.loader.buffers import BufferPool
from fastdata.loader.spec import Backend, ordered, past_deadline
from fastdata.ops.boxes import center_boxes
from fastdata.ops.sample import apply_sample_transform
from fastdata.ops.targets import batch_targets, map_tensors
from fastdata.shards.mapped import page_aligned

# A fork child inherits this process's DALI pipelines but not their threads: destroying one
# there (its garbage collector will try, as soon as the first allocation after the fork, even
# inside threading's own after-fork hook) kills the child with SIGSEGV. So the live pipelines
# are held strongly across every fork: the parent lets go right after, a child never does.
_PIPELINES: weakref.WeakSet = weakref.WeakSet()
_HELD: list = []


def _hold() -> None:
    _HELD[:] = list(_PIPELINES)


os.register_at_fork(before=_hold, after_in_parent=_HELD.clear)


class _Source:
    """Batch-mode source: ``(images, labels)`` per call, raises StopIteration at epoch end.

    Raw batches are read into page-aligned arrays that are used again: DALI copies what a
    call returns before it calls again (``external_source``'s ``no_copy=False``), so the
    previous call's array is free then. A fresh array per batch is mapped anew by malloc from
    32 MiB up (a batch of 171 at 256 px), and its pages fault in at every batch."""

    def __init__(self, ds, size: int, encoded: bool, pool: cf.Executor, depth: int,
                 sample_transform=None, crops=None):
        self.ds, self.size, self.encoded, self.pool, self.depth = ds, size, encoded, pool, depth
        self.sample_transform = sample_transform
        #: a detection or segmentation set's: ``(indices, seed) -> (targets, crops, flips)``,
        #: the crops drawn as the torch backend draws them, given to DALI's resize; the
        #: targets wait in ``pending`` (DALI returns batches in the order it asks for them)
        self.crops = crops
        self.pending: collections.deque = collections.deque()
        self.batches = iter(())
        self._spare: queue.SimpleQueue = queue.SimpleQueue()     # raw arrays DALI has copied
        self._given = None                  # the array the last call returned

    def start(self, batches, seeds, timeout: float | None = None, late=None) -> None:
        """``seeds``: each batch's (``Order.batch_seed``), for the sample transform;
        ``timeout``, ``late``: a batch's deadline and its error (``ordered``)."""
        self._recycle(None)
        self.pending.clear()
        self.batches = ordered(self.pool, self._read, zip(batches, seeds), self.depth,
                               timeout, late)

    def _recycle(self, given) -> None:
        if self._given is not None:
            self._spare.put(self._given)
        self._given = given

    def _read(self, idx: np.ndarray, seed: int):
        images, labels, buf = self._pixels(idx, seed)
        return images, labels, buf, None if self.crops is None else self.crops(idx, seed)

    def _pixels(self, idx: np.ndarray, seed: int):
        labels = self.ds.labels_of(idx)
        if self.encoded:
            return [np.frombuffer(b, np.uint8) for b in self.ds.read_encoded(idx, self.size)], \
                labels, None
        try:
            buf = self._spare.get_nowait()
        except queue.Empty:
            buf = None
        if buf is None or len(buf) < len(idx):      # none spare, or a partial batch's
            buf = page_aligned((len(idx), self.size, self.size, 3))
        images = self.ds.read_batch(idx, size=self.size, out=buf[:len(idx)])
        if self.sample_transform is not None:
            apply_sample_transform(self.sample_transform, images, seed,
                                   self.ds.sample_names(idx))
        return images, labels, buf

    def __call__(self):
        images, labels, buf, crops = next(self.batches)   # StopIteration at the epoch's end
        self._recycle(buf)
        if crops is None:
            return images, labels
        targets, boxes, flips = crops
        self.pending.append(targets)
        top, left, h, w = boxes.to(torch.float32).unbind(1)
        return (images, labels, torch.stack([top, left], 1).numpy(),
                torch.stack([top + h, left + w], 1).numpy(),
                np.asarray(flips, np.int32))


def _crops(spec, size: int, indices, seed: int) -> tuple:
    """A detection or segmentation batch's ``(targets, crops, flips)``: the crops drawn from
    the batch's seed as the torch backend draws them (the same targets from both backends)."""
    t = spec.crop_stage
    params = t.params(len(indices), size, size, torch.Generator().manual_seed(seed))
    return (batch_targets(spec.dataset.annotations, indices, params, size, spec.crop,
                          spec.targets), *params)


class DaliBackend(Backend):
    name = "dali"

    def __init__(self, spec):
        super().__init__(spec)
        need = "backend='dali'"
        self.dali = require("nvidia.dali", need)
        self.fn, self.types = require("nvidia.dali.fn", need), require("nvidia.dali.types", need)
        self.plugin = require("nvidia.dali.plugin.pytorch", need)
        self.gpu = spec.device.type == "cuda"
        self.threads = max(1, spec.num_workers)
        if spec.workers != "thread" or spec.mp_context is not None:
            warnings.warn(f"backend='dali' runs DALI's own threads: workers={spec.workers!r}, "
                          f"mp_context={spec.mp_context!r} apply to the torch backend only and "
                          f"are ignored here", stacklevel=3)
        self._reads: cf.ThreadPoolExecutor | None = None
        self._pipes: dict[tuple, tuple] = {}
        self._host_pools: dict[tuple, BufferPool] = {}
        self._copies = None         # the side stream DALI's GPU outputs are copied out on

    # ---- pipeline ----
    def _build(self, spec, size: int):
        fn, types = self.fn, self.types
        # a sample transform takes pixels: JPEGs are then decoded by the reader threads
        encoded = spec.dataset.encoding == "jpeg" and spec.sample_hook is None
        if self._reads is None:
            self._reads = cf.ThreadPoolExecutor(max(1, min(4, spec.num_workers)),
                                                thread_name_prefix="fastdata-dali")
        spatial = spec.dataset.label_kind in SPATIAL_KINDS       # targets made by _crops
        source = _Source(spec.dataset, size, encoded, self._reads, depth=spec.prefetch + 1,
                         sample_transform=spec.sample_hook,
                         crops=functools.partial(_crops, spec, size) if spatial else None)
        pipe = self.dali.Pipeline(
            batch_size=spec.order.batch_size, num_threads=self.threads,
            device_id=(spec.device.index or 0) if self.gpu else None,
            seed=int(np.random.SeedSequence([spec.order.seed, spec.order.rank]).generate_state(1)[0]
                     % 2**31), prefetch_queue_depth=spec.prefetch)
        with pipe:
            images, labels, *crops = fn.external_source(
                source=source, num_outputs=5 if spatial else 2, batch=True,
                layout=[None if encoded else "HWC"] + [None] * (4 if spatial else 1),
                dtype=[types.UINT8, types.INT64 if spec.dataset.label_kind in (
                    "class", *SPATIAL_KINDS) else types.FLOAT] + (
                    [types.FLOAT, types.FLOAT, types.INT32] if spatial else []))
            if encoded:
                images = fn.decoders.image(images, device="mixed" if self.gpu else "cpu",
                                           output_type=types.RGB)
            elif self.gpu:
                images = images.gpu()
            if self.gpu:    # a host batch would reach torch as pageable memory, and copying
                labels = labels.gpu()   # that makes the host wait for the training step
            images = self._augment(spec, images, size, crops)
            pipe.set_outputs(images, labels)
        pipe.build()
        _PIPELINES.add(pipe)
        return pipe, source

    def _augment(self, spec, images, size: int, crops):
        """The built-in crop, resize, flip and normalisation of the pipeline's images;
        ``crops``: a detection or segmentation set's, drawn by the source (roi start, roi
        end, mirror)."""
        fn, types = self.fn, self.types
        t = spec.crop_stage
        out = spec.crop or size
        if crops:
            start, end, mirror = crops
            images = fn.resize(images, size=[out, out], roi_start=start, roi_end=end,
                               roi_relative=False, interp_type=types.INTERP_LINEAR,
                               antialias=True)
        elif t.train:
            images = fn.random_resized_crop(
                images, size=[out, out], random_area=list(t.scale),
                random_aspect_ratio=list(t.ratio), num_attempts=10, antialias=True)
            mirror = fn.random.coin_flip(probability=t.flip)
        else:
            top, left, h, w = center_boxes(1, size, size, t.eval_ratio)[0].tolist()
            if (h, w) != (out, out) or (top, left) != (0, 0):
                images = fn.resize(images, size=[out, out], roi_start=[top, left],
                                   roi_end=[top + h, left + w], roi_relative=False,
                                   interp_type=types.INTERP_LINEAR, antialias=True)
            mirror = 0
        norm = t.dtype != torch.uint8
        return fn.crop_mirror_normalize(
            images, mirror=mirror,
            dtype=types.FLOAT16 if t.dtype == torch.float16 else
            (types.FLOAT if norm else types.UINT8),
            output_layout="HWC" if t.channels_last else "CHW",
            mean=[255 * m for m in t.mean] if norm else [0.0],
            std=[255 * s for s in t.std] if norm else [1.0])

    # ---- iteration ----
    def iterate(self, spec, batches, seeds):
        size = spec.size
        key = (size, spec.crop)
        # taken out while in use: an iteration started meanwhile builds its own pipeline
        pipe, source = self._pipes.pop(key, None) or self._build(spec, size)
        hook = spec.batch_hook
        seeds, hook_seeds = itertools.tee(seeds)     # each drawn once, for both
        source.start(batches, seeds, spec.batch_timeout, lambda job: self._late(spec, job))
        finished = False
        try:
            while True:
                try:
                    images, labels = pipe.run()
                except StopIteration:
                    finished = True
                    return
                except RuntimeError as e:       # DALI names the batch slot, not the sample
                    root = spec.dataset.root
                    raise RuntimeError(f"DALI failed reading {root}: `fastdata verify {root}` "
                                       f"names any damaged shard and sample\n{e}") from e
                images, labels = self._to_torch(spec, images), self._to_torch(spec, labels)
                if source.crops is not None:    # the targets the source made
                    labels = map_tensors(lambda t: t.to(spec.device, non_blocking=True),
                                         source.pending.popleft())
                seed = next(hook_seeds)
                yield (images, labels) if hook is None else hook(images, labels, seed)
        finally:
            if finished:        # else batches are still queued inside: dropped, built anew
                pipe.reset()
                # the only one kept: progressive resizing may change the crop every epoch, and
                # each pipeline holds its threads and buffers (6 threads more per crop, kept)
                self._pipes = {key: (pipe, source)}

    def _late(self, spec, job) -> TimeoutError:
        """The error of a batch past its deadline; the reader pool, whose thread is stuck in
        it, and the pipelines are let go of (a thread cannot be stopped: it runs on)."""
        indices, _ = job
        pool, self._reads = self._reads, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        self._pipes.clear()
        return past_deadline(spec, indices)

    def _to_torch(self, spec, tl) -> torch.Tensor:
        """A DALI batch → a torch tensor on the loader's device (one copy). A GPU batch is
        copied on a side stream, which the training stream then waits for: copied on the
        training stream, it queued behind the step, and DALI, which hands that output buffer
        out again at a later ``run()``, would make the host wait for the step."""
        t = tl.as_tensor()
        on_gpu = isinstance(t, self.plugin.TensorGPU)
        shape, dtype = tuple(t.shape()), self.plugin.to_torch_type[t.dtype]
        if on_gpu:
            if self._copies is None or self._copies.device != spec.device:
                self._copies = torch.cuda.Stream(spec.device)
            with torch.cuda.stream(self._copies):
                out = torch.empty(shape, dtype=dtype, device=spec.device)
                self.plugin.feed_ndarray(t, out, cuda_stream=self._copies)
            current = torch.cuda.current_stream(spec.device)
            current.wait_stream(self._copies)
            out.record_stream(current)
        else:   # CPU-only mode: from a pool (a fresh batch of 32 MiB or more faults in anew)
            if (shape, dtype) not in self._host_pools:
                self._host_pools[shape, dtype] = BufferPool(shape, dtype)
            out = self._host_pools[shape, dtype].get()
            self.plugin.feed_ndarray(t, out)
        if out.dim() != 4:                                   # labels
            targets = spec.dataset.label_kind != "class"      # (B, K), else (B,)
            out = out.reshape(shape[0], -1) if targets else out.reshape(-1)
            return out.to(spec.device, non_blocking=True)
        out = out.to(spec.device, non_blocking=True)
        if spec.crop_stage.channels_last:
            out = out.permute(0, 3, 1, 2)                    # NHWC storage = channels_last
        return out.to(torch.bfloat16) if spec.crop_stage.dtype == torch.bfloat16 else out

    def close(self):
        self._pipes.clear()
        if self._reads is not None:
            self._reads.shutdown(wait=True)
            self._reads = None
