"""How a remote set's shards come and go in a pass: fetched ahead in the order the pass reads
them (``Prefetch``), and let go once read (``OpenShards``), so that a set larger than its
node's cache streams through it."""
from __future__ import annotations

import contextlib
import os
import threading

import numpy as np

from fastdata.shards.reader import ShardReader


class OpenShards:
    """A remote set's open readers in this process: once more than ``budget`` bytes of their
    shards are open, the least recently read ones that no read is using are closed and marked
    first to evict, so that the cache can make room (an open reader holds its shard). In a
    windowed shuffle those are the shards of finished windows."""

    def __init__(self, readers: list[ShardReader], sizes: list[int], budget: int):
        self.readers, self.sizes, self.budget = readers, sizes, budget
        self._fresh()

    def _fresh(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._in_use: dict[int, int] = {}
        self._last: dict[int, int] = {}
        self._clock = 0

    def __getstate__(self):
        return {"readers": self.readers, "sizes": self.sizes, "budget": self.budget}

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
        try:
            yield
        finally:
            with self._lock:
                for sh in shards:
                    self._in_use[sh] -= 1
                self._trim()

    def _trim(self) -> None:
        open_ = [sh for sh in self._last if self.readers[sh].is_open]
        total = sum(self.sizes[sh] for sh in open_)
        for sh in sorted(open_, key=self._last.__getitem__):
            if total <= self.budget:
                return
            if self._in_use.get(sh):
                continue
            reader = self.readers[sh]
            reader.close()
            reader.fetch.cache.retire(reader.fetch.key)  # type: ignore[union-attr]
            total -= self.sizes[sh]


class Prefetch:
    """A remote set's shards fetched in the background, ``in_flight`` at a time, in the order
    a pass (the shard of each of its samples: ``shard``) first reads them
    (``ShardSet.prefetch``); ``advance(n)`` says the pass has consumed its first ``n`` samples,
    ``stop()`` cancels what has not started."""

    def __init__(self, readers: list[ShardReader], entries: list[dict], shard: np.ndarray,
                 in_flight: int):
        import concurrent.futures as cf

        _, first = np.unique(shard, return_index=True)
        last = len(shard) - 1 - np.unique(shard[::-1], return_index=True)[1]
        self._seq = shard[np.sort(first)].tolist()
        self._last = dict(zip(np.unique(shard).tolist(), last.tolist()))
        self._bytes = [e["bytes"] for e in entries]
        self._limit = readers[0].fetch.cache.limit if readers else None  # type: ignore[union-attr]
        self._readers, self._consumed, self._stopped = readers, 0, False
        self._cond = threading.Condition()
        self._pool = cf.ThreadPoolExecutor(in_flight, thread_name_prefix="fastdata-fetch")
        threading.Thread(target=self._run, daemon=True, name="fastdata-prefetch").start()

    def _room(self, i: int) -> bool:
        """Whether shard ``_seq[i]`` fits the limit beside the earlier ones still to read."""
        if self._limit is None:
            return True
        need = sum(self._bytes[sh] for sh in self._seq[:i + 1]
                   if self._last[sh] >= self._consumed)
        return 2 * need <= self._limit or need == self._bytes[self._seq[i]]

    def _run(self) -> None:
        for i, sh in enumerate(self._seq):
            with self._cond:
                self._cond.wait_for(lambda: self._stopped or self._room(i))  # noqa: B023
                if self._stopped:
                    return
                self._pool.submit(self._readers[sh].fetch)

    def advance(self, n: int) -> None:
        """The pass has consumed its first ``n`` samples: their shards' room may be reused."""
        with self._cond:
            self._consumed = n
            self._cond.notify()

    def stop(self) -> None:
        """Cancel the fetches that have not started."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._pool.shutdown(wait=False, cancel_futures=True)
