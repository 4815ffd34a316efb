"""Argument checks shared by the public constructors: each error names the bad value and what
is valid instead (``batch_size=0 is not valid; use an integer >= 1``)."""
from __future__ import annotations

import math
import numbers
from typing import Any, Literal, overload

import numpy as np


def flag(name: str, value, default: bool | None = None) -> bool:
    """``value`` as a bool; ``None`` gives ``default`` where there is one. A string such as
    "no" is an error, not True."""
    if value is None and default is not None:
        return default
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, (int, np.integer))
                                                and value in (0, 1)):
        return bool(value)
    none = "" if default is None else f" or None (the default, {default})"
    raise ValueError(f"{name}={value!r} is not valid; use True or False{none}")


@overload
def integer(name: str, value, low: int, high: int | None = None, *,
            optional: Literal[False] = False) -> int: ...


@overload
def integer(name: str, value, low: int, high: int | None = None, *,
            optional: bool) -> int | None: ...


def integer(name: str, value, low: int, high: int | None = None, *,
            optional: bool = False) -> int | None:
    """``value`` as an int in ``low..high``; a bool, a float or a string is an error (``2.5``
    is not silently 2). ``optional``: None passes through."""
    if value is None and optional:
        return None
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    if not ok or value < low or (high is not None and value > high):
        valid = f"an integer >= {low}" if high is None else f"an integer in {low}..{high}"
        raise ValueError(f"{name}={value!r} is not valid; use {valid}"
                         + (" or None" if optional else ""))
    return int(value)


def choice(name: str, value: Any, choices) -> Any:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not valid; choose one of "
                         f"{', '.join(map(str, choices))}")
    return value


def printable(text) -> str:
    """``text`` safe to print on a terminal: control characters (an escape sequence in a file
    or class name could rewrite the screen or the window title) shown as ``\\x1b`` escapes."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == " " else
                   (f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}") for c in text)


def numbers_of(name: str, value, n: int) -> tuple[float, ...]:
    """``value`` as ``n`` floats (a sequence of numbers), or a ValueError naming it."""
    try:
        out = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        out = ()
    if len(out) != n:
        raise ValueError(f"{name}={value!r} is not valid; give {n} numbers")
    return out


def probability(name: str, value) -> float:
    """``value`` as a float in [0, 1]; a bool or a string is an error."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or \
            not 0 <= float(value) <= 1:
        raise ValueError(f"{name}={value!r} is not valid; use a probability in [0, 1]")
    return float(value)


def positive(name: str, value) -> float:
    """``value`` as a float > 0 (and finite); a bool or a string is an error."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or \
            not 0 < float(value) < math.inf:
        raise ValueError(f"{name}={value!r} is not valid; use a number > 0")
    return float(value)
