"""Which kind a source's column is, when no one says (``--field NAME=KIND`` says it): a
``label`` or ``class`` column is a class per sample; numbers are ``float``; JSON arrays of
numbers of one length are an ``array``, of integers of varied lengths ``tokens``; JSON objects
``json``; any other strings ``text``. Where most of a column's cells (more than half) are
numbers, or arrays of one length, it is ``float`` or an ``array``, and the rows of the others
are skipped as not of its kind."""
from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable

from fastdata.fields.base import FIELDS, FieldKind, field_of

#: column names whose values are class names (or class indices)
CLASS_COLUMNS = ("label", "class")
#: integer labels are class indices below this: one row's label must not make millions
MAX_CLASSES = 1 << 20
_INTEGER = re.compile(r"[0-9]+")
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def field_option(text: str) -> tuple[str, str]:
    """``NAME=KIND`` (a command line's ``--field``) as ``(name, kind)``.

    Raises:
        ValueError: not ``NAME=KIND``, or a kind that is not registered (naming those that are).
    """
    name, sep, kind = text.partition("=")
    if not sep or not name.strip():
        raise ValueError(f"--field {text!r} is not NAME=KIND (e.g. caption=text)")
    if kind.strip() not in FIELDS:
        raise ValueError(f"--field {text!r}: kind {kind.strip()!r} is not valid; choose one "
                         f"of {', '.join(sorted(FIELDS))}")
    return name.strip(), kind.strip()


def _json(cell):
    """A cell as a JSON value where it is one (a CSV cell holds text), else the cell."""
    if isinstance(cell, str) and cell.strip()[:1] in ("[", "{"):
        try:
            return json.loads(cell)
        except ValueError:
            return cell
    return cell


def _numbers(values) -> bool:
    return isinstance(values, list) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


class _Stats:
    """What one pass over a column's cells finds: how many are objects, lists, numbers; of
    the lists, whether all are of numbers, of integers, their lengths and the integers'
    range."""

    def __init__(self, cells: Iterable):
        self.n = self.dicts = self.lists = self.numbers = 0
        self.numeric = self.integers = True
        self.lengths: Counter = Counter()
        self.lo = self.hi = 0
        for cell in cells:
            self._see(_json(cell))

    def _see(self, v) -> None:
        self.n += 1
        if isinstance(v, dict):
            self.dicts += 1
        elif isinstance(v, list):
            self.lists += 1
            self.lengths[len(v)] += 1
            self.numeric = self.numeric and _numbers(v)
            ints = [x for x in v if isinstance(x, int)]
            self.integers = self.integers and len(ints) == len(v)
            if ints:
                self.lo, self.hi = min(self.lo, *ints), max(self.hi, *ints)
        elif _number(v):
            self.numbers += 1


def infer(name: str, cells: Iterable) -> FieldKind:
    """The kind of column ``name`` whose values are ``cells`` (CSV strings or JSON values;
    any iterable that can be read more than once: a pass or two over it, none held).

    Returns:
        The field kind, with its parameters (a class field's names, an array's shape).

    Raises:
        ValueError: a class column whose integer labels would make too many classes.
    """
    if name.strip().lower() in CLASS_COLUMNS and all(isinstance(c, (str, int)) for c in cells):
        return _classes(cells)
    stats = _Stats(cells)
    if not stats.n:
        return field_of("text")
    if stats.dicts == stats.n:
        return field_of("json")
    if stats.lists == stats.n:
        return _lists(stats)
    if _most(stats.numbers, stats.n):       # the others are rows to skip
        return field_of("float")
    return field_of("text")


def _most(count: int, n: int) -> bool:
    """Whether ``count`` is more than half of ``n``."""
    return 2 * count > n


def _number(v) -> bool:
    """Whether a cell is one number (a JSON number, or a CSV string that reads as one)."""
    if isinstance(v, str):
        return _NUMBER.fullmatch(v.strip()) is not None
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _lists(stats: _Stats) -> FieldKind:
    """Lists: of numbers of one length an array, of integers tokens, any others json."""
    if not stats.numeric:
        return field_of("json")
    common, count = max(stats.lengths.items(), key=lambda kv: (kv[1], -kv[0]))
    if common and (len(stats.lengths) == 1 or _most(count, stats.n) and not stats.integers):
        return field_of("array", shape=[common], dtype="float32")
    if stats.integers:
        return field_of("tokens", dtype=_token_dtype(stats.lo, stats.hi))
    return field_of("json")


def _token_dtype(lo: int, hi: int) -> str:
    """The smallest of the tokens kind's dtypes that holds every integer from ``lo`` to
    ``hi``."""
    if lo >= 0 and hi < 1 << 16:
        return "uint16"
    return "int32" if -(1 << 31) <= lo and hi < 1 << 31 else "int64"


def kind_named(kind: str, cells: Iterable) -> FieldKind:
    """The kind ``kind`` (a ``--field NAME=KIND``'s) with the parameters its column's
    ``cells`` imply (one pass over them): a class or multilabel field's names (sorted), a
    float vector's length, an array's shape, the tokens' dtype.

    Raises:
        ValueError: an unknown kind (naming the kinds), or cells that imply no parameters
            (e.g. an array column with no array).
    """
    if kind == "class":
        return _classes(cells)
    if kind == "multilabel":
        return field_of("multilabel", classes=sorted(_names_in(map(_json, cells))))
    if kind == "float":
        return _floats(cells)
    if kind == "array":
        first = next((v for v in map(_json, cells) if isinstance(v, list)), None)
        if first is None:
            raise ValueError("an array field needs JSON arrays of numbers in its column")
        return field_of("array", shape=list(_shape(first)), dtype="float32")
    if kind == "tokens":
        stats = _Stats(cells)
        return field_of("tokens", dtype=_token_dtype(stats.lo, stats.hi))
    return field_of(kind)


def _floats(cells: Iterable) -> FieldKind:
    """A float field: of the first list's length where the cells are lists (or strings of
    several numbers, all of them), else a scalar."""
    first, words = None, None
    for v in map(_json, cells):
        if isinstance(v, list):
            return field_of("float", length=len(v))
        if words is not False:
            words = isinstance(v, str) and len(v.split()) > 1
            first = v.split() if words and first is None else first
    return field_of("float", length=len(first)) if words and first else field_of("float")


def _names_in(values) -> set[str]:
    """The class names of multilabel cells: ``|``- or ``;``-separated, or JSON lists."""
    names: set[str] = set()
    for v in values:
        if isinstance(v, str):
            sep = "|" if "|" in v else ";"
            names.update(n.strip() for n in v.split(sep) if n.strip())
        elif isinstance(v, list):
            names.update(str(n) for n in v)
    return names


def _shape(value) -> tuple[int, ...]:
    """The shape of a nested list (its first elements' lengths)."""
    shape = []
    while isinstance(value, list) and value:
        shape.append(len(value))
        value = value[0]
    return tuple(shape)


def _classes(cells) -> FieldKind:
    """A class column's kind: non-negative integers are class indices (``0..max``, so that a
    label is its index); any other values are names, sorted."""
    names = {str(c).strip() for c in cells}
    if names and all(_INTEGER.fullmatch(n) for n in names):
        top = max(int(n) if len(n.lstrip("0")) < 8 else MAX_CLASSES for n in names)
        if top >= MAX_CLASSES:
            raise ValueError(f"a class index of {MAX_CLASSES:,} or more: integer labels are "
                             f"class indices 0..{MAX_CLASSES - 1}; give class names instead")
        return field_of("class", classes=[str(k) for k in range(top + 1)])
    return field_of("class", classes=sorted(names))
