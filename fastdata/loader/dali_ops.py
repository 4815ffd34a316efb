"""The DALI backend's pipeline: ``external_source`` then DALI's decoding and augmentation, and
its outputs as torch tensors.

Augmentation: ``fn.random_resized_crop`` (torchvision's scale/ratio) + a coin-flip mirror in
``fn.crop_mirror_normalize``; eval: the centre box the torch backend uses, resized with
``fn.resize`` (antialiased linear), then normalised; a detection or segmentation set's crops,
drawn by the host stage, through ``fn.resize``'s roi. bfloat16 is produced from float32 by
torch, as DALI has no bfloat16. ``channels_last`` output comes from an HWC layout viewed as NCHW.
A CPU ``device`` runs DALI's CPU-only mode (``device_id=None``).
"""
from __future__ import annotations

import os
import weakref

import numpy as np
import torch

from fastdata._optional import require
from fastdata.loader.buffers import BufferPool
from fastdata.ops.boxes import center_boxes

# A fork child inherits this process's DALI pipelines but not their threads: destroying one
# there (its garbage collector will try, as soon as the first allocation after the fork, even
# inside threading's own after-fork hook) kills the child with SIGSEGV. So the live pipelines
# are held strongly across every fork: the parent lets go right after, a child never does.
_PIPELINES: weakref.WeakSet = weakref.WeakSet()
_HELD: list = []


def _hold() -> None:
    _HELD[:] = list(_PIPELINES)


os.register_at_fork(before=_hold, after_in_parent=_HELD.clear)


class DaliOps:
    """DALI's modules (imported lazily, naming the pip extra), the pipelines they build and the
    copies of their outputs into torch."""

    def __init__(self, spec, *, threads: int, prefetch: int):
        need = "backend='dali'"
        self.dali = require("nvidia.dali", need)
        self.fn, self.types = require("nvidia.dali.fn", need), require("nvidia.dali.types", need)
        self.plugin = require("nvidia.dali.plugin.pytorch", need)
        self.gpu = spec.device.type == "cuda"
        self.threads, self.prefetch = threads, prefetch
        self._host_pools: dict[tuple, BufferPool] = {}
        # the side stream DALI's GPU outputs are copied out on
        self._copies: torch.cuda.Stream | None = None

    def pipeline(self, spec, source, *, encoded: bool, spatial: bool):
        """A built pipeline fed by ``source`` (batch mode): ``(images, labels)``; ``encoded``:
        JPEG bytes come in; ``spatial``: roi starts, ends and mirrors come in beside them."""
        fn, types, size = self.fn, self.types, spec.size
        pipe = self.dali.Pipeline(
            batch_size=spec.order.batch_size, num_threads=self.threads,
            device_id=(spec.device.index or 0) if self.gpu else None,
            seed=int(np.random.SeedSequence([spec.order.seed, spec.order.rank]).generate_state(1)[0]
                     % 2**31), prefetch_queue_depth=self.prefetch)
        with pipe:
            images, labels, *crops = fn.external_source(
                source=source, num_outputs=5 if spatial else 2, batch=True,
                layout=[None if encoded else "HWC"] + [None] * (4 if spatial else 1),
                dtype=[types.UINT8, types.FLOAT if spec.dataset.label_kind in (
                    "multi_label", "regression") else types.INT64] + (
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
        return pipe

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

    def to_torch(self, spec, tl) -> torch.Tensor:
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
