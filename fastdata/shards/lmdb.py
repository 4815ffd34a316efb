"""LMDB shards: one environment per file per process, shared by every reader of the file
(LMDB and py-lmdb allow no more), read-only and without locks."""
from __future__ import annotations

import os

import numpy as np

from fastdata.fields import Column
from fastdata.format import (
    LMDB_LABELS,
    LMDB_META,
    PAGE,
    ShardFormatError,
    lmdb_crc_key,
    lmdb_field_key,
    lmdb_key,
)
from fastdata.shards import reader as _reader
from fastdata.shards.mapped import address, guard, mapped_ranges, unguard, will_need
from fastdata.shards.reader import ShardReader, register

# LMDB (and py-lmdb's guard) allow one env per file per process: readers of one file share it.
# (dev, inode) -> [pid, env, users, end, guards]. An entry made before a fork is the parent's:
# the child closes its inherited copy (munmap/close of the child's own mapping and fds) and
# reopens. Changed only under ``reader.OPEN_LOCK``.
_LMDB_ENVS: dict[tuple, list] = {}


# Keys whose reader was garbage collected. The collector runs in any thread, even inside an open
# of another shard (lock held, registry half read): it only appends here; opens and closes drain.
_LMDB_COLLECTED: list[tuple] = []


def _release_env(key: tuple) -> None:
    """One user fewer of the file's env; the last one closes it. Under ``reader.OPEN_LOCK``."""
    entry = _LMDB_ENVS.get(key)
    if entry is not None and entry[0] == os.getpid():
        entry[2] -= 1
        if entry[2] == 0:
            del _LMDB_ENVS[key]
            entry[1].close()
            for slot in entry[4]:
                unguard(slot)


def _release_collected() -> None:
    while _LMDB_COLLECTED:
        _release_env(_LMDB_COLLECTED.pop())


@register
class LMDBShardReader(ShardReader):
    container = "lmdb"

    def _open(self, fd):
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        _release_collected()
        entry = _LMDB_ENVS.get(key)
        if entry is not None and entry[0] != os.getpid():
            entry[1].close()
            entry = None
        if entry is None:
            entry = _LMDB_ENVS[key] = self._new_env(st)
        entry[2] += 1
        env = entry[1]
        try:
            with env.begin() as txn:
                meta = self._meta(_value(txn, LMDB_META))
                labels = _array(txn, LMDB_LABELS, np.int64)
                crcs = {s: _array(txn, lmdb_crc_key(s), np.uint32) for s in self.sizes}
                columns = {name: _column(txn, name, kind, self.count)
                           for name, kind in self.fields.items()}
            # where each raw value lies in this process's map of the file, once read (0: not yet)
            where = {s: np.zeros(self.count, np.int64) for s in self.sizes}
            return self._with_records({"env": env, "key": key, "where": where, "end": entry[3]},
                                      fd, meta, labels, crcs, columns)
        except BaseException:
            _release_env(key)
            raise

    def _new_env(self, st: os.stat_result) -> list:
        import lmdb

        if not st.st_size:
            raise OSError("empty file (0 bytes)")
        try:
            env = lmdb.open(self.path, subdir=False, readonly=True, lock=False,
                            readahead=self.readahead, max_readers=1024)
        except lmdb.Error as e:         # not an OSError: callers catch that for damage
            raise OSError(str(e).removeprefix(f"{self.path}: ")) from e
        # reading a page past a truncated file's end through the map is SIGBUS: refuse it
        end = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        if st.st_size < end:
            env.close()
            raise OSError(f"truncated: {st.st_size} bytes, its last page ends at {end}")
        # LMDB does not say where it mapped the file: the process's map list does
        return [os.getpid(), env, 0, end, [guard(lo, hi - lo) for lo, hi in mapped_ranges(st)]]

    def close(self):
        with _reader.OPEN_LOCK:
            _release_collected()
            if self._h is not None and self._pid == os.getpid():
                _release_env(self._h["key"])
            super().close()

    def __del__(self):
        try:        # at interpreter exit, modules (contextlib among them) may be gone
            if self._h is not None and self._pid == os.getpid():
                _LMDB_COLLECTED.append(self._h["key"])
            ShardReader.close(self)
        except Exception:  # noqa: BLE001, S110 - nothing left to tell
            pass

    def payload(self, size, i):
        with self.h["env"].begin() as txn:
            return self._get(txn, size, i)

    def _get(self, txn, size: int, i: int):
        """Sample ``i``'s value; a damaged page is an OSError naming the shard (py-lmdb raises
        its own errors, which are not)."""
        import lmdb

        try:
            v = txn.get(lmdb_key(size, i))
        except lmdb.Error as e:
            self.check_intact()         # a file cut short under the map says so first
            raise OSError(f"{self.path}: sample {i} at size {size} cannot be read ({e}); check "
                          f"the set with `fastdata verify`") from None
        if v is None:
            raise OSError(f"{self.path}: sample {i} at size {size} is missing")
        return v

    def read_raw(self, size, local, out, rows):
        order = np.argsort(local, kind="stable")
        with self.h["env"].begin(buffers=True) as txn:     # one transaction per shard
            for r, v in zip(rows[order].tolist(), self._values(txn, size, local[order])):
                out[r] = v

    def raw_views(self, size, local, hold):
        # a value lives as long as its transaction: ``hold`` keeps it open
        return list(self._values(hold.enter_context(self.h["env"].begin(buffers=True)), size,
                                 local))

    def _values(self, txn, size, local):
        """Where nothing reads ahead, the pages of the values are asked for at once first.
        py-lmdb's ``get`` touches every page of a value before it returns, one 4 KiB fault at
        a time, so only reads say where values lie: an earlier read of the value, or of the
        values around it (``_places``)."""
        where = None if self.readahead else self.h["where"][size]
        if where is not None:
            will_need(_places(where, local, size * size * 3))
        for i in local.tolist():
            v = self._get(txn, size, i)
            if len(v) != 3 * size * size:
                raise OSError(f"{self.path}: sample {i} at size {size} is {len(v)} bytes, not "
                              f"{3 * size * size}; check the set with `fastdata verify`")
            v = np.frombuffer(v, np.uint8).reshape(size, size, 3)
            if where is not None:
                where[i] = address(v)
            yield v


