"""Loader-only throughput on a CPU, one run (figures in docs/performance.md).

    python -m benchmarks.inputs.make_photos /tmp/photos
    python -m benchmarks.loading.loaders_cpu /tmp/photos --work /tmp/fd-loaders

(a) baseline: ImageFolder-style dataset + PIL decode + RandomResizedCrop(224) + flip + ToTensor
    + Normalize, DataLoader(2 workers, batch 64). torchvision's transforms when importable, else
    an in-package equivalent (same RandomResizedCrop parameter sampling, PIL bilinear resize).
(b) fastdata torch backend, raw HDF5 and raw LMDB stored at 256, same augmentation, float32,
    NCHW contiguous (the CPU default) and channels_last (what `fastdata train` feeds its model).
(c) the same without augmentation: uint8 delivery, NCHW contiguous (the CPU default) and
    channels_last (the stored NHWC bytes viewed as NCHW: no transposing copy).
Each fastdata variant runs 5 epochs (PSS of the process tree sampled after each); every
contender gets 5 untimed warm-up batches first, and its files are read once before (a warm page
cache for all).
"""
from __future__ import annotations

import argparse
import os
import time

import torch

import fastdata
from benchmarks.loading.compare_cpu import warm
from fastdata.bench import rss_tree_mb
from fastdata.bench.baseline import PILFolder
from fastdata.converters.convert import convert


def settle(idle: float = 0.9, window: float = 0.2, limit: float = 15.0) -> None:
    """Wait (up to ``limit`` s) until the CPUs are ``idle`` over a ``window``: a contender's
    work still in flight when it was stopped (prefetched batches of worker processes) would
    otherwise run during the next one's timing."""
    def ticks():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return v[3] + v[4], sum(v)        # idle + iowait, all
    end = time.monotonic() + limit
    while time.monotonic() < end:
        i0, t0 = ticks()
        time.sleep(window)
        i1, t1 = ticks()
        if t1 > t0 and (i1 - i0) / (t1 - t0) >= idle:
            return


def throughput(loader, epochs=1, max_batches=None, warmup=5) -> tuple[float, list[float]]:
    """img/s over ``epochs``, not counting the first ``warmup`` batches (worker start-up, first
    page faults) nor the PSS probe after each epoch (~20 ms of /proc reads). Starts once the
    CPUs are idle (``settle``)."""
    settle()
    n, busy, rss = 0, 0.0, []
    for e in range(epochs):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(e)
        skip = warmup if e == 0 else 0
        t = time.perf_counter()
        for k, (x, _) in enumerate(loader):
            if k < skip:
                t = time.perf_counter()     # the clock starts after the last warm-up batch
                continue
            n += len(x)
            if max_batches and k + 1 >= max_batches + skip:
                break
        busy += time.perf_counter() - t
        rss.append(rss_tree_mb())
    return n / busy, rss


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("photos")
    ap.add_argument("--work", default="/tmp/fd-loaders")
    ap.add_argument("--baseline-batches", type=int, default=20)
    a = ap.parse_args()
    torch.set_num_threads(1)    # the loaders parallelise over their own workers
    paths = {}
    for c in ("hdf5", "lmdb"):
        paths[c] = os.path.join(a.work, f"raw-{c}-256")
        if not os.path.exists(os.path.join(paths[c], "manifest.json")):
            convert(a.photos, paths[c], container=c, sizes=[256], overwrite=True, progress=False)
    print(f"# {os.cpu_count()} cpus, torch {torch.__version__}, 3000 images, batch 64")
    warm(a.photos)
    ds = PILFolder(a.photos)
    dl = torch.utils.data.DataLoader(ds, batch_size=64, shuffle=True, num_workers=2,
                                     pin_memory=False, drop_last=True, persistent_workers=True)
    base, _ = throughput(dl, max_batches=a.baseline_batches)
    print(f"(a) baseline ({ds.kind}), PIL decode+RRC224: {base:.0f} img/s")
    for kind in ("thread", "process"):
        for c in ("hdf5", "lmdb"):
            variants = [("(b) RRC224 float32", dict(crop=224, dtype=torch.float32)),
                        ("(c) uint8, no aug", dict(dtype=torch.uint8, augment=False))]
            if kind == "thread":
                variants += [("(b) RRC224 float32, channels_last",
                              dict(crop=224, dtype=torch.float32, channels_last=True)),
                             ("(c) uint8, no aug, channels_last",
                              dict(dtype=torch.uint8, augment=False, channels_last=True))]
            warm(paths[c])
            for tag, kw in variants:
                backend = fastdata.TorchBackend(num_workers=2, workers=kind)
                loader = fastdata.Loader(paths[c], batch_size=64, device="cpu", backend=backend,
                                         **kw)
                rate, rss = throughput(loader, epochs=5)
                loader.close()
                print(f"{tag} {c} {kind}: {rate:.0f} img/s = {rate / base:.1f}x baseline; "
                      f"PSS MB by epoch: {', '.join(f'{r:.0f}' for r in rss)}")


if __name__ == "__main__":
    main()
