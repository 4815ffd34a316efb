"""The base of field kinds: ``FieldKind``, the name->class registry ``FIELDS`` and how a column
of a shard is held (``Column``: fixed-size values as one array, variable-length ones as one
flat byte payload plus offsets, as JPEG payloads are).

A kind's module holds how its values are parsed from a source's cell, packed into a shard's
column, checked (nothing in a shard is trusted), read back for a batch and collated. The
parameters a kind takes (a dtype, a shape, class names) are what a manifest records of it:
``kind.params()`` writes them, ``field_of(kind, **params)`` reads them back, validated.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import numpy as np

from fastdata.checks import choice

#: kind name -> its class (``register``)
FIELDS: dict[str, type[FieldKind]] = {}

#: the most bytes one variable-length value may hold (a longer one is refused as it is
#: parsed, naming where it came from)
MAX_VALUE_BYTES = 16 << 20


def register(cls: type[FieldKind]) -> type[FieldKind]:
    """Class decorator: ``cls`` is the field kind named ``cls.kind``."""
    FIELDS[cls.kind] = cls
    return cls


def field_of(kind: str, **params) -> FieldKind:
    """The field kind ``kind`` with its parameters (a manifest's, or a user's).

    Raises:
        ValueError: an unknown kind (naming the registered ones) or a bad parameter.
    """
    return FIELDS[choice("kind", kind, sorted(FIELDS))](**params)


class FieldError(ValueError):
    """A value that is not of its field's kind; the message names where it came from."""


@dataclasses.dataclass(frozen=True)
class Column:
    """A field's values in one shard: ``values`` one array (fixed-size kinds: one row per
    sample), or a flat uint8 payload with ``offsets`` (``n + 1`` int64, sample ``k``'s bytes at
    ``values[offsets[k]:offsets[k + 1]]``)."""

    values: np.ndarray
    offsets: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.values) if self.offsets is None else len(self.offsets) - 1


