"""A/B figures for seven choices in the readers and the torch backend, each pair interleaved in
one process (the runs alternate, so machine noise hits both sides alike); figures in
benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/compare_cpu.py /tmp/photos --work /tmp/fd-compare  # makes shards
    .venv/bin/python -W ignore benchmarks/ab_cpu.py --work /tmp/fd-compare

* jpeg: JPEG shards decoded by simplejpeg (fastdata.readers.decode_jpeg) vs PIL.
* omp: worker threads with one intra-op OpenMP thread each (one_intraop_thread) vs the default.
  Loader only, batch 64, RandomResizedCrop(224) float32, 2 worker threads; img/s per round.
* map: HDF5 ``read_batch`` of random batches of 64 from two threads, through ``np.memmap``
  itself vs the plain ndarray view of it that the reader keeps.
* fused: float32 output (NCHW, the CPU default, and channels_last), the whole batch resized
  to uint8 and then normalised in three passes over the float output (copy, multiply, add) vs
  each image normalised as soon as it is resized, while in cache (Augment.__call__).
* epochs: uint8 channels_last loader, 5 whole epochs, batch buffers made afresh each epoch vs
  kept across epochs (TorchBackend keeps its batch reader).
* flip: RRC224 float32 channels_last, the resized output mirrored vs the source crop mirrored
  before the resize (the same pixels; augment.resized_patches).
* native: RRC224 float32, NCHW and channels_last, torch ops (``kernel="per_sample"``) vs
  fastdata's C kernel (``kernel="native"``, the CPU default where built).

"fused" and "flip" change the torch ops: both their sides run with ``kernel="per_sample"``.

``--pairs flip,omp`` runs only those.
"""
from __future__ import annotations

import argparse
import io
import os
import statistics
import threading
import time

import numpy as np
import torch
import torch.nn.functional as F

import fastdata
import fastdata.augment as aug
import fastdata.loaders.torch_backend as tb
import fastdata.readers as readers
from fastdata.bench import _forever


def pil_decode(buf, out):
    from PIL import Image

    with Image.open(io.BytesIO(buf)) as im:
        out[...] = np.asarray(im.convert("RGB") if im.mode != "RGB" else im)


def as_batch(x) -> torch.Tensor:
    """The "before" sides took a (B, H, W, 3) batch, which raw HDF5 shards no longer copy into
    (the loader hands over views of the map): stacked here, the copy they were given then.
    Their "now" sides have every later change too (see ``ab_trees.py --job loader``),
    so "fused" and "flip" no longer isolate their own change."""
    return x if torch.is_tensor(x) else torch.stack(list(x))


def unfused_call(self, x, generator=None, out=None):
    """``Augment.__call__`` before, for float32 on CPU, into ``out``."""
    x = as_batch(x)
    boxes, flips = self.params(*x.shape[:3], generator)
    y = aug.crop_resize_per_sample(x, boxes, flips, self.crop, self.memory_format)
    o = out
    if self.channels_last:      # along (N*H, W*3) rows of NHWC memory
        n, c, h, w = y.shape
        a, b = self._scale_shift(x.device, w)
        o, y = (t.permute(0, 2, 3, 1).reshape(n * h, w * c) for t in (out, y))
    else:
        a, b = self._scale_shift(x.device)
    o.copy_(y).mul_(a).add_(b)
    return out


def flip_after_resize(x, boxes, flips, out):
    """``augment.resized_patches`` before "flip": the resized output mirrored."""
    xs = as_batch(x).permute(0, 3, 1, 2)
    for k, (t, l, h, w) in enumerate(boxes.tolist()):
        patch = xs[k:k + 1, :, t:t + h, l:l + w]
        if (h, w) != (out, out):
            patch = F.interpolate(patch.contiguous(memory_format=torch.channels_last),
                                  size=(out, out), mode="bilinear", antialias=True,
                                  align_corners=False)
        yield patch[0].flip(-1) if flips[k] else patch[0]


def batches(path, kernel="auto", **kw):
    loader = fastdata.Loader(path, batch_size=64, crop=224, device="cpu", num_workers=2, **kw)
    loader.transform.kernel = kernel
    return _forever(loader)


def timed(it, n):
    t = time.perf_counter()
    for _ in range(n):
        next(it)
    return 64 * n / (time.perf_counter() - t)


def report(name, res, cpu=None):
    """img/s per side and round; ``cpu``: the process's CPU time per image per side and round
    (both worker threads: what a model sharing the cores with the loader would get back)."""
    for side, runs in res.items():
        print(f"{name} {side}: median {statistics.median(runs):.0f} img/s, runs "
              f"{', '.join(f'{r:.0f}' for r in runs)}")
    before, now = res.values()
    ratios = [b / a for a, b in zip(before, now)]
    print(f"{name}: now / before per round, median {statistics.median(ratios):.3f} "
          f"({min(ratios):.3f}-{max(ratios):.3f})")
    if cpu:
        ratios = [b / a for a, b in zip(*cpu.values())]
        print(f"  CPU us/img, median: "
              f"{', '.join(f'{k} {statistics.median(v):.0f}' for k, v in cpu.items())}; "
              f"now / before per round {statistics.median(ratios):.3f} "
              f"({min(ratios):.3f}-{max(ratios):.3f})")


def timed_cpu(it, res, cpu, side):
    timed(it, 4)                            # drain batches made by the other side
    c = time.process_time()
    res[side].append(timed(it, 20))
    cpu[side].append((time.process_time() - c) / (20 * 64) * 1e6)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="/tmp/fd-compare")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--pairs", default=",".join(PAIRS), help="comma-separated subset of "
                    + ", ".join(PAIRS))
    a = ap.parse_args()
    for name in a.pairs.split(","):
        PAIRS[name](a)


