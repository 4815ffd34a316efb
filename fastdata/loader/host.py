"""The host stage both backends share: a pass's batches read in order, inline, in reader
threads or in worker processes, with a deadline that names the stuck sample.

``HostReader`` reads one batch (its labels or targets, its pixels into a recycled buffer through
the sample hook, or its encoded JPEGs) and names a shard cut short under it; each backend
subclasses it for what its device stage takes. ``HostStage`` runs a reader over a pass's jobs
``(indices, seed)`` and yields the results in job order.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import pickle
import weakref
from collections import deque
from collections.abc import Callable

import numpy as np
import torch

from fastdata.checks import choice, integer
from fastdata.env import usable_cpus
from fastdata.format import SPATIAL_KINDS
from fastdata.loader.spec import past_deadline
from fastdata.loader.workers import WorkerProcesses, one_intraop_thread
from fastdata.ops.sample import apply_sample_transform
from fastdata.ops.targets import batch_targets
from fastdata.shards.mapped import guard_faults

WORKER_KINDS = ("thread", "process")
MP_CONTEXTS = ("fork", "spawn", "forkserver")


def ordered(pool, fn, jobs, depth: int, timeout: float | None = None,
            late: Callable[[tuple], BaseException] | None = None):
    """``fn(*job)`` for each job on ``pool``, results in job order, at most ``depth`` in flight.
    ``timeout``: seconds to wait for each result once it is the next one; past it, ``late(job)``
    is raised."""
    window: deque = deque()

    def take():
        job, future = window.popleft()
        try:
            return future.result(timeout=timeout)
        except cf.TimeoutError:
            raise (late(job) if late is not None else TimeoutError(job)) from None

    for job in jobs:
        window.append((job, pool.submit(fn, *job)))
        if len(window) >= depth:
            yield take()
    while window:
        yield take()


def check_picklable(spec) -> None:
    """Refuse hooks that cannot be sent to worker processes, naming the fix."""
    hooks = [("sample_transform", spec.sample_hook),
             ("batch_transform", getattr(spec.batch_hook, "fn", None))]
    if spec.fields is not None:
        hooks += [(f"field_transforms[{k!r}]", fn) for k, fn in spec.fields.transforms.items()]
    for name, fn in hooks:
        if fn is None:
            continue
        try:
            pickle.dumps(fn)
        except Exception as e:  # noqa: BLE001 - pickle raises many kinds
            raise ValueError(f"{name}={fn!r} cannot be sent to worker processes "
                             f"(workers='process'): {type(e).__name__}: {e}; define it at the "
                             f"top level of a module (not a lambda or a nested function), or "
                             f"use workers='thread'") from None


class HostReader:
    """Reads one batch on the host: ``reader(indices, seed, ring=None)``. Picklable, for worker
    processes. Subclasses implement ``read``; ``progress`` says, per batch seed, the image the
    sample hook is on (``HostStage`` names it in a deadline's error)."""

    def __init__(self, spec):
        self.ds, self.size, self.crop_stage = spec.dataset, spec.size, spec.crop_stage
        self.key = (spec.size, spec.crop)
        self.on_host = spec.device.type == "cpu"
        self.sample_hook, self.batch_hook = spec.sample_hook, spec.batch_hook
        self.targets_form = spec.targets
        self.fields = spec.fields
        #: a detection or segmentation set's boxes, masks or class maps, or a dict batch's
        #: moving fields (boxes, keypoints), go through each image's crop and flip: ``targets``
        self.spatial = spec.dataset.label_kind in SPATIAL_KINDS or (
            self.fields is not None and self.fields.moves(spec.dataset))
        self.progress: dict[int, list[int]] = {}

    def __getstate__(self):
        return {**self.__dict__, "progress": {}}

    def __call__(self, indices: np.ndarray, seed: int, ring: torch.UntypedStorage | None = None):
        """The batch ``indices`` (``read``'s result); ``seed``: its augmentation's
        (``Order.batch_seed``); ``ring``: a shared buffer of the parent's to make it in."""
        faults = guard_faults()
        with contextlib.ExitStack() as hold:    # LMDB's views: their transactions, till done
            batch = self.read(indices, seed, hold, ring)
        if guard_faults() != faults:    # a shard was cut short under the views: name it
            self.ds.check_intact(indices)
        return batch

    def read(self, indices, seed: int, hold: contextlib.ExitStack, ring):
        """One batch as the backend's device stage takes it; ``hold``: what views of the shards
        need held until it is done."""
        raise NotImplementedError

    def labels(self, indices) -> torch.Tensor | dict | None:
        """The batch's labels; for dict batches (``Spec.fields``), its fields but the image
        instead; None where they go through the crops (``spatial``: ``targets``)."""
        if self.spatial:
            return None
        if self.fields is not None:
            return self.fields.read(self.ds, indices, self._labels(indices))
        return self._labels(indices)()

    def _labels(self, indices) -> Callable[[], torch.Tensor]:
        return lambda: torch.from_numpy(self.ds.labels_of(indices))

    def draw(self, n: int, seed: int) -> tuple:
        """The crop boxes and flips of a batch of ``n`` stored squares, from its seed."""
        return self.crop_stage.params(n, self.size, self.size,
                                      torch.Generator().manual_seed(seed))

    def targets(self, indices, drawn) -> list[dict] | dict:
        """A detection or segmentation batch's targets, or a dict batch's fields, through its
        crops and flips (``drawn``; None: the stored squares as they are)."""
        def moved():
            return batch_targets(self.ds, indices, drawn, self.size,
                                 self.crop_stage.crop, self.targets_form)

        if self.fields is None:
            return moved()
        labels = moved if self.ds.label_kind in SPATIAL_KINDS else self._labels(indices)
        return self.fields.read(self.ds, indices, labels, drawn, self.size,
                                self.crop_stage.crop or self.size)

    def pixels(self, indices, seed: int, out: np.ndarray) -> np.ndarray:
        """The batch's stored pixels read into ``out``, then through the sample hook."""
        images = self.ds.read_batch(indices, size=self.size, out=out)
        if self.sample_hook is not None:
            at = self.progress[seed] = [-1]
            try:
                apply_sample_transform(self.sample_hook, images, seed,
                                       self.ds.sample_names(indices), at)
            finally:       # a pass after a deadline may read the same batch again
                self.progress.pop(seed, None)
        return images

    def stuck(self, indices, seed: int) -> str:
        """What a batch past its deadline is stuck on, where the sample hook is on one."""
        at = self.progress.get(seed)
        k = at[0] if at else -1
        return (f"sample_transform has not returned on {self.ds.sample_names(indices)(k)}"
                if k >= 0 else "")

    def ring_bytes(self, batch: int) -> int | None:
        """The bytes of a batch a worker process makes in the parent's shared ring; None: none."""
        return None


class HostStage:
    """Runs a ``HostReader`` over a pass's jobs, results in job order: in the calling thread
    (``num_workers=0``), in reader threads, or in worker processes (kept from one pass to the
    next), ``num_workers + prefetch`` batches in flight."""

    def __init__(self, *, workers: str = "thread", num_workers: int | None = None,
                 prefetch: int = 2, mp_context: str | None = None):
        """Raises ValueError on a choice or count out of range (naming the valid ones)."""
        self.workers = choice("workers", workers, WORKER_KINDS)
        self.mp_context = choice("mp_context", mp_context, (*MP_CONTEXTS, None))
        n = min(8, usable_cpus()) if num_workers is None else num_workers
        self.num_workers = integer("num_workers", n, 0)
        self.prefetch = integer("prefetch", prefetch, 1)
        self._pool: cf.ThreadPoolExecutor | None = None
        self._workers = None                # WorkerProcesses, kept from one pass to the next
        self._all_workers: weakref.WeakSet = weakref.WeakSet()   # for close(), passes' own too

    @property
    def processes(self) -> int:
        """The processes that read (1, or the worker processes)."""
        return self.num_workers if self.workers == "process" and self.num_workers else 1

    def run(self, spec, reader: HostReader, batches, seeds):
        """``reader(indices, seed)`` for each of the pass's batches, in order."""
        jobs = zip(batches, seeds)
        if self.num_workers == 0:
            for job in jobs:
                yield reader(*job)
        elif self.workers == "thread":
            if self._pool is None:
                self._pool = cf.ThreadPoolExecutor(self.num_workers,
                                                   thread_name_prefix="fastdata",
                                                   initializer=one_intraop_thread)
            yield from ordered(self._pool, reader, jobs, self.num_workers + self.prefetch,
                               spec.batch_timeout, lambda job: self._late(spec, reader, job))
        else:
            yield from self._processes(spec, reader, jobs)

    def _late(self, spec, reader: HostReader, job) -> TimeoutError:
        """The error of a batch past its deadline; the pool, whose thread is stuck in it, is
        let go of (a thread cannot be stopped: it runs on) and the next pass makes another."""
        indices, seed = job
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        return past_deadline(spec, indices, reader.stuck(indices, seed))

    def _processes(self, spec, reader, jobs):
        w = self._workers
        if w is not None and w.busy:    # a pass still under way has them: this one its own
            w = WorkerProcesses(reader, spec, self, persistent=False)
        elif w is None or not w.usable(WorkerProcesses.key_of(reader, spec, self)):
            self._workers = None        # first: the old ones stop before new ones start
            w = self._workers = WorkerProcesses(reader, spec, self, persistent=True)
        self._all_workers.add(w)
        yield from w.run(jobs)

    def close(self) -> None:
        """Stop the threads and worker processes (a later pass starts them again)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._workers = None
        for w in list(self._all_workers):    # an iterator still held keeps them otherwise
            w.shutdown()
