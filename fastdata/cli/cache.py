"""``fastdata cache``: what the node cache of remote shards holds, and emptying it."""

from __future__ import annotations

import argparse

from fastdata.checks import printable
from fastdata.cli.common import echo, human_bytes

HELP = "the node cache of remote shards: what it holds (--clear: delete them)"


def run(a) -> int:
    from fastdata.shards.cache import ShardCache, default_cache_dir

    root = a.dir or default_cache_dir()
    shown = printable(root)
    cache = ShardCache.existing(root)
    if cache is None:
        echo(f"{shown}: no cache here")
        return 0
    if a.clear:
        deleted, kept = cache.clear()
        echo(f"{shown}: {deleted} shard{'s' * (deleted != 1)} deleted"
             + (f", {kept} kept (open in a running reader)" if kept else ""))
    shards, nbytes, in_flight = cache.contents()
    echo(f"{shown}: {shards} shard{'s' * (shards != 1)}, {human_bytes(nbytes)}"
         + (f"; {human_bytes(in_flight)} being downloaded" if in_flight else ""))
    return 0


def add_args(c: argparse.ArgumentParser) -> None:
    c.add_argument("dir", nargs="?", default=None,
                   help="the cache folder (default: $FASTDATA_CACHE, else ~/.cache/fastdata)")
    c.add_argument("--clear", action="store_true",
                   help="delete every cached shard no running reader holds")
