"""Decode worker processes for the converter: batches of (position, path) out, results back
in input order, dead or hung workers detected and their images retried one by one."""
from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import os
import signal
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait

from fastdata.converters.decode import DecodeOptions, Inbox, Ring, Scratch, prepare_batch
from fastdata.env import parent_garbage_frozen

log = logging.getLogger("fastdata.convert")

BATCH_BYTES = 3 << 20               # raw pixels per worker task, about (see batch_size)
MAX_BATCH = 16
QUEUED = 2                          # batches a worker holds at most (the one it decodes too)
WINDOW = 4                          # batches per worker between the workers and the writer
ITEM_TIMEOUT_S = 120.0              # an image that takes longer is treated as a hung worker
INBOX_BATCH_BYTES = 6 << 20         # encoded bytes a batch passes through the Inbox, at most
POLL_S = 1.0                        # how often a wait for results looks for a hung worker


def batch_size(sizes) -> int:
    """Images per worker task: 16 up to 256 px, fewer for bigger ones (about ``BATCH_BYTES`` of
    raw pixels), so that the images in flight take about the same memory at any size."""
    return max(1, min(MAX_BATCH, BATCH_BYTES // sum(3 * s * s for s in sizes)))


def in_flight(workers: int, sizes) -> int:
    """Images between the decode workers and the writer at most."""
    return WINDOW * workers * batch_size(sizes)


class _WorkerDied(Exception):
    pass


def _worker_main(conn, opts: DecodeOptions, ring: Ring | None, parent: int, beats,
                 me: int, inbox: Inbox | None = None) -> None:
    """A decode worker: batches in from ``conn``, results out, in the order they came; the
    time each image starts goes into ``beats[me]``, by which the parent tells a hung worker
    from a busy one."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the parent's to handle
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    scratch = Scratch()

    def beat():
        beats[me] = time.monotonic()
    while True:
        try:
            batch = conn.recv()
        except EOFError:
            return
        try:
            results = prepare_batch(batch, opts, ring, scratch, on_item=beat, inbox=inbox)
        except Exception:       # noqa: BLE001 - a bug, not a bad image: the parent raises it
            results = RuntimeError(f"a decode worker failed:\n{traceback.format_exc()}")
        conn.send(results)


def _exit_with_parent(parent: int) -> None:
    """A worker whose parent was killed (SIGKILL, OOM) would wait for its next batch forever
    (the workers forked after it hold its pipe's other end too): leave once orphaned."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


@dataclass
class _Worker:
    process: mp.process.BaseProcess
    conn: Connection                # its pipe's end here
    me: int                         # its slot in the beats
    batches: deque = field(default_factory=deque)     # the numbers of those it holds, in order
    since: float = 0.0              # when it was last handed work while it held none


class Decoder:
    """Decode worker processes whose results come out in input order, and that survive dead or
    hung workers.

    Each worker has a pipe of its own and holds at most ``QUEUED`` batches; the parent reads
    whichever result is ready and hands that worker the next batch, so a worker slowed down
    by big images holds up no other: results wait for their turn here. No threads:
    ``concurrent.futures.ProcessPoolExecutor``'s two nearly double the parent's CPU per image
    (``benchmarks/convert/convert_steps.py`` times each step). Forked workers return raw pixels
    through a shared ``Ring`` (the parent's CPU time per image is then one copy, not a pipe read, an
    unpickle and a fresh allocation).
    """

    def __init__(self, workers: int, opts: DecodeOptions):
        self.workers, self.opts = workers, opts
        fork = "fork" in mp.get_all_start_methods()
        self._ctx = mp.get_context("fork" if fork else "spawn")
        self._pool: list[_Worker] = []
        self._beats = None
        self.batch = batch_size(opts.sizes)
        self.ring = (Ring(self.window * self.batch, opts.sizes)
                     if fork and opts.encoding == "raw" else None)
        # untouched until a source hands the workers bytes (it costs no memory before)
        self.inbox = Inbox(self.window, INBOX_BATCH_BYTES) if fork else None

    @property
    def window(self) -> int:
        return WINDOW * self.workers        # batches in flight

    def _start(self, n: int) -> None:
        self.close()
        self._beats = self._ctx.RawArray("d", n)
        with parent_garbage_frozen():       # a notebook's CUDA garbage is not theirs to free
            for me in range(n):
                here, there = self._ctx.Pipe()
                p = self._ctx.Process(target=_worker_main, daemon=True,  # type: ignore[attr-defined]
                                      args=(there, self.opts, self.ring, os.getpid(),
                                            self._beats, me, self.inbox))
                p.start()
                there.close()       # so that the worker's death is an EOF here
                self._pool.append(_Worker(p, here, me))

    def stop(self) -> None:
        """Kill the workers without waiting for them: they exit side by side, while the caller
        goes on (a worker's exit takes a few ms; one after the other, they were the last 7-12
        ms of a 0.8 s conversion)."""
        for w in self._pool:
            if w.process.is_alive():
                w.process.kill()

    def close(self) -> None:
        self.stop()
        for w in self._pool:
            w.process.join()
            w.conn.close()
        self._pool = []

    @staticmethod
    def _send(w: _Worker, number: int, batch) -> None:
        try:
            w.conn.send(batch)
        except OSError:         # its pipe is broken: it died
            raise _WorkerDied("died") from None
        if not w.batches:
            w.since = time.monotonic()
        w.batches.append(number)

    def _collect(self, done: dict) -> None:
        """Wait for results, and file each in ``done`` under its batch's number. A worker that
        has spent more than ``ITEM_TIMEOUT_S`` on one image is hung, whatever its batch's
        size."""
        while True:
            busy = {w.conn: w for w in self._pool if w.batches}
            ready = wait(list(busy), min(POLL_S, ITEM_TIMEOUT_S))
            if ready:
                break
            now = time.monotonic()
            if any(now - max(self._beats[w.me], w.since) > ITEM_TIMEOUT_S  # type: ignore[index]
                   for w in busy.values()):
                raise _WorkerDied("hung")
        for conn in ready:
            try:
                results = conn.recv()  # type: ignore[call-arg,union-attr]
            except (EOFError, OSError):
                raise _WorkerDied("died") from None
            if isinstance(results, Exception):
                raise results
            done[busy[conn].batches.popleft()] = results  # type: ignore[index]

    def _with_payloads(self, results: list[tuple]) -> list[tuple]:
        if self.ring is None:
            return results
        return [(pos, self.ring.get(pos) if error is None else None, crcs, error, shape)
                for pos, _, crcs, error, shape in results]

    def run(self, jobs):
        """``jobs``: iterable of (position, path) → lists of (position, payloads, crc32s,
        error), a batch at a time. Payloads from the ring are views of it that stay as they
        are until the next batch is asked for."""
        self._start(self.workers)
        it = iter(jobs)
        sent: dict[int, list] = {}      # batch number -> its jobs, until its results are out
        done: dict[int, list] = {}      # batch number -> its results, until their turn
        head = 0                        # the number of the next batch out
        while True:
            try:
                while len(sent) < self.window:
                    w = min(self._pool, key=lambda w: len(w.batches))
                    if len(w.batches) == QUEUED:
                        break           # every worker holds enough
                    batch = list(itertools.islice(it, self.batch))
                    if not batch:
                        break
                    number = head + len(sent)
                    sent[number] = batch        # before the send: one that fails is retried
                    self._send(w, number, self._passed(number, batch))
                if not sent:
                    return
                if head not in done:
                    self._collect(done)
                    continue
            except _WorkerDied as e:
                pending = [j for n in sorted(sent) for j in sent[n]]
                sent.clear()
                done.clear()
                log.warning("a decode worker %s; retrying %d images one by one", e, len(pending))
                yield from self._isolate(pending)
                self._start(self.workers)
                continue
            del sent[head]
            results = done.pop(head)
            head += 1
            yield self._with_payloads(results)

    def _passed(self, number: int, batch: list[tuple]) -> list[tuple]:
        """``batch`` as it goes to a worker: its encoded bytes through the ``Inbox`` (where
        there is one: forked workers), else through the pipe (as ``bytes``)."""
        if self.inbox is not None:
            return self.inbox.put(number, batch)
        return [(pos, bytes(item) if isinstance(item, memoryview) else item)
                for pos, item in batch]

    def _isolate(self, jobs):
        for job in jobs:
            self._start(1)
            done: dict[int, list] = {}
            try:
                self._send(self._pool[0], 0, self._passed(0, [job]))
                self._collect(done)
            except _WorkerDied as e:
                yield [(job[0], None, None, f"worker process {e} while decoding this file",
                        None)]
                continue
            yield self._with_payloads(done[0])

#: images a task of ``each_in_processes`` makes the labels of
CHUNK = 64


def each_in_processes(fn, head: tuple, items: list, *, workers: int, what: str,
                      progress: bool = False):
    """Each result of ``fn((*head, chunk))`` (a list, one an item) over ``items`` in chunks of
    ``CHUNK``, in order, in ``workers`` fresh processes (in this one for a single worker),
    under a progress bar named ``what``: the labels a scan reads beside the images.

    Raises:
        ConversionError: a worker process died (``what`` says what it was making).
    """
    import concurrent.futures as cf
    import contextlib

    from tqdm import tqdm

    from fastdata.converters.units import ConversionError

    jobs = ((*head, items[i:i + CHUNK]) for i in range(0, len(items), CHUNK))
    context = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    pool = cf.ProcessPoolExecutor(workers, mp_context=context) if workers > 1 else None
    with tqdm(total=len(items), unit="img", desc=what, disable=not progress,
              dynamic_ncols=True) as bar, pool or contextlib.nullcontext():
        try:
            for chunk in (map if pool is None else pool.map)(fn, jobs):
                yield from chunk
                bar.update(len(chunk))
        except cf.process.BrokenProcessPool:
            raise ConversionError(f"a worker process making {what} died; run the same "
                                  f"command again with --workers 1 to see which input "
                                  f"kills it") from None
