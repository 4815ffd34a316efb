"""Random passes over shard sets out of the page cache, inside a memory cgroup smaller or
larger than the set: readahead as ``ShardSet`` chooses it ("auto"), forced on, forced off
(where a reader asks for each batch's pages at once instead); figures in
docs/performance.md, "Reading from the disk").

    sudo python -m benchmarks.disk.readahead_memory OUT [OUT ...] --limit-mib 100,200,400,600

The page cache a process fills is charged to its memory cgroup, so a limit below a set's size
stands in for a set larger than the machine's memory (``usable_memory()`` reads the limit
too). Each run is a fresh process moved into the cgroup, after the set's files were dropped
from the page cache; it reads ``--samples`` samples of a random order in sorted batches of
64 and reports img/s and the bytes read from the disk (``/proc/self/io``) per byte wanted;
``--passes N``: N such passes in the process, each in another random order, as epochs;
``--loader``: each pass is an epoch of a shuffled ``fastdata.Loader`` instead.
Linux, root, cgroup v1 (``/sys/fs/cgroup/memory``) or v2 (with the memory controller).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np

from benchmarks.disk.cold_read import drop_from_cache, one_pass


def _read_bytes() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("read_bytes"))


def child(root: str, mode: str, samples: int, passes: int, use_loader: bool) -> None:
    import fastdata

    ds = fastdata.open(root)
    chosen = ds.readahead
    if mode != "auto":
        ds.readahead = mode == "on"
        for r in ds.shards:
            r.fits = ds.readahead     # read at random: readahead as if the set fit, or not
    loader = fastdata.Loader(ds, train=True, batch_size=64, device="cpu") if use_loader else None
    figures = []
    for p in range(passes):     # another random order each pass, as epochs
        before, t = _read_bytes(), time.perf_counter()
        if loader is not None:
            loader.set_epoch(p)
            n = sum(len(y) for _, y in loader)
            rate = n / (time.perf_counter() - t)
        else:
            n = samples
            rate = one_pass(ds, np.random.default_rng(1 + p).permutation(len(ds))[:n], 64)
        amplification = (_read_bytes() - before) / (n * ds.size ** 2 * 3)
        figures.append(f"{rate:6.0f} img/s, {amplification:4.1f}x the bytes wanted")
    print(f"  {mode:4} (auto chooses {'on' if chosen else 'off'}): " + "; ".join(figures))


def make_cgroup(limit: int) -> str:
    v1 = "/sys/fs/cgroup/memory"
    path = os.path.join(v1 if os.path.isdir(v1) else "/sys/fs/cgroup", "fastdata-bench")
    os.makedirs(path, exist_ok=True)
    name = "memory.limit_in_bytes" if path.startswith(v1) else "memory.max"
    with open(os.path.join(path, name), "w") as f:
        f.write(str(limit))
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sets", nargs="*")
    p.add_argument("--limit-mib", default="100,200,400,600")
    p.add_argument("--samples", type=int, default=1500)
    p.add_argument("--passes", type=int, default=1, help="passes in one process, as epochs")
    p.add_argument("--loader", action="store_true",
                   help="each pass an epoch of a shuffled float32 Loader (RandomResizedCrop "
                        "224, default threads) over the whole set")
    p.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        return child(a.child[0], a.child[1], int(a.child[2]), int(a.child[3]),
                     a.child[4] == "1")
    if not a.sets:
        p.error("give at least one shard set")
    for limit in (int(x) for x in a.limit_mib.split(",")):
        cgroup = make_cgroup(limit << 20)
        for root in a.sets:
            size = sum(os.path.getsize(os.path.join(root, n)) for n in os.listdir(root))
            print(f"{root}: {size / 2**20:.0f} MiB in a {limit} MiB cgroup", flush=True)
            for mode in ("auto", "on", "off"):
                drop_from_cache(root)
                subprocess.run(["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh",
                                sys.executable, "-W", "ignore", __file__, "--child", root, mode,
                                str(a.samples), str(a.passes), str(int(a.loader))],
                               check=True)


if __name__ == "__main__":
    main()
