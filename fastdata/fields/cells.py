"""A source's cells as the kinds read them: a CSV string that holds JSON as its value, whether a
cell is a number, and what one pass over a column finds (``Stats``)."""
from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable

_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def json_cell(cell):
    """A cell as a JSON value where it is one (a CSV cell holds text), else the cell."""
    if isinstance(cell, str) and cell.strip()[:1] in ("[", "{"):
        try:
            return json.loads(cell)
        except ValueError:
            return cell
    return cell


def numbers(values) -> bool:
    """Whether ``values`` is a list of numbers (no booleans)."""
    return isinstance(values, list) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def number(v) -> bool:
    """Whether a cell is one number (a JSON number, or a CSV string that reads as one)."""
    if isinstance(v, str):
        return _NUMBER.fullmatch(v.strip()) is not None
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def shape_of(value) -> tuple[int, ...]:
    """The shape of a nested list (its first elements' lengths)."""
    shape = []
    while isinstance(value, list) and value:
        shape.append(len(value))
        value = value[0]
    return tuple(shape)


def token_dtype(lo: int, hi: int) -> str:
    """The smallest of the tokens kind's dtypes that holds every integer from ``lo`` to
    ``hi``."""
    if lo >= 0 and hi < 1 << 16:
        return "uint16"
    return "int32" if -(1 << 31) <= lo and hi < 1 << 31 else "int64"


class Stats:
    """What one pass over a column's cells finds: how many are objects, lists, numbers; of
    the lists, whether all are of numbers, of integers, their lengths and the integers'
    range."""

    def __init__(self, cells: Iterable):
        self.n = self.dicts = self.lists = self.numbers = 0
        self.numeric = self.integers = True
        self.lengths: Counter = Counter()
        self.lo = self.hi = 0
        for cell in cells:
            self._see(json_cell(cell))

    def _see(self, v) -> None:
        self.n += 1
        if isinstance(v, dict):
            self.dicts += 1
        elif isinstance(v, list):
            self.lists += 1
            self.lengths[len(v)] += 1
            self.numeric = self.numeric and numbers(v)
            ints = [x for x in v if isinstance(x, int)]
            self.integers = self.integers and len(ints) == len(v)
            if ints:
                self.lo, self.hi = min(self.lo, *ints), max(self.hi, *ints)
        elif number(v):
            self.numbers += 1
