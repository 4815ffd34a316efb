"""Recycled batch buffers: a pool of pinned or shared tensors handed out again once nothing
references them (``BufferPool``), and the shared-memory ring that worker processes make CPU
batches in (``SharedRing``). Used by both backends."""
from __future__ import annotations

import math
import threading

import torch


def _use_count(t: torch.Tensor | torch.UntypedStorage) -> int:
    storage = t if isinstance(t, torch.UntypedStorage) else t.untyped_storage()
    return torch._C._storage_Use_Count(storage._cdata)


class BufferPool:
    """Tensors of one shape, handed out again only when nothing references them any more.

    Each ``get()`` returns a new *view* of a pooled tensor: a view holds its storage, so while
    the caller (or a batch derived from it, or a queued result) is alive the storage's use count
    stays above idle and the buffer is not handed out again. ``shared``: each tensor in shared
    memory from the start (a worker process's result, which would be copied there). Thread-safe.
    """

    def __init__(self, shape, dtype, *, pin: bool = False, shared: bool = False):
        self.shape, self.dtype, self.pin, self.shared = tuple(shape), dtype, pin, shared
        self._all: list[torch.Tensor] = []
        self._idle = 0
        self._lock = threading.Lock()
        self.recycle = hasattr(torch._C, "_storage_Use_Count")

    def get(self) -> torch.Tensor:
        with self._lock:
            if self.recycle:
                for t in self._all:
                    if _use_count(t) == self._idle:
                        return t.view(self.shape)
            t = torch.empty(self.shape, dtype=self.dtype, pin_memory=self.pin)
            if self.shared:
                t.share_memory_()
            if self.recycle and len(self._all) < 64:
                self._all.append(t)
                self._idle = _use_count(t)    # only the pool's own tensor holds it
            return t.view(self.shape)


class SharedRing:
    """Shared-memory buffers that worker processes make their batches in, one job at a time.

    Made in the parent before the workers start (a forked worker inherits them, a spawned one
    receives them), lent with a job when it is sent, and lent again only once nothing in the
    parent references the batch made in it (as ``BufferPool``): fresh shared memory for each
    result, faulted in and zeroed by the kernel, took most of a worker's time per batch.
    """

    def __init__(self, count: int, nbytes: int):
        self.storages = [torch.empty(nbytes, dtype=torch.uint8).share_memory_().untyped_storage()
                         for _ in range(count)]
        self._idle = [_use_count(s) for s in self.storages]
        self._lent = [False] * count
        #: lends asked for while every buffer was in use (their batches made elsewhere)
        self.missed = 0

    def lend(self) -> int | None:
        """A free buffer's number (now lent), or None when every one is in use."""
        for k, storage in enumerate(self.storages):
            if not self._lent[k] and _use_count(storage) == self._idle[k]:
                self._lent[k] = True
                return k
        self.missed += 1
        return None

    def give_back(self, slot: int, images):
        """A job's result: ``images`` as a tensor over buffer ``slot`` where the worker made
        it there (it sent ``(dtype, shape, stride, offset)``), else as the worker sent it."""
        if isinstance(images, tuple):
            dtype, shape, stride, offset = images
            images = torch.empty(0, dtype=dtype).set_(self.storages[slot], offset, shape, stride)
        self._lent[slot] = False
        return images

    def reclaim(self) -> None:
        """Every buffer back, those of jobs whose results were never taken included: only
        once no worker may still be making a batch in one."""
        self._lent = [False] * len(self._lent)


def tensor_in(storage: torch.UntypedStorage | None, shape, dtype) -> torch.Tensor | None:
    """A contiguous tensor at the start of ``storage``, None if it does not fit there."""
    if storage is None or math.prod(shape) * dtype.itemsize > storage.nbytes():
        return None
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)  # type: ignore[call-overload]
