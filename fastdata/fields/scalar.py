"""``float``: a number, or a fixed-length vector of numbers, per sample (float32): regression
targets, scores, a caption's similarity."""
from __future__ import annotations

import json
import math

import numpy as np

from fastdata.checks import integer
from fastdata.fields.base import FieldError, FieldKind, register
from fastdata.fields.cells import json_cell


@register
class FloatField(FieldKind):
    """A number per sample (``length=None``) or ``length`` of them (a JSON list, or numbers
    separated by spaces).

    Args:
        length: the vector's length, or None for a scalar.

    Raises:
        ValueError: a length below 1.
    """

    kind = "float"
    dtype = np.dtype(np.float32)

    def __init__(self, *, length: int | None = None):
        self.length = integer("length", length, 1, optional=True)
        self.shape = () if self.length is None else (self.length,)

    @classmethod
    def from_column(cls, cells) -> FloatField:
        """Of the first list's length where the cells are lists (or strings of several
        numbers, all of them), else a scalar."""
        first, words = None, None
        for v in map(json_cell, cells):
            if isinstance(v, list):
                return cls(length=len(v))
            if words is not False:
                words = isinstance(v, str) and len(v.split()) > 1
                first = v.split() if words and first is None else first
        return cls(length=len(first)) if words and first else cls()

    def params(self) -> dict:
        return {} if self.length is None else {"length": self.length}

    def parse(self, cell, where: str):
        values = _numbers(cell, where)
        if self.length is None:
            if len(values) != 1:
                raise FieldError(f"{where}: {len(values)} numbers, not one")
            return values[0]
        if len(values) != self.length:
            raise FieldError(f"{where}: {len(values)} numbers, not {self.length}")
        return np.asarray(values, np.float32)

    def check(self, column, count: int, where: str) -> None:
        super().check(column, count, where)
        if not np.isfinite(column.values).all():
            raise FieldError(f"{where}: values that are not finite numbers")


def _numbers(cell, where: str) -> list[float]:
    """A cell's numbers: a number, a JSON list of them, or numbers separated by spaces."""
    if isinstance(cell, str):
        text = cell.strip()
        try:
            cell = json.loads(text) if text.startswith("[") else [float(t) for t in text.split()]
        except ValueError:
            raise FieldError(f"{where}: {text[:40]!r} is not a number or a list of "
                             f"numbers") from None
    values = cell if isinstance(cell, (list, tuple, np.ndarray)) else [cell]
    try:
        out = [float(v) for v in values]
    except (TypeError, ValueError):
        raise FieldError(f"{where}: {str(cell)[:40]!r} is not a list of numbers") from None
    if not all(math.isfinite(v) for v in out):
        raise FieldError(f"{where}: {str(cell)[:40]!r} holds a value that is not finite")
    return out
