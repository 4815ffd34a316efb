"""The torch backend: whole-batch reads in worker threads or processes, recycled (pinned)
buffers, uint8 until the device, prefetch on a side CUDA stream, augmentation on the device.

Host stage (``host``): each task reads one batch with ``ShardSet.read_batch`` (indices sorted
for locality inside) into a recycled uint8 NHWC buffer. On ``device="cpu"`` the transform runs
in the same task, so it is spread over the workers (raw shards: it crops views of the memory
maps, LMDB's while the batch's read transactions are held, with no batch copy). On CUDA the
buffer, the labels and the crop parameters are pinned, copied ``non_blocking`` on a side stream
and transformed there, ``prefetch`` batches ahead of the consumer. Worker processes make a CPU
device's batches in shared buffers the parent lends them (``SharedRing``).
"""
from __future__ import annotations

import ctypes
import itertools
from collections import deque

import numpy as np
import torch

from fastdata.checks import choice
from fastdata.kernels import jpeg
from fastdata.loader.buffers import BufferPool, tensor_in
from fastdata.loader.decode import JPEG_DECODES, decode_regions, jpeg_decode_where
from fastdata.loader.host import HostReader, HostStage, check_picklable
from fastdata.loader.spec import Backend
from fastdata.ops.boxes import packed_params
from fastdata.ops.targets import map_tensors


def _tensor(view: np.ndarray) -> torch.Tensor:
    """A tensor over a view of a shard's map. LMDB's map is read-only, and torch warns on such
    arrays: it is aliased through ctypes instead, which is sound because the transform only
    reads its input (a write would fault)."""
    if not view.flags.writeable:
        alias = (ctypes.c_uint8 * view.nbytes).from_address(view.ctypes.data)
        view = np.ctypeslib.as_array(alias).reshape(view.shape)
    return torch.from_numpy(view)


def _encoded(payloads: list) -> list[torch.Tensor]:
    """Stored JPEGs as CPU uint8 tensors, as torchvision's ``decode_jpeg`` takes them."""
    return [torch.from_numpy(np.frombuffer(p, np.uint8)) if isinstance(p, (bytes, memoryview))
            else _tensor(p) for p in payloads]


def decode_on_device(jpegs: list[torch.Tensor], device) -> torch.Tensor:
    """A batch of same-size JPEGs decoded on a CUDA device by nvJPEG (torchvision), as
    ``(B, S, S, 3)`` uint8, the layout of raw shards."""
    from torchvision.io import ImageReadMode, decode_jpeg

    images = decode_jpeg(jpegs, mode=ImageReadMode.RGB, device=device)
    return torch.stack(images).permute(0, 2, 3, 1).contiguous()


