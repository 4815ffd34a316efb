"""``fastdata verify``: check every record of a shard set, and say how to redo what is
damaged."""

from __future__ import annotations

import argparse
import os

from fastdata.checks import printable
from fastdata.cli.common import echo

HELP = "recompute checksums, decode every JPEG"


def run(a) -> int:
    from fastdata.shards.stores import is_url, redact
    from fastdata.shards.verify import verify

    problems = verify(a.shards, progress=not a.quiet)
    for p in problems:
        echo(f"DAMAGED {printable(p)}")
    n = len(problems)
    shown = redact(a.shards) if is_url(a.shards) else printable(a.shards)
    echo(f"{shown}: " + (f"{n} problem{'s' * (n > 1)} found" if n else "OK"))
    if problems:
        _advise(a.shards, sorted({p.shard for p in problems}))
    return 0 if not problems else 1


def _advise(where: str, damaged: list[str]) -> None:
    """How to redo the ``damaged`` files of the set at ``where``."""
    import shlex

    from fastdata.shards.stores import is_url, redact

    if is_url(where):               # the cache fetched each twice: the store's copy is bad
        echo(f"the store's copies of {', '.join(map(printable, damaged))} are damaged: upload "
             f"them again from the set's folder, or convert the set into {redact(where)} "
             f"again")
        return
    from fastdata.format import read_manifest

    source = read_manifest(where)["source"]
    echo("to redo them (the conversion's options are read from the set):")
    quoted = lambda path: shlex.quote(printable(path))  # noqa: E731
    echo("  rm -f " + " ".join(quoted(os.path.join(where, n)) for n in damaged))
    echo(f"  fastdata convert {quoted(source)} {quoted(where)} --resume")


def add_args(v: argparse.ArgumentParser) -> None:
    v.add_argument("shards", help="shard set: its folder (with manifest.json) or URL (s3://, "
                   "gs://, az://, http(s)://: every shard is fetched into the cache and checked)")
