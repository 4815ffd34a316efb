"""A/B: the LMDB shard writer with its map's file allocated first (``posix_fallocate``, what
``LMDBWriter`` does since a full disk killed it with SIGBUS) vs left sparse (as before).
The sides alternate over rounds; the figures are in benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/ab_lmdb_writer.py /tmp/fd-writer

One shard of 1300 raw 256 px samples (~255 MB; the pixels are random: the write does not
depend on them), written into ``DIR`` (a scratch folder on the disk to measure) and deleted.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import time
from unittest import mock

import numpy as np

from fastdata.converters.writers import LMDBWriter
from fastdata.format import ShardMeta, crc32, shard_checksum


def make_samples(n: int, size: int) -> list[tuple[int, bytes, int]]:
    rng = np.random.default_rng(0)
    ps = [rng.integers(0, 256, 3 * size * size, np.uint8).tobytes() for _ in range(n)]
    return [(i % 10, p, crc32(p)) for i, p in enumerate(ps)]


def write_once(folder: str, samples, size: int, sparse: bool) -> float:
    n = len(samples)
    meta = ShardMeta(index=0, start=0, count=n, config="ab", sources=(0, n),
                     sha256=shard_checksum([s[0] for s in samples], [[s[2] for s in samples]]))
    path = os.path.join(folder, "shard-00000.lmdb")
    # sparse: the writer as it was, without the allocation (posix_fallocate made a no-op)
    patch = mock.patch.object(os, "posix_fallocate", lambda *a: None) if sparse else \
        contextlib.nullcontext()
    with patch:
        t0 = time.perf_counter()
        shard = LMDBWriter(path, sizes=(size,), encoding="raw", capacity=n)
        for label, p, crc in samples:
            shard.add(label, [p], [crc])
        shard.finish(meta)
        secs = time.perf_counter() - t0
    os.remove(path)
    return secs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="scratch folder on the disk to measure")
    ap.add_argument("--samples", type=int, default=1300)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    samples = make_samples(a.samples, a.size)
    times: dict[str, list[float]] = {"sparse": [], "allocated": []}
    try:
        write_once(a.dir, samples, a.size, sparse=False)                # warm-up, not timed
        for _ in range(a.rounds):
            for side in times:
                times[side].append(write_once(a.dir, samples, a.size, sparse=side == "sparse"))
    finally:
        shutil.rmtree(a.dir, ignore_errors=True)
    for side, t in times.items():
        print(f"{side:>9}: median {statistics.median(t):.3f} s per shard "
              f"({', '.join(f'{x:.3f}' for x in t)})")
    ratios = [s / al for s, al in zip(times["sparse"], times["allocated"])]
    print(f"sparse / allocated: median {statistics.median(ratios):.2f} "
          f"(rounds {min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
