"""Which kind a source's column is, when no one says (``--field NAME=KIND`` says it): a
``label`` or ``class`` column is a class per sample; numbers are ``float``; JSON arrays of
numbers of one length are an ``array``, of integers of varied lengths ``tokens``; JSON objects
``json``; any other strings ``text``. Where most of a column's cells (more than half) are
numbers, or arrays of one length, it is ``float`` or an ``array``, and the rows of the others
are skipped as not of its kind."""
from __future__ import annotations

from collections.abc import Iterable

from fastdata.checks import choice
from fastdata.fields.base import FIELDS, FieldKind, field_of
from fastdata.fields.category import MAX_CLASSES
from fastdata.fields.cells import Stats, token_dtype

__all__ = ["CLASS_COLUMNS", "MAX_CLASSES", "field_option", "infer", "kind_named"]

#: column names whose values are class names (or class indices)
CLASS_COLUMNS = ("label", "class")


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


def infer(name: str, cells: Iterable) -> FieldKind:
    """The kind of column ``name`` whose values are ``cells`` (CSV strings or JSON values;
    any iterable that can be read more than once: a pass or two over it, none held).

    Returns:
        The field kind, with its parameters (a class field's names, an array's shape).

    Raises:
        ValueError: a class column whose integer labels would make too many classes.
    """
    if name.strip().lower() in CLASS_COLUMNS and all(isinstance(c, (str, int)) for c in cells):
        return FIELDS["class"].from_column(cells)
    stats = Stats(cells)
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


def _lists(stats: Stats) -> FieldKind:
    """Lists: of numbers of one length an array, of integers tokens, any others json."""
    if not stats.numeric:
        return field_of("json")
    common, count = max(stats.lengths.items(), key=lambda kv: (kv[1], -kv[0]))
    if common and (len(stats.lengths) == 1 or _most(count, stats.n) and not stats.integers):
        return field_of("array", shape=[common], dtype="float32")
    if stats.integers:
        return field_of("tokens", dtype=token_dtype(stats.lo, stats.hi))
    return field_of("json")


def kind_named(kind: str, cells: Iterable) -> FieldKind:
    """The kind ``kind`` (a ``--field NAME=KIND``'s) with the parameters its column's
    ``cells`` imply (``FieldKind.from_column``: e.g. a class field's names, an array's shape).

    Raises:
        ValueError: an unknown kind (naming the kinds), or cells that imply no parameters
            (e.g. an array column with no array).
    """
    return FIELDS[choice("kind", kind, sorted(FIELDS))].from_column(cells)
