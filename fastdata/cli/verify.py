"""``fastdata verify``: check every record of a shard set, and say how to redo what is
damaged."""

from __future__ import annotations

import argparse
import os

from fastdata.checks import printable
from fastdata.cli.common import echo

HELP = "recompute checksums, decode every JPEG"


def run(a) -> int:
    from fastdata.shards.verify import verify

    problems = verify(a.shards, progress=not a.quiet)
    for p in problems:
        echo(f"DAMAGED {printable(p)}")
    n = len(problems)
    echo(f"{a.shards}: " + (f"{n} problem{'s' * (n > 1)} found" if n else "OK"))
    if problems:
        import shlex

        from fastdata.format import read_manifest

        source = read_manifest(a.shards)["source"]
        damaged = sorted({p.shard for p in problems})
        echo("to redo them (the conversion's options are read from the set):")
        quoted = lambda path: shlex.quote(printable(path))  # noqa: E731
        echo("  rm -f " + " ".join(quoted(os.path.join(a.shards, n)) for n in damaged))
        echo(f"  fastdata convert {quoted(source)} {quoted(a.shards)} "
             f"--resume")
    return 0 if not problems else 1


def add_args(v: argparse.ArgumentParser) -> None:
    v.add_argument("shards", help="shard set: its folder (with manifest.json) or URL (s3://, "
                   "gs://, az://, http(s)://: every shard is fetched into the cache and checked)")
