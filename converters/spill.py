"""What a conversion keeps in temporary files instead of in memory, so that its memory does
not grow with the number of samples: ``Packed`` byte strings and ``Spilled`` fixed-size
records, each appended in order and read back a block at a time (unlinked files in
``TMPDIR``, gone with the process)."""
from __future__ import annotations

import array
import itertools
import os
import tempfile

import numpy as np

#: records a block read brings in
BLOCK = 1 << 14


class Packed:
    """Byte strings appended in order and packed in two unlinked temporary files (their bytes,
    where each ends), read back a block at a time: a list whose memory does not grow with its
    length. Appends gather in memory and go to the files ``PENDING`` at a time; ``block(a,
    b)`` costs three reads."""

    PENDING = 1 << 12

    def __init__(self):
        self._bytes, self._ends = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        self._n = self._nbytes = 0
        self._pending: list[bytes] = []

    def append(self, blobs: list[bytes]) -> None:
        self._pending += blobs
        self._n += len(blobs)
        if len(self._pending) >= self.PENDING:
            self.flush()

    def flush(self) -> Packed:
        """Write what is pending (before a read)."""
        if self._pending:
            self._bytes.write(b"".join(self._pending))
            self._ends.write(array.array("q", itertools.accumulate(
                map(len, self._pending), initial=self._nbytes))[1:].tobytes())
            self._nbytes += sum(map(len, self._pending))
            self._pending = []
        for f in (self._bytes, self._ends):
            f.flush()
        return self

    def __len__(self) -> int:
        return self._n

    def block(self, a: int, b: int) -> list[bytes]:
        """Entries ``a`` to ``b - 1``."""
        b = min(b, self._n)
        if a >= b:
            return []
        if self._pending:
            self.flush()
        ends = np.frombuffer(os.pread(self._ends.fileno(), 8 * (b - a), 8 * a), np.int64)
        start = 0 if a == 0 else int(np.frombuffer(os.pread(self._ends.fileno(), 8,
                                                            8 * (a - 1)), np.int64)[0])
        blob = os.pread(self._bytes.fileno(), int(ends[-1]) - start, start)
        cuts = [0, *(ends - start).tolist()]
        return [blob[cuts[k]:cuts[k + 1]] for k in range(b - a)]

    def iter_from(self, first: int, block: int = BLOCK):
        for a in range(first, self._n, block):
            yield from self.block(a, a + block)

    def hash_into(self, h) -> None:
        """Every entry into the hash ``h`` (their bytes, then where each ends)."""
        self.flush()
        for f in (self._bytes, self._ends):
            for at in range(0, os.fstat(f.fileno()).st_size, 1 << 20):
                h.update(os.pread(f.fileno(), 1 << 20, at))


class Spilled:
    """Fixed-size records (each ``shape`` of ``dtype``) appended in order to an unlinked
    temporary file and read back a block at a time: an array whose memory does not grow with
    its length."""

    def __init__(self, dtype, shape: tuple = ()):
        self.dtype, self.shape = np.dtype(dtype), tuple(shape)
        self.itemsize = self.dtype.itemsize * int(np.prod(self.shape, dtype=np.int64))
        self._file = tempfile.TemporaryFile()
        self._n = 0
        self._pending: list = []        # records not yet written, as they were given

    def append(self, values) -> None:
        """Records ``values`` (a sequence of them: numbers, tuples, or an array of ``(k,
        *shape)``)."""
        self._pending.extend(values)
        self._n += len(values)
        if len(self._pending) >= BLOCK:
            self.flush()

    def flush(self) -> Spilled:
        if self._pending:
            self._file.write(np.asarray(self._pending, self.dtype).reshape(
                -1, *self.shape).tobytes())
            self._pending = []
        self._file.flush()
        return self

    def __len__(self) -> int:
        return self._n

    def block(self, a: int, b: int) -> np.ndarray:
        """Records ``a`` to ``b - 1``, as an array."""
        b = min(b, self._n)
        if a >= b:
            return np.zeros((0, *self.shape), self.dtype)
        if self._pending:
            self.flush()
        data = os.pread(self._file.fileno(), (b - a) * self.itemsize, a * self.itemsize)
        return np.frombuffer(data, self.dtype).reshape(b - a, *self.shape)

    def blocks(self, block: int = BLOCK):
        """``(first, records)`` a block at a time."""
        for a in range(0, self._n, block):
            yield a, self.block(a, a + block)

    def hash_into(self, h) -> None:
        """Every record's bytes into the hash ``h``."""
        for _, records in self.blocks():
            h.update(records.tobytes())


def blocks_of(values):
    """An array's values, or a ``Spilled``'s records, a block at a time."""
    if isinstance(values, Spilled):
        for _, block in values.blocks():
            yield block
        return
    values = np.asarray(values)
    for a in range(0, len(values), BLOCK):
        yield values[a:a + BLOCK]


def select(records: Spilled, rows) -> Spilled:
    """The records at ``rows`` (ascending positions: an array, or a ``Spilled`` of them) of
    ``records``, read in one pass."""
    out = Spilled(records.dtype, records.shape)
    for positions in blocks_of(rows):
        if not len(positions):
            continue
        lo, hi = int(positions[0]), int(positions[-1]) + 1
        for a in range(lo, hi, BLOCK):     # the records the block's positions span
            span = records.block(a, min(hi, a + BLOCK))
            inside = positions[(positions >= a) & (positions < a + len(span))]
            out.append(span[inside - a])
    return out


def merged(items, rows):
    """``(position, item)`` of the items (any iterable, in order) at ``rows`` (ascending
    positions: an array, a ``Spilled`` of them, or None for all)."""
    if rows is None:
        yield from enumerate(items)
        return
    wanted = (int(r) for block in blocks_of(rows) for r in block.tolist())
    want = next(wanted, None)
    for position, item in enumerate(items):
        if want is None:
            return
        if position == want:
            yield position, item
            want = next(wanted, None)