class _BatchReader(HostReader):
    """Read (and on CPU, transform) one batch: ``(images, labels, params)``."""

    def __init__(self, spec, jpeg_decode: str):
        super().__init__(spec)
        self.needs_crop_stage = spec.needs_crop_stage
        self.pin = spec.device.type == "cuda"
        self.gpu_jpeg = jpeg_decode == "gpu"       # decoded on the device (``_cuda``)
        # JPEG records decoded only where their crops need them: on the host, into the
        # crop stage's CPU kernels (which take images of any size; "batched" stacks them)
        self.regions = (self.on_host and self.needs_crop_stage and self.sample_hook is None
                        and self.ds.encoding == "jpeg"
                        and self.crop_stage.kernel != "batched" and jpeg.available())
        self._pools: dict = {}

    def _pool(self, key, shape, dtype, result: bool = True):
        if key not in self._pools:
            # in a DataLoader worker process, a result made outside a lent ring buffer is made
            # in shared memory, where the parent reads it (no recycling: the worker cannot tell
            # when the parent is done; made elsewhere, it would be copied there), and the
            # DataLoader pins it in the parent (pinning here would touch CUDA, which a forked
            # worker cannot); what stays in the worker is recycled there
            worker = torch.utils.data.get_worker_info() is not None
            shared = worker and result
            self._pools[key] = BufferPool(shape, dtype, pin=self.pin and not worker,
                                          shared=shared)
            self._pools[key].recycle &= not shared
        return self._pools[key]

    def _buffer(self, key, shape, dtype, ring: torch.UntypedStorage | None = None,
                result: bool = True) -> torch.Tensor:
        """A buffer for a result (in ``ring``, a worker process's lent buffer, where it fits)
        or, with ``result=False``, for a step before it."""
        t = tensor_in(ring, shape, dtype) if result else None
        return self._pool(key, shape, dtype, result).get() if t is None else t

    def ring_bytes(self, batch: int) -> int | None:
        """The bytes of a batch made in a buffer of ``_buffer``'s (see ``read``); None where
        it is not (on a CUDA device)."""
        t = self.crop_stage
        if not self.on_host:
            return None
        side = (t.crop or self.size) if self.needs_crop_stage else self.size
        return batch * 3 * side * side * t.dtype.itemsize

    def __getstate__(self):
        return {**super().__getstate__(), "_pools": {}}

    def read(self, indices, seed, hold, ring):
        s = self.size
        labels = self.labels(indices)
        if self.gpu_jpeg:       # the JPEGs themselves: nvJPEG decodes them on the device
            return self._for_device(_encoded(self.ds.read_encoded(indices, s)), labels, seed,
                                    indices)
        raw, params, drawn = self._stored(indices, seed, hold, ring)
        if not self.on_host:
            return self._for_device(raw, labels, seed, indices)
        return self._on_host(raw, labels, indices, seed, ring, params, drawn)

    def _stored(self, indices, seed, hold, ring) -> tuple:
        """``(stored pixels, params, drawn)``: the pixels as a batch, or views of each image
        (for the CPU kernels), or each image's decoded crop region (JPEG); ``params``: the
        crops and flips to apply to them, ``drawn``: the same in stored pixels (None where they
        are not drawn yet)."""
        b, s = len(indices), self.size
        views = (self.ds.raw_views(indices, s, hold) if self.on_host and self.needs_crop_stage
                 and self.sample_hook is None else None)
        params = drawn = None
        raw: torch.Tensor | list[torch.Tensor]
        if self.regions:        # the crops drawn first: each JPEG decoded where they fall
            boxes, flips = drawn = self.draw(b, seed)
            out = self._buffer((b, s), (b, s, s, 3), torch.uint8, ring, result=False)
            raw, boxes = decode_regions(self.ds.read_encoded(indices, s), boxes, out, lambda k: (
                self.ds.read_batch(indices[k:k + 1], size=s, out=out[k:k + 1].numpy())))
            params = boxes, flips
        elif views is not None:  # each image's crop is read from the map: no batch copy first
            raw = [_tensor(v) for v in views]
        else:
            # the stored pixels are the result on a device, and as channels_last uint8
            as_is = not self.on_host or not self.needs_crop_stage and self.crop_stage.channels_last
            batch = self._buffer((b, s), (b, s, s, 3), torch.uint8, ring, result=as_is)
            self.pixels(indices, seed, batch.numpy())
            raw = batch
        return raw, params, drawn

    def _on_host(self, raw, labels, indices, seed, ring, params, drawn):
        """A CPU device's batch made from the stored pixels ``raw`` (``_stored``)."""
        b, s = len(indices), self.size
        if not self.needs_crop_stage:         # the stored uint8 as is, as (B,3,S,S)
            if self.spatial:
                labels = self.targets(indices, None)
            nchw = raw.permute(0, 3, 1, 2)   # an NHWC buffer viewed as NCHW is channels_last
            if self.crop_stage.channels_last:
                return nchw, labels, None
            out = self._buffer(("out", b, s), (b, 3, s, s), torch.uint8, ring)
            return out.copy_(nchw), labels, None
        g = torch.Generator().manual_seed(seed)
        t = self.crop_stage
        o = t.crop or s
        if self.spatial:        # the crops drawn first, as the stage would: the boxes follow
            if params is None:
                params = drawn = t.params(b, s, s, g)
            labels = self.targets(indices, drawn)
        if t.channels_last:
            out = self._buffer(("out", b, o), (b, o, o, 3), t.dtype, ring).permute(0, 3, 1, 2)
        else:
            out = self._buffer(("out", b, o), (b, 3, o, o), t.dtype, ring)
        images = t(raw, g, out=out, params=params)
        if self.batch_hook is not None:
            images, labels = self.batch_hook(images, labels, seed)
        return images, labels, None

    def _for_device(self, raw, labels, seed, indices):
        """``(raw, labels, params)``, all pinned (in a worker process the DataLoader pins
        them): a copy from pageable memory makes the host wait for the copying stream's earlier
        work (CUDA's rule for such copies), which made the training loop wait for the previous
        batch's augmentation. ``params``: this batch's crop boxes and flips, (B, 5) int64, drawn
        here rather than in the training loop's thread; None without augmentation."""
        b = len(indices)
        drawn = None
        if self.needs_crop_stage:
            drawn = self.draw(b, seed)
        if self.spatial or not torch.is_tensor(labels):     # targets, or a batch's fields:
            # made here, moved with the images; a forked worker cannot touch CUDA: the
            # DataLoader pins them in the parent
            pin = self.pin and torch.utils.data.get_worker_info() is None
            pinned = map_tensors(torch.Tensor.pin_memory if pin else lambda t: t,
                                 self.targets(indices, drawn) if self.spatial else labels)
        else:
            pinned = self._pool(("labels", *labels.shape), labels.shape,
                                labels.dtype).get().copy_(labels)
        if drawn is None:
            return raw, pinned, None
        params = packed_params(*drawn, out=self._pool(("params", b), (b, 5), torch.int64).get())
        return raw, pinned, params


