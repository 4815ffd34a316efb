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
import zlib
from unittest import mock

import numpy as np

from converters.writers import LMDBWriter, ShardBuffer
from fastdata.format import ShardMeta


def make_buffer(n: int, size: int) -> ShardBuffer:
    rng = np.random.default_rng(0)
    buf = ShardBuffer((size,), "raw", n)
    for i in range(n):
        p = rng.integers(0, 256, 3 * size * size, np.uint8).tobytes()
        buf.add(i % 10, [p], [zlib.crc32(p)])
    return buf


def write_once(folder: str, buf: ShardBuffer, sparse: bool) -> float:
    meta = ShardMeta(index=0, start=0, count=len(buf), sha256=buf.checksum(), config="ab",
                     sources=(0, len(buf)))
    path = os.path.join(folder, "shard-00000.lmdb")
    # sparse: the writer as it was, without the allocation (posix_fallocate made a no-op)
    patch = mock.patch.object(os, "posix_fallocate", lambda *a: None) if sparse else \
        contextlib.nullcontext()
    with patch:
        t0 = time.perf_counter()
        LMDBWriter().write(path, buf, meta)
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
    buf = make_buffer(a.samples, a.size)
    times: dict[str, list[float]] = {"sparse": [], "allocated": []}
    try:
        write_once(a.dir, buf, sparse=False)                # warm-up, not timed
        for _ in range(a.rounds):
            for side in times:
                times[side].append(write_once(a.dir, buf, sparse=side == "sparse"))
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