class FieldKind:
    """A kind of field: how a value is parsed, packed into a shard's column, checked, read and
    collated. Subclasses set ``kind`` and ``fixed``, take their parameters keyword-only (each
    validated) and implement ``parse``; a fixed-size kind gives ``dtype`` and ``shape``."""

    kind: ClassVar[str] = ""
    #: one array of ``shape`` per sample (True), or variable-length bytes (False)
    fixed: ClassVar[bool] = True
    #: whether a value moves with its image's pixels (``move``): a geometric kind's
    moves: ClassVar[bool] = False
    #: whether its cells are a file's bytes (a tar member's, or the file a labels file's cell
    #: names, read by the source), not text or JSON
    binary: ClassVar[bool] = False
    dtype: np.dtype = np.dtype(np.float32)
    shape: tuple[int, ...] = ()

    @classmethod
    def from_column(cls, cells: Iterable) -> FieldKind:
        """This kind with the parameters a source's column implies (a class field's names, an
        array's shape), for a column named of this kind (``--field NAME=KIND``); ``cells``: its
        values, an iterable that may be read more than once (none held).

        Raises:
            ValueError: cells that imply no parameters (naming what the kind needs).
        """
        return cls()

    def params(self) -> dict:
        """The parameters a manifest records (JSON values), as ``field_of`` takes them."""
        return {}

    def parse(self, cell: Any, where: str) -> Any:
        """A source's cell (a CSV string, a JSON value, an Arrow scalar's Python value) as
        this kind's value; ``where`` names it in an error (file, row, column).

        Raises:
            FieldError: the cell is not a value of this kind.
        """
        raise NotImplementedError

    # ---- a shard's column ----
    def pack(self, values: Sequence) -> Column:
        """Parsed values, one per sample, as a shard's column."""
        if self.fixed:
            out = np.empty((len(values), *self.shape), self.dtype)
            for k, v in enumerate(values):
                out[k] = v
            return Column(out)
        blobs = [self.to_bytes(v) for v in values]
        offsets = np.zeros(len(blobs) + 1, np.int64)
        np.cumsum([len(b) for b in blobs], out=offsets[1:])
        return Column(np.frombuffer(b"".join(blobs), np.uint8).copy(), offsets)

    def check(self, column: Column, count: int, where: str) -> None:
        """Refuse a stored column that is not ``count`` values of this kind (a shard is never
        trusted): its dtype, shape, offsets and, for variable-length kinds, each value.

        Raises:
            FieldError: naming ``where`` and what is wrong.
        """
        self.check_layout(column, count, where)
        o = column.offsets
        if o is not None:
            for k in range(count):
                self.from_bytes(column.values[o[k]:o[k + 1]].tobytes(), f"{where}, value {k}")

    def check_layout(self, column: Column, count: int, where: str) -> None:
        """``check`` of the column's dtype, shape and offsets only: what a reader checks as a
        shard opens (a variable-length value is checked as it is read).

        Raises:
            FieldError: naming ``where`` and what is wrong.
        """
        if self.fixed:
            want = (count, *self.shape)
            if column.offsets is not None or column.values.shape != want or \
                    column.values.dtype != self.dtype:
                raise FieldError(f"{where}: {column.values.dtype} values of shape "
                                 f"{column.values.shape}, not {self.dtype} {want}")
            return
        o = column.offsets
        if o is None or o.dtype != np.int64 or o.shape != (count + 1,) or o[0] != 0 or \
                o[-1] != len(column.values) or np.any(np.diff(o) < 0):
            raise FieldError(f"{where}: its offsets do not cut its {len(column.values)} bytes "
                             f"into {count} values")

    def read(self, column: Column, local: np.ndarray) -> list | np.ndarray:
        """The values of samples ``local`` (indices into the column)."""
        if self.fixed:
            return column.values[local]
        o, v = column.offsets, column.values
        if o is None:
            raise FieldError(f"a {self.kind} column without offsets")
        local = np.asarray(local, np.int64)
        data = np.ascontiguousarray(v).data
        values: list = []
        try:
            for a, b in zip(o[local].tolist(), o[local + 1].tolist()):
                values.append(self.from_bytes(data[a:b].tobytes(), "a value"))
        except FieldError:      # read again naming the value (a name made per value costs)
            k = int(local[len(values)])
            self.from_bytes(data[o[k]:o[k + 1]].tobytes(), f"value {k}")
            raise
        return values

    def collate(self, values: list | np.ndarray):
        """A batch of values as the loader yields it: a tensor for fixed-size kinds, else a
        list."""
        if self.fixed:
            import torch

            values = np.ascontiguousarray(values)
            if not values.flags.writeable or any(st < 0 for st in values.strides):
                values = values.copy()      # torch takes neither a read-only nor a reversed view
            return torch.from_numpy(values)
        return list(values)

    # ---- variable-length kinds ----
    def to_bytes(self, value) -> bytes:
        """A parsed value as the bytes its column stores."""
        raise NotImplementedError

    def from_bytes(self, data: bytes, where: str):
        """The value of stored ``data``.

        Raises:
            FieldError: ``data`` is not a value of this kind (naming ``where``).
        """
        raise NotImplementedError

    def instances(self, value) -> int | None:
        """How many instances a value holds that a fit may cut away whole (boxes); None for
        a kind whose values are not such instances."""
        return None

    def place(self, value, at: tuple[float, float, float, float]):
        """A moving kind's value given over the whole picture (as a source gives it), placed
        on the stored square that the conversion's fit made of the picture: a point at
        fractions ``(x, y)`` of the picture lands at ``(x * sx + ox, y * sy + oy)`` of the
        square (``at``: ``sx, sy, ox, oy``); what lands off the square is cut away. Every
        other kind's value is as it is."""
        return value

    def move(self, value, crop, flip: bool, stored: int, out: int):
        """One sample's value as its image is cropped (top, left, h, w in stored pixels of a
        square of side ``stored``) to ``out`` pixels and flipped: a geometric kind's moves
        with the pixels (those whose ``moves`` is True); every other kind's passes through as
        it is."""
        return value

    def move_batch(self, values: Sequence | np.ndarray, crops: np.ndarray, flips: np.ndarray,
                   stored: int, out: int) -> list:
        """A batch's values through their images' crops (``(B, 4)``: top, left, h, w) and
        flips (``(B,)``): ``move`` of each (a geometric kind may move them all at once)."""
        return [self.move(v, c, bool(f), stored, out) for v, c, f in zip(values, crops, flips)]

    def read_moved(self, column: Column, local, crops: np.ndarray, flips: np.ndarray,
                   stored: int, out: int) -> list:
        """``move_batch`` of the values of samples ``local`` (a kind may move them straight
        from their stored bytes)."""
        return self.move_batch(self.read(column, local), crops, flips, stored, out)

    def describe(self, column: Column) -> str:
        """A line for ``fastdata info``: the kind, its parameters, and what its values hold."""
        extra = ", ".join(f"{k}={v}" for k, v in self.params().items() if k != "classes")
        if self.fixed:
            return f"{self.kind}{f' ({extra})' if extra else ''}"
        return f"{self.kind}{f' ({extra})' if extra else ''}: {spread(column, 1, 'bytes')}"

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other.params() == self.params()

    def __hash__(self) -> int:
        return hash((self.kind, repr(self.params())))


