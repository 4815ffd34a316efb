"""Converter and reader throughput (figures in docs/performance.md, "Converting").

    python -m benchmarks.inputs.make_photos /tmp/photos
    python -m benchmarks.convert.convert /tmp/photos --size 256 --size 128

1. convert: ``fastdata`` (worker processes, JPEG draft, pillow-simd, one writer) vs the naive
   single-process loop a user would write (PIL open → RGB → resize shorter side → centre crop →
   write one by one into an h5py dataset), same images, same output size, same machine, one
   run of interleaved rounds, each conversion in a fresh interpreter.
2. read_batch: random batches of 64 from raw HDF5 and raw LMDB shards, as a fraction of a plain
   ``np.memmap`` over the same bytes (the HDF5 dataset), interleaved repeats, median. The
   copies go into one page-aligned array (``fastdata.shards.mapped.page_aligned``), both sides.
"""
from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np
from PIL import Image

import fastdata
from fastdata.converters.convert import convert
from fastdata.converters.scan import scan_folder
from fastdata.env import env_info
from fastdata.shards.mapped import page_aligned


def naive(src: str, out: str, size: int) -> int:
    files = scan_folder(src).files
    with h5py.File(out, "w") as f:
        ds = f.create_dataset("images", (len(files), size, size, 3), np.uint8)
        labels = f.create_dataset("labels", (len(files),), np.int64)
        for i, (rel, label) in enumerate(files):
            img = Image.open(os.path.join(src, rel)).convert("RGB")
            w, h = img.size
            k = size / min(w, h)
            img = img.resize((max(size, round(w * k)), max(size, round(h * k))), Image.BICUBIC)
            x, y = (img.width - size) // 2, (img.height - size) // 2
            ds[i] = np.asarray(img.crop((x, y, x + size, y + size)))
            labels[i] = label
    return len(files)


def convert_once(kind: str, src: str, out: str, size: int, workers: int) -> tuple[float, float]:
    """One conversion (``naive``, ``hdf5`` or ``lmdb``): its seconds, and with the sync after."""
    if kind == "naive":
        fn = functools.partial(naive, src, out, size)
    else:
        fn = functools.partial(convert, src, out, container=kind, sizes=[size], num_workers=workers,
                               progress=False)
    t = time.perf_counter()
    fn()
    secs = time.perf_counter() - t
    os.sync()
    return secs, time.perf_counter() - t


def bench_convert(src: str, tmp: str, size: int, workers: int, repeats: int) -> dict:
    """Rounds of naive, HDF5, LMDB in turn (a shared host's speed drifts); medians and the
    median of each round's ratio.

    Each run is a fresh interpreter (as ``fastdata convert`` is; the clock starts after the
    imports): in one long process, earlier runs had raised glibc's malloc thresholds and hid
    a cost that the command paid (raw LMDB). Each run writes into a fresh place: the
    previous run's output is deleted and everything synced before the clock starts. Deleting
    a file that is on disk took CPU and I/O waits from the run that did it (this disk is
    mounted with ``discard``), and the kernel's writeback of the run before took CPU from
    whichever run came next; both hit a run that keeps both cores busy, not one that uses
    one. ``page cache`` figures time the call alone, ``on disk`` figures add the sync that
    follows it.
    """
    outs = {"naive": os.path.join(tmp, "naive.h5"),
            **{c: os.path.join(tmp, f"fd-{c}-{size}") for c in ("hdf5", "lmdb")}}
    n = len(scan_folder(src).files)
    secs: dict[str, list[float]] = {k: [] for k in outs}
    synced: dict[str, list[float]] = {k: [] for k in outs}
    for _ in range(repeats):
        for k, out in outs.items():
            if os.path.isdir(out):
                shutil.rmtree(out)
            elif os.path.exists(out):
                os.remove(out)
            os.sync()
            run = subprocess.run([sys.executable, "-W", "ignore", os.path.abspath(__file__), src,
                                  "--child", k, out, str(size), str(workers)],
                                 check=True, capture_output=True, text=True)
            a, b = map(float, run.stdout.split())
            secs[k].append(a)
            synced[k].append(b)
    res = {"size": size, "images": n, "repeats": repeats}
    for when, times in (("", secs), ("disk_", synced)):
        res[f"{when}naive_img_s"] = n / statistics.median(times["naive"])
        for c in ("hdf5", "lmdb"):
            res[f"{when}fastdata_{c}_img_s"] = n / statistics.median(times[c])
            ratios = [a / b for a, b in zip(times["naive"], times[c])]
            res[f"{when}speedup_{c}"] = statistics.median(ratios)
            res[f"{when}speedup_{c}_range"] = (min(ratios), max(ratios))
    return res


