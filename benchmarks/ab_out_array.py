"""A/B: ``read_batch`` into a fresh array each batch (as the DALI backend's source did once) vs
into one array used again (as it does now); figures in benchmarks/RESULTS.md.

    .venv/bin/python -W ignore benchmarks/ab_out_array.py /tmp/fd-compare/raw-hdf5 \
        /tmp/fd-compare/raw-lmdb --batch 64 --batch 256

Random batches (sorted, as the loaders read them) from raw shard sets already in the page
cache, the two sides alternating over rounds; medians. glibc maps an allocation of 32 MiB or
more afresh each time (its largest dynamic mmap threshold), so from a batch of 171 at 256 px
a fresh array's pages fault in at every batch.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import fastdata
from fastdata.readers import page_aligned


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sets", nargs="+", help="raw shard sets")
    ap.add_argument("--batch", type=int, action="append")
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    for root in a.sets:
        ds = fastdata.open(root)
        for b in a.batch or [256]:
            rng = np.random.default_rng(0)
            idx = [np.sort(rng.choice(len(ds), b, replace=False)) for _ in range(a.batches)]
            out = page_aligned((b, ds.size, ds.size, 3))
            sides = {"fresh": lambda i: ds.read_batch(i), "reused": lambda i: ds.read_batch(
                i, out=out)}
            rates: dict[str, list[float]] = {k: [] for k in sides}
            for fn in sides.values():       # the pages of the set, and the handles, warm
                for i in idx:
                    fn(i)
            for _ in range(a.rounds):
                for k, fn in sides.items():
                    t = time.perf_counter()
                    for i in idx:
                        fn(i)
                    rates[k].append(len(idx) * b / (time.perf_counter() - t))
            fresh, reused = (statistics.median(rates[k]) for k in sides)
            print(f"{root} ({ds.container}, {ds.size} px), batch {b}: fresh {fresh:.0f} img/s, "
                  f"reused {reused:.0f} img/s, reused/fresh {reused / fresh:.2f}x")


if __name__ == "__main__":
    main()