def records(column: Column, local, per: int, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """The values of samples ``local`` of a column whose values are runs of ``per``-byte
    records (boxes, people's points), joined, and how many records each holds: a batch's
    values read and checked in one piece.

    Raises:
        FieldError: a value that is not whole records, or longer than ``limit`` bytes.
    """
    o, v = column.offsets, column.values
    if o is None:
        raise FieldError("a column of records without offsets")
    local = np.asarray(local, np.int64)
    starts, ends = o[local], o[local + 1]
    lengths = ends - starts
    if len(lengths) and (lengths.max() > limit or (lengths % per).any()):
        raise FieldError(f"a value that is not whole {per}-byte records, or more than "
                         f"{limit:,} bytes")
    parts = [v[a:b] for a, b in zip(starts.tolist(), ends.tolist())]
    return (np.concatenate(parts) if parts else np.zeros(0, np.uint8)), lengths // per


def spread(column: Column, per: int, unit: str) -> str:
    """What a variable-length column's values hold, for ``describe``: the least, most and mean
    number of ``unit`` (``per`` bytes each) a value."""
    n = np.diff(column.offsets) // per if column.offsets is not None else np.zeros(0)
    if not len(n):
        return "no values"
    mean = f"{n.mean():.0f}" if per == 1 else f"{n.mean():.1f}"
    return f"{int(n.min())}-{int(n.max())} {unit}, mean {mean}"


def class_names(classes) -> list[str]:
    """``classes`` checked as a kind's class names: a non-empty list of distinct strings.

    Raises:
        ValueError: no class, a name that is not a string, or the same name twice.
    """
    names = list(classes) if isinstance(classes, (list, tuple)) else None
    if not names or not all(isinstance(c, str) for c in names):
        raise ValueError(f"classes={classes!r} is not valid; give a list of class names")
    if len(set(names)) != len(names):
        raise ValueError(f"classes={classes!r} names a class twice")
    return names


def limited(data: bytes, where: str, limit: int = MAX_VALUE_BYTES) -> bytes:
    """``data``, refused where longer than ``limit`` bytes."""
    check_bytes(len(data), where, limit)
    return data


def check_bytes(nbytes: int, where: str, limit: int = MAX_VALUE_BYTES) -> None:
    """Refuse a value of ``nbytes`` bytes where that is more than ``limit``."""
    if nbytes > limit:
        raise FieldError(f"{where}: a value of {nbytes:,} bytes, more than the "
                         f"{limit:,} a field's value may hold")