class TorchBackend(Backend):
    """Batches read whole in reader threads or worker processes into recycled (pinned) buffers,
    uint8 until the device, augmented there (on a CPU device, in the workers).

    Args:
        workers: ``"thread"`` (default) or ``"process"`` (the hooks must then be picklable).
        num_workers: reader threads or processes (default: the usable cores, at most 8); 0
            reads in the calling thread.
        prefetch: batches read ahead of the consumer (and, on CUDA, staged on the device).
        mp_context: ``"fork"``, ``"spawn"`` or ``"forkserver"`` for worker processes (default:
            torch's).
        jpeg_decode: where JPEG shards are decoded: ``"auto"`` (on the GPU where batches go to
            a CUDA device, torchvision can decode there and no ``sample_transform`` needs the
            pixels on the host), ``"cpu"`` or ``"gpu"`` (nvJPEG through torchvision).

    Raises:
        ValueError: an option out of its choices or range (naming the valid ones).
    """

    name = "torch"

    def __init__(self, *, workers: str = "thread", num_workers: int | None = None,
                 prefetch: int = 2, mp_context: str | None = None, jpeg_decode: str = "auto"):
        self._given(workers=workers, num_workers=num_workers, prefetch=prefetch,
                    mp_context=mp_context, jpeg_decode=jpeg_decode)
        self.host = HostStage(workers=workers, num_workers=num_workers, prefetch=prefetch,
                              mp_context=mp_context)
        self.jpeg_decode = choice("jpeg_decode", jpeg_decode, JPEG_DECODES)
        self._reader: _BatchReader | None = None
        self._stream = None         # the side stream that copies and augments on CUDA

    def start(self, spec):
        if self.host.workers == "process":
            check_picklable(spec)
        self.jpeg_decode = jpeg_decode_where(self.jpeg_decode, spec.device,
                                             spec.dataset.encoding, spec.sample_hook is not None)
        # each loader's own: threads, worker processes, buffers
        self.host = HostStage(**{k: getattr(self.host, k) for k in (
            "workers", "num_workers", "prefetch", "mp_context")})

    @property
    def processes(self) -> int:
        return self.host.processes

    def iterate(self, spec, batches, seeds):
        if self._reader is None or self._reader.key != (spec.size, spec.crop):
            # kept across epochs: its recycled buffers are already faulted in
            self._reader = _BatchReader(spec, self.jpeg_decode)
        reader = self._reader       # this loop's, even if the size or crop changes meanwhile
        if spec.device.type == "cpu":
            for images, labels, _ in self.host.run(spec, reader, batches, seeds):
                yield images, labels
        else:       # each seed drawn once, for the read and for the batch hook on the device
            seeds, hook_seeds = itertools.tee(seeds)
            read = self.host.run(spec, reader, batches, seeds)
            yield from self._cuda(spec, zip(read, hook_seeds), reader)

    def _cuda(self, spec, host, reader):
        dev = spec.device
        if self._stream is None or self._stream.device != dev:
            self._stream = torch.cuda.Stream(dev)
        stream = self._stream
        pending: deque = deque()
        copying: deque = deque()    # (event, pinned buffer): kept alive until the copy is done

        def stage(item, seed):
            while copying and copying[0][0].query():
                copying.popleft()
            raw, labels, params = item
            with torch.cuda.stream(stream):
                x = (decode_on_device(raw, dev) if isinstance(raw, list) else
                     raw.to(dev, non_blocking=True))
                y = map_tensors(lambda t: t.to(dev, non_blocking=True), labels)
                if params is not None:
                    p = params.to(dev, non_blocking=True)
                    x = reader.crop_stage(x, params=(p[:, :4], p[:, 4]))
                else:
                    x = x.permute(0, 3, 1, 2)
                    x = x.contiguous(memory_format=reader.crop_stage.memory_format)
                if reader.batch_hook is not None:
                    x, y = reader.batch_hook(x, y, seed)
                done = torch.cuda.Event()
                done.record(stream)
            copying.append((done, item))    # pooled host buffers: reused once copied
            return x, y, done

        for item, seed in host:
            pending.append(stage(item, seed))
            if len(pending) > self.host.prefetch:
                yield self._hand_over(*pending.popleft())
        while pending:
            yield self._hand_over(*pending.popleft())

    @staticmethod
    def _hand_over(x, y, done):
        cur = torch.cuda.current_stream(x.device)
        cur.wait_event(done)                     # no host sync: the GPU orders the streams
        x.record_stream(cur)
        map_tensors(lambda t: t.record_stream(cur), y)
        return x, y

    def close(self):
        self.host.close()
        self._reader = None
