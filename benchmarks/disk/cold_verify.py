"""`fastdata verify` of shard sets that are not in the page cache, this tree against another
(figures in docs/performance.md, "Reading from the disk").

    python -m benchmarks.disk.cold_verify OUT [OUT ...] --ref /tmp/fd-ref --rounds 4

Each round, per set and tree (alternating): the set's shard files are dropped from the page
cache (``cold_read.drop_from_cache``), then ``python -m fastdata.cli -q verify OUT`` runs in a
fresh process from that tree and is timed whole. Linux only.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from benchmarks.disk.cold_read import drop_from_cache

HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the tree


def timed_verify(tree: str, root: str) -> float:
    drop_from_cache(root)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "fastdata.cli", "-q", "verify", root], check=True,
                   capture_output=True, cwd=tree, env={**os.environ, "PYTHONPATH": tree})
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sets", nargs="+")
    p.add_argument("--ref", help="another checkout of fastdata to compare with")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    trees = {"this": HERE, **({"ref": a.ref} if a.ref else {})}
    for root in a.sets:
        times: dict[str, list[float]] = {k: [] for k in trees}
        for _ in range(a.rounds):
            for name, tree in trees.items():
                times[name].append(timed_verify(tree, root))
        line = "  ".join(f"{k} {statistics.median(v):.2f} s ({min(v):.2f}-{max(v):.2f})"
                         for k, v in times.items())
        if a.ref:
            line += "  ref/this per round: " + " ".join(
                f"{r / t:.1f}x" for r, t in zip(times["ref"], times["this"]))
        print(f"{root}: {line}")


if __name__ == "__main__":
    main()