def _value(txn, key: bytes) -> bytes:
    v = txn.get(key)
    if v is None:
        raise ShardFormatError(f"record {key.decode()} is missing")
    return v


def _array(txn, key: bytes, dtype) -> np.ndarray:
    v = _value(txn, key)
    if len(v) % np.dtype(dtype).itemsize:
        raise ShardFormatError(f"record {key.decode()} is {len(v)} bytes, not a whole number "
                               f"of {np.dtype(dtype)}")
    return np.frombuffer(v, dtype)


def _column(txn, name: str, kind, count) -> Column:
    """Field ``name``'s column, copied out of its transaction (shaped where its bytes fit the
    kind's shape: the reader checks it)."""
    if not kind.fixed:
        return Column(_array(txn, lmdb_field_key(name, "values"), np.uint8),
                      _array(txn, lmdb_field_key(name, "offsets"), np.int64))
    values = _array(txn, lmdb_field_key(name, "values"), kind.dtype)
    shape = (count, *kind.shape)
    return Column(values.reshape(shape) if values.size == int(np.prod(shape)) else values)


def _places(where: np.ndarray, local: np.ndarray, nbytes: int) -> list:
    """``(address, bytes)`` spans that hold the raw LMDB values ``local`` of ``nbytes``, from
    ``where`` (each value's address once read, else 0): exact for a value read before; else
    guessed from the nearest value below it that was read, since a shard's values lie in key
    order, each the same number of pages after the one before (its sizes together), with a
    tree page between now and then (a small share of the steps): a span
    from the smallest step seen between read values, widened by the largest, at most twice
    the value. A wrong guess costs those bytes; an address outside the map is refused."""
    at = where[local]
    spans = [(a, nbytes) for a in at[at != 0].tolist()]
    todo = local[at == 0]
    known = np.flatnonzero(where) if len(todo) else todo
    if len(known) > 1:
        steps = np.diff(where[known]) // np.diff(known)
        lo, hi = int(steps.min()) // PAGE * PAGE, int(steps.max())
        below = np.searchsorted(known, todo) - 1
        ok = below >= 0
        if lo > 0 and ok.any():
            j = known[below[ok]]
            d = todo[ok] - j
            spans += zip((where[j] + d * lo).tolist(),
                         (nbytes + PAGE + np.minimum(d * (hi - lo), nbytes)).tolist())
    return spans
