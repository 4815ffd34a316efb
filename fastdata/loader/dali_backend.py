"""The DALI backend: the same batches as the torch backend, decoded and augmented by DALI.

``fn.external_source`` (batch mode) is fed by ``_Source`` with this rank's batches, read by the
host stage (``host``: order, deadline, sample hook, targets) in reader threads ahead of DALI. Raw
shards go in as uint8 HWC batches; JPEG shards as encoded bytes for ``fn.decoders.image``
(``device="mixed"``, nvJPEG, on CUDA; CPU decoding on CPU). DALI's own shuffling, sharding and
last-batch policies are not used: an epoch ends when our batches do (``StopIteration``), so
every rank gets exactly what ``Order`` gives it, partial eval batches included.

The pipeline's ops and the copies of its outputs into torch: ``dali_ops``.
"""
from __future__ import annotations

import collections
import itertools
import queue

import numpy as np
import torch

from fastdata.loader.dali_ops import DaliOps
from fastdata.loader.host import HostReader, HostStage
from fastdata.loader.spec import Backend
from fastdata.ops.targets import map_tensors
from fastdata.shards.mapped import page_aligned


class _Reader(HostReader):
    """One batch for ``external_source``: ``(images, labels, buffer, crops)``. Raw batches are
    read into page-aligned arrays used again (``_Source``): a fresh array per batch is mapped
    anew by malloc from 32 MiB up, and its pages fault in at every batch."""

    def __init__(self, spec, encoded: bool):
        super().__init__(spec)
        self.encoded = encoded
        self.spare: queue.SimpleQueue = queue.SimpleQueue()     # raw arrays DALI has copied

    def read(self, indices, seed, hold, ring):
        """``(images, labels, buffer, crops, fields)``: ``fields``, a dict batch's fields but
        the image (None for ``(images, labels)`` batches), wait in ``_Source.fields``."""
        labels = self.ds.labels_of(indices)
        fields = None if self.fields is None else self.labels(indices)
        # a detection or segmentation set's crops, drawn as the torch backend draws them, go
        # to DALI's resize; their targets wait in ``_Source.pending``
        crops = None
        if self.spatial:
            drawn = self.draw(len(indices), seed)
            crops = (self.targets(indices, drawn), *drawn)
        if self.encoded:
            return [np.frombuffer(b, np.uint8) for b in self.ds.read_encoded(indices, self.size)], \
                labels, None, crops, fields
        try:
            buf = self.spare.get_nowait()
        except queue.Empty:
            buf = None
        if buf is None or len(buf) < len(indices):      # none spare, or a partial batch's
            buf = page_aligned((len(indices), self.size, self.size, 3))
        return self.pixels(indices, seed, buf[:len(indices)]), labels, buf, crops, fields


class _Source:
    """Batch-mode ``external_source``: the host stage's batches, StopIteration at epoch end.
    DALI copies what a call returns before it calls again (``no_copy=False``), so the previous
    call's array is spare then."""

    def __init__(self, reader: _Reader):
        self.reader = reader
        self.pending: collections.deque = collections.deque()   # targets, in DALI's order
        self.fields: collections.deque = collections.deque()    # dict batches' fields, too
        self.batches = iter(())
        self._given = None                  # the array the last call returned

    def start(self, batches) -> None:
        self._recycle(None)
        self.pending.clear()
        self.fields.clear()
        self.batches = batches

    def _recycle(self, given) -> None:
        if self._given is not None:
            self.reader.spare.put(self._given)
        self._given = given

    def __call__(self):
        images, labels, buf, crops, fields = next(self.batches)  # StopIteration: epoch's end
        self._recycle(buf)
        if fields is not None:
            self.fields.append(fields)
        if crops is None:
            return images, labels
        targets, boxes, flips = crops
        self.pending.append(targets)
        top, left, h, w = boxes.to(torch.float32).unbind(1)
        return (images, labels, torch.stack([top, left], 1).numpy(),
                torch.stack([top + h, left + w], 1).numpy(), np.asarray(flips, np.int32))


class DaliBackend(Backend):
    """An NVIDIA DALI pipeline fed by the host stage's reader threads: JPEGs decoded by DALI
    (nvJPEG on CUDA), crop, resize, flip and normalisation by DALI's ops.

    Args:
        num_workers: DALI's threads (default: the usable cores, at most 8); the host stage reads
            with at most 4 of them.
        prefetch: DALI's queue depth (batches made ahead).

    Raises:
        ValueError: an option out of its range.
    """

    name = "dali"

    def __init__(self, *, num_workers: int | None = None, prefetch: int = 2):
        self._given(num_workers=num_workers, prefetch=prefetch)
        stage = HostStage(num_workers=num_workers, prefetch=prefetch)   # validates both
        self.threads, self.prefetch = max(1, stage.num_workers), stage.prefetch
        self.host = self._readers()
        self._pipes: dict[tuple, tuple] = {}

    def _readers(self) -> HostStage:
        """The reader threads, each batch read ahead of DALI's threads (none started yet)."""
        return HostStage(num_workers=min(4, self.threads), prefetch=1)

    def start(self, spec):
        self.ops = DaliOps(spec, threads=self.threads, prefetch=self.prefetch)
        self.host, self._pipes = self._readers(), {}      # this copy's own

    def _build(self, spec) -> tuple:
        # a sample transform takes pixels: JPEGs are then decoded by the reader threads
        encoded = spec.dataset.encoding == "jpeg" and spec.sample_hook is None
        source = _Source(_Reader(spec, encoded))
        return self.ops.pipeline(spec, source, encoded=encoded,
                                 spatial=source.reader.spatial), source

    # ---- iteration ----
    def iterate(self, spec, batches, seeds):
        size = spec.size
        key = (size, spec.crop)
        # taken out while in use: an iteration started meanwhile builds its own pipeline
        pipe, source = self._pipes.pop(key, None) or self._build(spec)
        hook = spec.batch_hook
        seeds, hook_seeds = itertools.tee(seeds)     # each drawn once, for both
        source.start(self.host.run(spec, source.reader, batches, seeds))
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
                images, labels = self.ops.to_torch(spec, images), self.ops.to_torch(spec, labels)
                if source.reader.spatial or spec.fields is not None:  # the reader's targets
                    labels = map_tensors(lambda t: t.to(spec.device, non_blocking=True),
                                         (source.pending if source.reader.spatial else
                                          source.fields).popleft())
                seed = next(hook_seeds)
                yield (images, labels) if hook is None else hook(images, labels, seed)
        finally:
            if finished:        # else batches are still queued inside: dropped, built anew
                pipe.reset()
                # the only one kept: progressive resizing may change the crop every epoch, and
                # each pipeline holds its threads and buffers (6 threads more per crop, kept)
                self._pipes = {key: (pipe, source)}

    def close(self):
        self._pipes.clear()
        self.host.close()
