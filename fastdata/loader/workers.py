"""The host stage's workers: reader threads limited to one OpenMP thread each, and worker
processes through torch's DataLoader, one whole batch per item, made in ring buffers the parent
lends them."""
from __future__ import annotations

import ctypes
import functools
import logging
import multiprocessing
import os
from collections import deque

import numpy as np
import torch
from torch.utils.data._utils import signal_handling

from fastdata.env import parent_garbage_frozen
from fastdata.loader.buffers import SharedRing
from fastdata.loader.spec import past_deadline

log = logging.getLogger("fastdata")

@functools.lru_cache(maxsize=1)
def _openmp():
    """The OpenMP runtime torch uses (found among the loaded libraries), or None."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libgomp" in line or "libiomp" in line}
    except OSError:
        return None
    own = os.path.dirname(torch.__file__)       # torch's own copy first (others may be loaded)
    for path in sorted(paths, key=lambda p: not p.startswith(own)):
        try:
            return ctypes.CDLL(path)
        except OSError:
            pass
    return None


def one_intraop_thread() -> None:
    """Make ATen ops in *this* thread single-threaded (OpenMP's per-thread nthreads setting).

    Worker threads already process whole batches in parallel; ops inside each starting an
    OpenMP team as wide as the machine oversubscribe the cores.
    ``torch.set_num_threads`` would also change the default of every later thread, the
    training loop's included.
    """
    torch.get_num_threads()         # this thread's lazy OpenMP set-up runs now, not afterwards
    lib = _openmp()
    if lib is not None:
        lib.omp_set_num_threads(1)


class _BatchDataset(torch.utils.data.Dataset):
    """Job ``(indices, seed, slot)``: that batch, made in ring buffer ``slot`` where
    one was lent; the result is ``(slot, images, labels, params)``, with ``images`` as
    ``(dtype, shape, stride, offset)`` where it was made there (the parent has that memory),
    and on CPU ``labels`` as a numpy array."""

    def __init__(self, reader, ring: SharedRing | None):
        self.reader = reader
        self.storages = ring.storages if ring is not None else []

    def __getitem__(self, job):
        *batch, slot = job
        buffer = None if slot is None else self.storages[slot]
        images, labels, params = self.reader(*batch, ring=buffer)
        if buffer is not None and images.untyped_storage().data_ptr() == buffer.data_ptr():
            images = (images.dtype, images.shape, images.stride(), images.storage_offset())
        if self.reader.on_host and torch.is_tensor(labels):     # pickled as bytes: as a
            labels = labels.numpy()     # tensor it would take a shared memory segment
        return slot, images, labels, params


class _Lending(torch.utils.data.Sampler):
    """A pass's jobs, each with a ring buffer lent as the DataLoader sends it (None when none
    is free: the worker then makes the batch in fresh shared memory)."""

    def __init__(self, ring: SharedRing | None):
        self.ring, self.jobs = ring, iter(())

    def __iter__(self):
        # first run as the DataLoader sends a pass's first job, which it does after waiting
        # for its workers to finish the jobs of a pass left unfinished (persistent workers:
        # ``_reset``); those jobs' buffers come back (tests/loader/test_workers.py checks both)
        if self.ring is not None:
            self.ring.reclaim()
        for job in self.jobs:
            yield *job, None if self.ring is None else self.ring.lend()


def _as_sent(item):
    return item     # not the default's conversion, which makes the tuples lists


#: why a batch came in fresh shared memory, said once per set of worker processes
_HELD = ("worker processes made a batch in fresh shared memory, which costs about as much as "
         "making it: the %d buffers they make batches in were all in use, by batches in "
         "flight and batches the program still references; let go of earlier batches (a "
         "list of them, or the variable of an earlier loop) to keep loading at full speed")


class WorkerProcesses:
    """Worker processes through torch's DataLoader (one item = one whole batch), with the ring
    their CPU batches are made in; ``persistent``: kept from one pass to the next (starting
    them again delays each pass's first batch, by a second with spawn)."""

    def __init__(self, reader, spec, stage, *, persistent: bool):
        """``spec``: the pass's ``Spec``; ``stage``: the ``HostStage`` whose counts and start
        method apply."""
        nbytes = reader.ring_bytes(spec.order.batch_size)
        self.ring = None
        if nbytes is not None and hasattr(torch._C, "_storage_Use_Count"):
            # the jobs in flight, the batch the consumer holds, one it has just been handed,
            # and one a program keeps a little longer (``_`` of a ``for _ in loader`` before)
            self.ring = SharedRing(stage.num_workers * stage.prefetch + 3, nbytes)
        self.key = self.key_of(reader, spec, stage)
        self.spec = spec
        self.busy = self.broken = self.closed = self._told = False
        self._iterator = None
        self._lending = _Lending(self.ring)
        self._dl = torch.utils.data.DataLoader(
            _BatchDataset(reader, self.ring), batch_size=None, sampler=self._lending,
            collate_fn=_as_sent, num_workers=stage.num_workers, prefetch_factor=stage.prefetch,
            multiprocessing_context=stage.mp_context, persistent_workers=persistent,
            pin_memory=spec.device.type == "cuda",     # pins for the current CUDA device
            timeout=spec.batch_timeout or 0)

    @staticmethod
    def key_of(reader, spec, stage) -> tuple:
        """What a pass's workers must have been made for to be used again."""
        return reader, stage.num_workers, stage.prefetch, stage.mp_context, spec.timeout

    def usable(self, key) -> bool:
        """Whether a pass may use these workers: made for ``key``, and none has failed or died
        (a killed one is noticed when it happens, wherever the main thread then is)."""
        it = getattr(self._dl, "_iterator", None)   # DataLoader's own, when persistent
        return (key == self.key and not self.broken
                and all(p.is_alive() for p in getattr(it, "_workers", ())))

    def run(self, jobs):
        """The pass's ``(images, labels, params)``; one pass at a time (see ``busy``)."""
        self.busy = True
        sent: deque = deque()       # the jobs lent and not yet back: the oldest is the next
        try:
            self._lending.jobs = (sent.append(job) or job for job in jobs)
            with parent_garbage_frozen():   # CUDA garbage of earlier work is not theirs
                batches = self._iterator = iter(self._dl)   # the workers start or resume here
            while True:
                if self.closed:
                    raise RuntimeError("the loader was closed: its worker processes are gone; "
                                       "make a new Loader to read on")
                try:
                    slot, images, labels, params = next(batches)
                except StopIteration:
                    return
                except RuntimeError as e:   # DataLoader's timeout: the batch it waited for
                    if not str(e).startswith("DataLoader timed out") or not sent:
                        raise
                    raise past_deadline(self.spec, sent[0][0]) from None
                sent.popleft()
                if slot is not None:
                    images = self.ring.give_back(slot, images)
                elif self.ring is not None and self.ring.missed and not self._told:
                    self._told = True
                    log.warning(_HELD, len(self.ring.storages))
                yield images, (torch.as_tensor(labels) if isinstance(labels, np.ndarray)
                               else labels), params
        except BaseException as e:          # a worker's error, one that died, Ctrl-C...
            if not isinstance(e, GeneratorExit):    # ...then not used again: stopped now
                self.shutdown(kill=True)
            raise
        finally:
            self.busy = False

    def shutdown(self, *, kill: bool = False) -> None:
        """Stop the worker processes now, even while an iterator over them is held; ``kill``:
        without waiting for them (after an error the DataLoader's own shutdown waited 5 s for
        each worker, and did it whenever the collector reached the pool)."""
        self.closed = self.broken = True
        for it in (self._iterator, getattr(self._dl, "_iterator", None)):
            if it is None:
                continue
            killed = [w for w in getattr(it, "_workers", ()) if kill and w.is_alive()]
            if killed:
                # out of torch's SIGCHLD watch first: a worker that has not yet set its own
                # SIGTERM handler dies "killed by signal", which would replace the error
                if getattr(it, "_worker_pids_set", False):
                    signal_handling._remove_worker_pids(id(it))
                    it._worker_pids_set = False
                for w in killed:
                    w.terminate()
                # a worker terminated while it held the shared event's lock (it reads the
                # event between items) would make the shutdown's set() wait forever: the
                # shutdown gets an event of its own, as no worker is left to read it
                it._workers_done_event = multiprocessing.Event()
            stop = getattr(it, "_shutdown_workers", None)     # DataLoader's, not public
            if stop is not None:
                stop()
        self._iterator = None