def pair_jpeg(a):
    # jpeg: one loader; the decode function is swapped between rounds
    it = batches(os.path.join(a.work, "jpeg-hdf5"))
    fast, res = readers.decode_jpeg, {"PIL": [], "simplejpeg": []}
    for _ in range(a.rounds):
        for side, fn in (("PIL", pil_decode), ("simplejpeg", fast)):
            readers.decode_jpeg = fn
            timed(it, 4)                    # drain batches decoded by the other side
            res[side].append(timed(it, 15))
    readers.decode_jpeg = fast
    report("jpeg-hdf5", res)


def pair_omp(a):
    # omp: two loaders, their thread pools made with and without the per-thread setting
    real, its = tb.one_intraop_thread, {}
    for side, init in (("default", lambda: None), ("one OpenMP thread", real)):
        tb.one_intraop_thread = init
        its[side] = batches(os.path.join(a.work, "raw-hdf5"))
        timed(its[side], 3)                 # creates the pool with this initializer
    tb.one_intraop_thread = real
    res = {side: [] for side in its}
    for _ in range(a.rounds + 2):
        for side, g in its.items():
            res[side].append(timed(g, 20))
    report("raw-hdf5", res)


def pair_map(a):
    # map: HDF5 read_batch (random batches of 64, two threads) through np.memmap itself vs the
    # plain ndarray view of it that the reader keeps
    ds = fastdata.open(os.path.join(a.work, "raw-hdf5"))
    views = [dict(sh.h["maps"]) for sh in ds.shards]
    rng = np.random.default_rng(0)
    idx = [rng.choice(len(ds), 64, replace=False) for _ in range(100)]
    outs = [np.empty((64, *ds.read_batch([0]).shape[1:]), np.uint8) for _ in range(2)]

    def read_two_threads():
        ths = [threading.Thread(target=lambda t=t: [ds.read_batch(i, out=outs[t])
                                                    for i in idx[t::2]]) for t in range(2)]
        t = time.perf_counter()
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        return 64 * len(idx) / (time.perf_counter() - t)

    res = {"np.memmap": [], "ndarray view": []}
    for _ in range(a.rounds + 2):
        for side in res:
            for sh, v in zip(ds.shards, views):
                sh.h["maps"].update({k: m.base if side == "np.memmap" else m
                                     for k, m in v.items()})
            read_two_threads()
            res[side].append(read_two_threads())
    report("read_batch raw-hdf5", res)


def pair_fused(a):
    # fused: float32 output normalised batch-wide after resizing (before) vs per image (now)
    real = aug.Augment.__call__
    for cl in (False, True):
        it = batches(os.path.join(a.work, "raw-hdf5"), "per_sample", channels_last=cl)
        res = {"whole batch, 3 passes": [], "per image, in cache": []}
        for _ in range(a.rounds):
            for side, fn in zip(res, (unfused_call, real)):
                aug.Augment.__call__ = fn
                timed(it, 4)
                res[side].append(timed(it, 20))
        aug.Augment.__call__ = real
        report(f"raw-hdf5 RRC224 float32 {'channels_last' if cl else 'NCHW'}", res)


def pair_epochs(a):
    # epochs: uint8 channels_last batches (no augmentation), whole epochs, with the batch
    # buffers made afresh at each epoch's start (before) vs kept across epochs (now)
    loader = fastdata.Loader(os.path.join(a.work, "raw-hdf5"), batch_size=64, device="cpu",
                             num_workers=2, dtype="uint8", augment=False, channels_last=True)
    real = tb.TorchBackend.iterate

    def fresh(self, *args):
        self._reader = None
        return real(self, *args)

    def epochs(n=5):
        t, k = time.perf_counter(), 0
        for e in range(n):
            loader.set_epoch(e)
            k += sum(len(x) for x, _ in loader)
        return k / (time.perf_counter() - t)

    res = {"fresh buffers per epoch": [], "buffers kept": []}
    epochs(1)
    for _ in range(a.rounds + 2):
        for side, fn in zip(res, (fresh, real)):
            tb.TorchBackend.iterate = fn
            res[side].append(epochs())
    tb.TorchBackend.iterate = real
    report("raw-hdf5 uint8 channels_last", res)


def pair_flip(a):
    """RRC224 float32 channels_last loader, the resized output mirrored (before) vs the source
    crop mirrored (now)."""
    real = aug.resized_patches
    it = batches(os.path.join(a.work, "raw-hdf5"), "per_sample", channels_last=True)
    res = {"output mirrored": [], "source crop mirrored": []}
    cpu = {side: [] for side in res}
    for _ in range(a.rounds):
        for side, patches in zip(res, (flip_after_resize, real)):
            aug.resized_patches = patches
            timed_cpu(it, res, cpu, side)
    aug.resized_patches = real
    report("raw-hdf5 RRC224 float32 channels_last", res, cpu)


def pair_native(a):
    """RRC224 float32 loader: the torch ops (before) vs the C kernel (now), one loader each."""
    for cl in (False, True):
        its = {side: batches(os.path.join(a.work, "raw-hdf5"), kernel, channels_last=cl)
               for side, kernel in (("torch ops", "per_sample"), ("C kernel", "native"))}
        res, cpu = ({side: [] for side in its} for _ in range(2))
        for _ in range(a.rounds):
            for side, it in its.items():
                timed_cpu(it, res, cpu, side)
        report(f"raw-hdf5 RRC224 float32 {'channels_last' if cl else 'NCHW'}", res, cpu)


PAIRS = {"jpeg": pair_jpeg, "omp": pair_omp, "map": pair_map, "fused": pair_fused,
         "epochs": pair_epochs, "flip": pair_flip, "native": pair_native}


if __name__ == "__main__":
    main()