def bench_read(tmp: str, size: int, batches: int, repeats: int, batch: int = 64) -> dict:
    h5 = fastdata.open(os.path.join(tmp, f"fd-hdf5-{size}"))
    lm = fastdata.open(os.path.join(tmp, f"fd-lmdb-{size}"))
    path = h5.shards[0].path
    with h5py.File(path, "r") as f:
        d = f[f"images/{size}"]
        mm = np.memmap(path, np.uint8, "r", offset=d.id.get_offset(), shape=d.shape)
    n = len(mm)     # one shard: indices within it, so the memmap holds the same bytes
    rng = np.random.default_rng(0)
    idx = [rng.choice(n, batch, replace=False) for _ in range(batches)]
    out = page_aligned((batch, size, size, 3))     # np.empty's is 16 bytes into a page
    view = mm.view(np.ndarray)      # rows without np.memmap's Python-level __getitem__

    def memmap_loop(i, src=mm):
        for k, j in enumerate(i):
            out[k] = src[j]

    runs = {            # the plain-memmap baseline is the best of three ways to read it
        "memmap_fancy": lambda i: mm[i],
        "memmap_loop": memmap_loop,
        "memmap_view_loop": lambda i: memmap_loop(i, view),
        "hdf5": lambda i: h5.read_batch(i, out=out),
        "lmdb": lambda i: lm.read_batch(i, out=out),
    }
    for fn in runs.values():        # warm the page cache and the handles
        for i in idx:
            fn(i)
    rates: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(repeats):
        for k, fn in runs.items():
            t = time.perf_counter()
            for i in idx:
                fn(i)
            rates[k].append(batch * batches / (time.perf_counter() - t))
    med = {k: statistics.median(v) for k, v in rates.items()}
    med["memmap"] = max(med["memmap_fancy"], med["memmap_loop"], med["memmap_view_loop"])
    return {"size": size, "batch": batch, "samples_in_shard": n,
            **{f"{k}_img_s": v for k, v in med.items()},
            "hdf5_vs_memmap": med["hdf5"] / med["memmap"],
            "lmdb_vs_memmap": med["lmdb"] / med["memmap"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("photos")
    ap.add_argument("--size", type=int, action="append")
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=5, help="read_batch rounds")
    ap.add_argument("--convert-repeats", type=int, default=3, help="convert rounds")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        kind, out, size, workers = a.child
        print(*convert_once(kind, a.photos, out, int(size), int(workers)))
        return
    env = env_info()
    print(f"# env: {os.cpu_count()} cpus ({env['cpu']}), PIL {env['pil']} "
          f"(simd={env['pil_simd']}), h5py {env['h5py']}, lmdb {env['lmdb']}")
    tmp = tempfile.mkdtemp(prefix="fd-bench-", dir=os.environ.get("BENCH_TMP"))
    try:
        for size in a.size or [256]:
            r = bench_convert(a.photos, tmp, size, a.workers, a.convert_repeats)
            for w, what in (("", "page cache"), ("disk_", "on disk")):
                print(f"convert {size}px, {r['images']} images, {what}: naive "
                      f"{r[w + 'naive_img_s']:.0f} img/s | fastdata hdf5 "
                      f"{r[w + 'fastdata_hdf5_img_s']:.0f} img/s ({r[w + 'speedup_hdf5']:.2f}x, "
                      f"rounds %.2f-%.2f) | lmdb {r[w + 'fastdata_lmdb_img_s']:.0f} img/s "
                      f"({r[w + 'speedup_lmdb']:.2f}x, rounds %.2f-%.2f)"
                      % (*r[w + "speedup_hdf5_range"], *r[w + "speedup_lmdb_range"]))
            r = bench_read(tmp, size, a.batches, a.repeats)
            print(f"read_batch {size}px, batch 64: memmap {r['memmap_img_s']:.0f} img/s | "
                  f"hdf5 {r['hdf5_img_s']:.0f} ({r['hdf5_vs_memmap']:.0%}) | "
                  f"lmdb {r['lmdb_img_s']:.0f} ({r['lmdb_vs_memmap']:.0%})")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
