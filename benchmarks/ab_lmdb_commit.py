"""A/B: the converter's LMDB writer (no ``writemap``; a commit every ~64 KiB of values) vs an
earlier one (values written through the map, one transaction per shard), in whole
conversions.
The sides alternate over rounds; the figures are in benchmarks/RESULTS.md.

    .venv/bin/python -W ignore benchmarks/ab_lmdb_commit.py /tmp/photos --rounds 6

Each run converts the folder to raw 256 px LMDB shards in ``--out`` (deleted, and everything
synced, before the clock starts) and reports img/s and the CPU time of this process (the
writer's side: the decode workers are children) per image.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import time
from unittest import mock

import lmdb

from fastdata.converters.convert import convert
from fastdata.converters.writers import WRITERS, LMDBWriter


class WritemapWriter(LMDBWriter):
    """The earlier writer: ``writemap=True``, every sample of a shard in one transaction."""

    def _open(self, payload_bytes: int) -> None:
        real = lmdb.open
        with mock.patch.object(lmdb, "open", lambda *a, **k: real(*a, **k, writemap=True)):
            super()._open(payload_bytes)

    def _begin(self):
        super()._begin()
        self._every = self.capacity + 1        # no commit before the shard's end


def run_once(src: str, out: str, writer) -> tuple[float, float]:
    shutil.rmtree(out, ignore_errors=True)
    os.sync()
    with mock.patch.dict(WRITERS, {"lmdb": writer}):
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        n = convert(src, out, container="lmdb", sizes=[256], progress=False)["num_samples"]
        secs, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
    return n / secs, cpu / n * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("photos")
    ap.add_argument("--out", default="/tmp/fd-ab-lmdb")
    ap.add_argument("--rounds", type=int, default=6)
    a = ap.parse_args()
    sides = {"writemap, one transaction": WritemapWriter, "commit per batch": LMDBWriter}
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in sides}
    try:
        for _ in range(a.rounds):
            for k, w in sides.items():
                runs[k].append(run_once(a.photos, a.out, w))
    finally:
        shutil.rmtree(a.out, ignore_errors=True)
    for k, r in runs.items():
        print(f"{k:>26}: {statistics.median(x for x, _ in r):.0f} img/s "
              f"({min(x for x, _ in r):.0f}-{max(x for x, _ in r):.0f}), this process "
              f"{statistics.median(c for _, c in r):.3f} ms CPU/img "
              f"({min(c for _, c in r):.3f}-{max(c for _, c in r):.3f})")
    old, new = runs.values()
    ratios = [b[0] / a_[0] for a_, b in zip(old, new)]
    print(f"commit per batch / writemap: median {statistics.median(ratios):.2f}x "
          f"(rounds {min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
