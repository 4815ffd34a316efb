"""The ``fastdata`` command line: a module per command (``convert``, ``info``, ``verify``,
``train``, ``bench``, ``demo``, ``cache``), each with ``HELP``, ``add_args(parser)`` and
``run(args)``."""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import warnings
from typing import Any

from fastdata.checks import printable
from fastdata.cli.common import HelpFormatter, log

COMMANDS = ("convert", "info", "verify", "train", "bench", "demo", "cache")
#: commands whose options name torch's choices (backends, precisions): set up only when one of
#: them runs, so that convert, info, verify and cache start without importing torch
NEED_TORCH = ("train", "bench")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The CLI; given the ``command`` about to run, the options of the commands that need torch
    are left out unless it is one of them."""
    p = argparse.ArgumentParser(prog="fastdata", description="Image shards and fast loaders "
                                "for PyTorch training.")
    quiet: dict[str, Any] = dict(action="store_true", help="no progress bars or info logs")
    p.add_argument("-q", "--quiet", **quiet)
    sub = p.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        module = importlib.import_module(f"fastdata.cli.{name}")
        s = sub.add_parser(name, formatter_class=HelpFormatter, help=module.HELP)
        s.add_argument("-q", "--quiet", default=argparse.SUPPRESS, **quiet)  # after it too
        s.set_defaults(func=module.run)
        if name not in NEED_TORCH or command not in ("convert", "info", "verify", "cache"):
            module.add_args(s)
    return p


class _Printable(logging.Formatter):
    """Each line of a record with its control characters escaped: a message quotes names,
    URLs and servers' answers from outside, which must not drive the terminal."""

    def format(self, record: logging.LogRecord) -> str:
        return "\n".join(map(printable, super().format(record).split("\n")))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = build_parser(next((x for x in argv if not x.startswith("-")), None)).parse_args(argv)
    handler = logging.StreamHandler()
    handler.setFormatter(_Printable("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING if a.quiet else logging.INFO, handlers=[handler])
    # a command's warnings in one line each, as its logs (not the library's file and line)
    warnings.formatwarning = lambda message, category, *_, **__: \
        f"WARNING {category.__name__}: {printable(message)}\n"
    try:
        return a.func(a)
    except BrokenPipeError:     # `fastdata info out/ | head`: the reader left, as for any tool
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # no error at exit
        return 141
    except (ValueError, OSError, ImportError) as e:     # bad input or damaged data: no traceback
        log.error("%s", e)
        return 2
    except MemoryError:
        log.error("out of memory (the command's input is larger than this process may hold; "
                  "`ulimit -v` or a container's limit may be what stops it)")
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
