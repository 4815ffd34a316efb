"""How a remote set's shards come and go in a pass: fetched ahead in the order the pass reads
them (``FetchAhead``), and let go once read (``OpenShards``), so that a set larger than its
node's cache streams through it."""
from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable

import numpy as np

from fastdata.shards.reader import ShardReader


class OpenShards:
    """A remote set's open readers in this process (an open reader holds its shard in the
    cache). Once more than ``limit / 2 / processes`` bytes of shards are open (``processes``:
    how many processes of the node read the set), the least recently read ones that no read
    is using are closed, so that the cache can evict them in its least-recently-used order; a
    shard the pass is done with (``finish``) is closed and made the first to evict."""

    def __init__(self, readers: list[ShardReader], sizes: list[int], limit: int):
        self.readers, self.sizes, self.limit = readers, sizes, limit
        self.processes = 1
        self._fresh()

    @property
    def budget(self) -> int:
        """The bytes of shards this process keeps open at most (one shard at least)."""
        return max(self.limit // 2 // max(1, self.processes), max(self.sizes, default=0))

    def _fresh(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._in_use: dict[int, int] = {}
        self._last: dict[int, int] = {}
        self._done: set[int] = set()
        self._clock = 0

    def __getstate__(self):
        return {"readers": self.readers, "sizes": self.sizes, "limit": self.limit,
                "processes": self.processes}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._fresh()

    @contextlib.contextmanager
    def using(self, shards):
        if self._pid != os.getpid():        # a forked child: its own readers, a fresh lock
            self._fresh()
        with self._lock:
            self._clock += 1
            for sh in shards:
                self._in_use[sh] = self._in_use.get(sh, 0) + 1
                self._last[sh] = self._clock
                self._done.discard(sh)
        try:
            yield
        finally:
            with self._lock:
                for sh in shards:
                    self._in_use[sh] -= 1
                    if sh in self._done and not self._in_use[sh]:
                        self._let_go(sh, retire=True)
                self._trim()

    def finish(self, sh: int) -> None:
        """The pass has read shard ``sh`` for the last time: closed (once no read is using
        it) and made the first to evict."""
        if self._pid != os.getpid():
            return
        with self._lock:
            if self._in_use.get(sh):
                self._done.add(sh)
            else:
                self._let_go(sh, retire=True)

    def _let_go(self, sh: int, retire: bool) -> None:
        """Close shard ``sh``'s reader in this process; with ``retire``, make it the first to
        evict (the pass is done with it, whichever process read it)."""
        reader = self.readers[sh]
        self._done.discard(sh)
        if reader.is_open:
            reader.close()
        if retire:
            reader.fetch.cache.retire(reader.fetch.key)  # type: ignore[union-attr]

    def _trim(self) -> None:
        open_ = [sh for sh in self._last if self.readers[sh].is_open]
        total, budget = sum(self.sizes[sh] for sh in open_), self.budget
        for sh in sorted(open_, key=self._last.__getitem__):
            if total <= budget:
                return
            if not self._in_use.get(sh):
                self._let_go(sh, retire=False)
                total -= self.sizes[sh]


#: the bytes a fetch-ahead keeps in flight, about: enough to fill a link whose round trip is long
#: beside the time a shard takes to arrive (small shards), few downloads of large ones
IN_FLIGHT_BYTES = 64 << 20


class FetchAhead:
    """A remote set's shards fetched in the background in the order a pass (the shard of each
    of its samples: ``shard``) first reads them (``ShardSet.fetch_ahead``): 2 at a time until the
    pass's first batch is consumed (those shards get the link's bandwidth), then ``in_flight``
    (default: as many as make ``IN_FLIGHT_BYTES``, 2 to 8). With a ``cache_limit``, the pass
    plans on its ``share``-th of it (the passes of the node that read other shards into the
    same cache). ``advance(n)`` says the pass has consumed its first ``n`` samples, ``stop()``
    cancels what has not started."""

    def __init__(self, readers: list[ShardReader], entries: list[dict], shard: np.ndarray,
                 in_flight: int | None = None, finished: Callable[[int], None] | None = None,
                 share: int = 1):
        import concurrent.futures as cf

        ids, first = np.unique(shard, return_index=True)
        last = len(shard) - 1 - np.unique(shard[::-1], return_index=True)[1]
        self._seq = shard[np.sort(first)].tolist()
        self._first = dict(zip(ids.tolist(), first.tolist()))
        self._last = dict(zip(ids.tolist(), last.tolist()))
        # the shards in the order the pass reads them for the last time: each ``finished``
        # once the pass has consumed past it
        self._ends = sorted(self._last, key=self._last.__getitem__)
        self._finished, self._ended = finished, 0
        self._bytes = [e["bytes"] for e in entries]
        self._largest = max(self._bytes, default=0)
        if in_flight is None:
            typical = int(np.median([self._bytes[sh] for sh in self._seq] or [1]))
            in_flight = max(2, min(8, -(-IN_FLIGHT_BYTES // max(1, typical))))
        self._most, self._running = in_flight, 0
        limit = readers[0].fetch.cache.limit if readers else None  # type: ignore[union-attr]
        self._limit = None if limit is None else limit // share     # this pass's share
        self._readers, self._consumed, self._stopped = readers, 0, False
        self._cond = threading.Condition()
        self._pool = cf.ThreadPoolExecutor(in_flight, thread_name_prefix="fastdata-fetch")
        threading.Thread(target=self._run, daemon=True, name="fastdata-fetch-ahead").start()

    def _room(self, i: int) -> bool:
        """Whether shard ``_seq[i]`` fits the half of the limit that is the fetch-ahead's beside
        the earlier ones the pass has not begun to read (the other half holds the shards being
        read: ``OpenShards``' budget), with room for one more shard beside all those the pass
        still has to read (a reader's own fetch, which makes room by evicting)."""
        if self._limit is None:
            return True
        todo = [sh for sh in self._seq[:i + 1] if self._last[sh] >= self._consumed]
        need = sum(self._bytes[sh] for sh in todo)
        ahead = sum(self._bytes[sh] for sh in todo if self._first[sh] >= self._consumed)
        if need == self._bytes[self._seq[i]]:       # the only one: it goes, whatever its size
            return True
        return 2 * ahead <= self._limit and need + self._largest <= self._limit

    def _go(self, i: int) -> bool:
        """Whether shard ``_seq[i]``'s fetch may start now."""
        most = self._most if self._consumed else min(2, self._most)
        return self._running < most and self._room(i)

    def _run(self) -> None:
        for i, sh in enumerate(self._seq):
            with self._cond:
                self._cond.wait_for(lambda: self._stopped or self._go(i))  # noqa: B023
                if self._stopped:
                    return
                self._running += 1
                self._pool.submit(self._readers[sh].fetch).add_done_callback(self._ended_one)

    def _ended_one(self, _) -> None:
        with self._cond:        # (reentrant: a fetch that ended at once calls back here)
            self._running -= 1
            self._cond.notify()

    def advance(self, n: int) -> None:
        """The pass has consumed its first ``n`` samples: their shards' room may be reused."""
        with self._cond:
            self._consumed = n
            self._cond.notify()
        while self._ended < len(self._ends) and self._last[self._ends[self._ended]] < n:
            if self._finished is not None:
                self._finished(self._ends[self._ended])
            self._ended += 1

    def stop(self) -> None:
        """Cancel the fetches that have not started."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._pool.shutdown(wait=False, cancel_futures=True)
