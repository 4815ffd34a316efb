"""What the commands share: output that survives any file name, argument types, the help
formatter."""
from __future__ import annotations

import argparse
import logging
import math
import sys

from fastdata.format import check_size

log = logging.getLogger("fastdata")


def echo(text: str = "") -> None:
    try:
        sys.stdout.write(text + "\n")
    except UnicodeEncodeError:  # a file name that is not UTF-8, or a terminal's narrower code
        enc = sys.stdout.encoding or "utf-8"
        sys.stdout.write((text + "\n").encode(enc, "backslashreplace").decode(enc))


def size_arg(text: str) -> int:
    try:
        return check_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def sizes_arg(text: str) -> list[int]:
    return [size_arg(t) for t in text.split(",") if t.strip()]


def rate_arg(text: str) -> float:
    """A learning rate or weight decay: finite and >= 0 (torch's optimizers let NaN through)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not valid; use a finite number >= 0")
    return value


def fraction_arg(text: str) -> float:
    """A probability or label smoothing: a number in [0, 1]."""
    value = rate_arg(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not valid; use a number in [0, 1]")
    return value


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


class HelpFormatter(argparse.HelpFormatter):
    """Shows an option's default after its help, unless the help already says it."""

    def _get_help_string(self, action):
        unset = any(action.default is v for v in (None, False, argparse.SUPPRESS))
        if unset or "default" in action.help:
            return action.help
        return f"{action.help} (default %(default)s)"
