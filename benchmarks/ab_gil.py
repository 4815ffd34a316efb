"""How much reader threads slow a Python training loop through the GIL alone (this CPU).

A main thread issues tiny torch ops (each releases and retakes the GIL, as a GPU training loop's
kernel launches do) while reader threads, paced to a fixed total batch rate so that they leave
it a core, read random raw batches of 256 at 256 px: ``read_batch`` as the loaders do (one numpy
copy per sample, so one GIL round trip each) against one ``index_select`` per shard (one round
trip per shard, plus a scattering copy). Three interleaved rounds; RESULTS.md has the figures.

    python benchmarks/ab_gil.py /tmp/fd-compare/raw-hdf5 --rate 20 --threads 1
"""
from __future__ import annotations

import argparse
import threading
import warnings
import time

import numpy as np
import torch

import fastdata


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shards", help="a raw shard set stored at 256")
    ap.add_argument("--rate", type=float, default=20, help="batches/s over all readers")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(1)
    ds = fastdata.open(a.shards)
    n, b, s = len(ds), 256, ds.size
    sources = {}

    def per_sample(idx, out):
        ds.read_batch(idx, out=out)

    def index_select(idx, out):
        shard, local = ds.locate(idx)
        o = torch.from_numpy(out)
        for sh in np.unique(shard):
            if sh not in sources:       # a read-only map: only ever read from
                sources[sh] = torch.from_numpy(ds.shards[sh].h["maps"][s])
            rows = np.flatnonzero(shard == sh)
            o.index_copy_(0, torch.from_numpy(rows),
                          sources[sh].index_select(0, torch.from_numpy(local[rows])))

    def reader(fn, seed, stop, done):
        torch.set_num_threads(1)
        out, rng = np.empty((b, s, s, 3), np.uint8), np.random.default_rng(seed)
        period, due = a.threads / a.rate, time.perf_counter()
        while not stop.is_set():
            fn(rng.integers(0, n, b), out)
            done[0] += 1
            due += period
            time.sleep(max(0.0, due - time.perf_counter()))

    def main_rate(secs=3.0):
        t, ops, end = torch.zeros(8), 0, time.perf_counter() + secs
        while time.perf_counter() < end:
            for _ in range(200):
                t.add_(1)
            ops += 200
        return ops / secs

    warnings.filterwarnings("ignore", "The given NumPy array is not writable")
    for fn in (per_sample, index_select):
        fn(np.arange(b), np.empty((b, s, s, 3), np.uint8))
    res: dict[str, list] = {}
    for _ in range(3):
        for name, fn in (("no readers", None), ("read_batch", per_sample),
                         ("index_select", index_select)):
            stop, done = threading.Event(), [0]
            threads = [threading.Thread(target=reader, args=(fn, k, stop, done))
                       for k in range(a.threads if fn else 0)]
            for t in threads:
                t.start()
            t0 = time.perf_counter()
            ops = main_rate()
            secs = time.perf_counter() - t0
            stop.set()
            for t in threads:
                t.join()
            res.setdefault(name, []).append((ops, done[0] / secs))
    print(f"{a.threads} reader thread(s) paced to {a.rate:g} batches/s of {b} at {s} px:")
    for k, v in res.items():
        print(f"  {k:<13} main thread {', '.join(f'{o / 1e3:.0f}k' for o, _ in v)} ops/s; "
              f"readers {', '.join(f'{r:.1f}' for _, r in v)} batches/s")


if __name__ == "__main__":
    main()
