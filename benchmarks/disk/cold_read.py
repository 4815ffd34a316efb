"""A first pass over shard sets that are not in the page cache, then a second one (figures in
docs/performance.md, "Reading from the disk").

    python -W ignore -m benchmarks.disk.cold_read OUT [OUT ...] --rounds 3

Each round, per set: its shard files are dropped from the page cache
(``posix_fadvise(POSIX_FADV_DONTNEED)``, as a conversion with ``O_DIRECT`` or a set larger than
memory leaves them), it is opened afresh, and every sample is read once through ``read_batch``
in random batches of 64 (each batch sorted, as the loaders sort theirs); then again, cached.
``--order file``: an unshuffled ``fastdata.Loader`` (eval: uint8 as stored, on the CPU)
reads the set in file order instead. ``--readahead on|off``: random reads with readahead
forced on or off, instead of as ``ShardSet`` chooses it (off: as on a set larger than the
memory). Linux only.
"""
from __future__ import annotations

import argparse
import glob
import os
import statistics
import time

import numpy as np

import fastdata


def drop_from_cache(root: str) -> None:
    os.sync()       # dirty pages are not dropped
    for path in glob.glob(os.path.join(root, "shard-*")):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def one_pass(ds, order: np.ndarray, batch: int) -> float:
    t = time.perf_counter()
    for i in range(0, len(order), batch):
        ds.read_batch(np.sort(order[i:i + batch]))
    return len(order) / (time.perf_counter() - t)


def loader_pass(root: str, batch: int) -> float:
    loader = fastdata.Loader(root, train=False, batch_size=batch, device="cpu",
                             dtype="uint8", augment=False)
    t = time.perf_counter()
    n = sum(len(y) for _, y in loader)
    rate = n / (time.perf_counter() - t)
    loader.dataset.close()
    return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sets", nargs="+", help="shard sets (raw, as `fastdata convert` writes them)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--order", choices=("random", "file"), default="random")
    ap.add_argument("--readahead", choices=("auto", "on", "off"), default="auto")
    a = ap.parse_args()
    rates: dict[tuple[str, str], list[float]] = {}
    for r in range(a.rounds):
        for root in a.sets:
            drop_from_cache(root)
            if a.order == "file":
                rates.setdefault((root, "cold"), []).append(loader_pass(root, a.batch))
                rates.setdefault((root, "cached"), []).append(loader_pass(root, a.batch))
                continue
            ds = fastdata.open(root)
            for reader in ds.shards:
                reader.fits = {"on": True, "off": False}.get(a.readahead, ds.readahead)
            order = np.random.default_rng(r).permutation(len(ds))
            rates.setdefault((root, "cold"), []).append(one_pass(ds, order, a.batch))
            rates.setdefault((root, "cached"), []).append(one_pass(ds, order, a.batch))
            ds.close()
    for root in a.sets:
        m = fastdata.open(root).manifest
        cold, cached = rates[root, "cold"], rates[root, "cached"]
        print(f"{root} ({m['container']}, {m['encoding']}, {m['sizes'][-1]} px, "
              f"{m['num_samples']} samples): first pass {statistics.median(cold):.0f} img/s "
              f"({min(cold):.0f}-{max(cold):.0f}), cached {statistics.median(cached):.0f} "
              f"({min(cached):.0f}-{max(cached):.0f})")


if __name__ == "__main__":
    main()
