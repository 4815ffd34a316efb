"""Where a GPU training step fed by a ``fastdata.Loader`` loses time against its ceiling.

Each variant below adds one part of the loader's work to the same ``TrainStep`` on one fixed
on-device batch, so the part that costs shows:

  augment alone  the loader's GPU crop/resize/normalise of a stored uint8 batch, no step
  ceiling        the step alone
  gpu-augment    + the loader's GPU crop/resize/normalise of a stored uint8 batch, each step
  h2d            + a pinned uint8 batch copied to the GPU on a side stream, each step
  reads-N        + N threads reading random batches (``read_batch``) into pinned memory, all
                   the time (the CPU and GIL share of the loader's threads)
  takes-N        + the same, each batch gathered by one ``np.take`` (one GIL release per batch
                   instead of one per sample: raw HDF5 only)
  loader-N       fed by ``fastdata.Loader`` with N threads (what ``fastdata bench`` measures)
  procs-N        fed by ``fastdata.Loader`` with N worker processes (``workers="process"``)
  R alone        with ``--recipes R``: recipe R's ``batch_transform`` on an on-device batch, no step
  R-N            fed by ``fastdata.Loader`` with N threads and recipe R as its ``batch_transform``
                 (``heavy``: ColorJitter + RandomErasing + MixUp or CutMix, as in recipes.py;
                 ``trivial``: the batched TrivialAugment); the ceiling stays the step without one

    python -m benchmarks.gpu.gpu_fed /tmp/raw --model resnet18      # a raw shard set stored at 256
    python -m benchmarks.gpu.gpu_fed /tmp/raw --profile $OUT/fed.json   # + where 10 fed steps go
    python -m benchmarks.gpu.gpu_fed /tmp/raw --model resnet50 --procs "" --recipes heavy,trivial

Needs a CUDA device; ``--device cpu --model resnet8 --batch 16 --crop 24 --steps 3`` checks the
logic on a CPU.
"""
from __future__ import annotations

import argparse
import statistics
import threading

import numpy as np
import torch

import fastdata
from benchmarks.gpu.gpu_step import timed
from benchmarks.loading.recipes import heavy_recipe
from fastdata import transforms as T
from fastdata.ops.crop import CropStage
from fastdata.train.models import build_model
from fastdata.train.step import TrainStep, input_dtype

RECIPES = {"heavy": lambda classes: heavy_recipe(classes)[0],
           "trivial": lambda classes: T.TrivialAugment()}


def rate(dev, fn, steps: int, batch: int, rounds: int = 3) -> float:
    """Median img/s of ``rounds`` timings of ``steps`` calls, after one untimed call."""
    fn()
    return statistics.median(steps * batch / timed(dev, fn, steps) for _ in range(rounds))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shards")
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--crop", type=int, default=224)
    ap.add_argument("--size", type=int, default=None, help="the stored size to read (default: "
                    "the set's largest)")
    ap.add_argument("--threads", default="4,16")
    ap.add_argument("--procs", default="8", help="worker-process counts ('' for none)")
    ap.add_argument("--recipes", default="", help=f"batch_transform recipes fed with each "
                    f"thread count, of {sorted(RECIPES)} ('' for none)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--profile", help="also profile 10 steps fed by the last loader: the top "
                    "kernels/ops here, the timeline (chrome trace) to this file")
    a = ap.parse_args()
    recipes = [r for r in a.recipes.split(",") if r]
    for r in recipes:
        if r not in RECIPES:
            ap.error(f"--recipes: unknown recipe {r!r}; valid: {sorted(RECIPES)}")
    dev = torch.device(a.device)
    torch.backends.cudnn.benchmark = dev.type == "cuda"
    ds = fastdata.open(a.shards, size=a.size)
    s, b = ds.size, a.batch
    dtype = input_dtype("bf16" if dev.type == "cuda" else "fp32", dev)
    torch.manual_seed(0)
    model = build_model(a.model, len(ds.classes)).to(dev, memory_format=torch.channels_last)
    step = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                     precision="bf16" if dev.type == "cuda" else "fp32", channels_last=True)
    aug = CropStage(train=True, crop=a.crop, dtype=dtype, channels_last=True)
    idx = np.arange(b) % len(ds)
    raw = torch.from_numpy(ds.read_batch(idx))
    y = torch.from_numpy(ds.labels[idx]).long().to(dev)
    x = aug(raw, torch.Generator().manual_seed(0)).to(dev)
    raw_dev = raw.to(dev)
    pinned = raw.pin_memory() if dev.type == "cuda" else raw
    side = torch.cuda.Stream(dev) if dev.type == "cuda" else None
    g = torch.Generator().manual_seed(1)
    rows = {}

    def h2d():
        if side is None:
            step(x, y)
            return
        with torch.cuda.stream(side):
            moved = pinned.to(dev, non_blocking=True)
        torch.cuda.current_stream(dev).wait_stream(side)
        moved.record_stream(torch.cuda.current_stream(dev))
        step(x, y)

    rows["augment alone"] = rate(dev, lambda: aug(raw_dev, g), a.steps, b)
    unit = torch.rand(x.shape, device=dev).contiguous(memory_format=torch.channels_last)
    for r in recipes:
        fn, gen = RECIPES[r](len(ds.classes)), torch.Generator(dev).manual_seed(2)
        rows[f"{r} alone"] = rate(dev, lambda: fn(unit.clone(), y, generator=gen), a.steps, b)
    rows["ceiling"] = rate(dev, lambda: step(x, y), a.steps, b)
    rows["gpu-augment"] = rate(dev, lambda: step(aug(raw_dev, g), y), a.steps, b)
    rows["h2d"] = rate(dev, h2d, a.steps, b)
    for n in (int(t) for t in a.threads.split(",")):

        def reader(seed, take):
            r = np.random.default_rng(seed)
            buf = torch.empty((b, s, s, 3), dtype=torch.uint8,
                              pin_memory=dev.type == "cuda").numpy()
            while not stop.is_set():
                if take:        # shard 0 only: a gather with no Python per sample
                    np.take(mm, np.sort(r.integers(0, len(mm), b)), axis=0, out=buf)
                else:
                    ds.read_batch(r.integers(0, len(ds), b), out=buf)
        mm = ds.shards[0].h["maps"][s] if ds.raw_views([0]) is not None else None
        for name, take in (("reads", False), ("takes", True)):
            if take and mm is None:
                continue
            stop = threading.Event()
            threads = [threading.Thread(target=reader, args=(k, take), daemon=True)
                       for k in range(n)]
            for t in threads:
                t.start()
            rows[f"{name}-{n}"] = rate(dev, lambda: step(x, y), a.steps, b)
            stop.set()
            for t in threads:
                t.join()
        it = _fed(ds, a, dev, dtype, num_workers=n)
        rows[f"loader-{n}"] = rate(dev, lambda: step(*next(it)), a.steps, b)
        for r in recipes:
            fed = _fed(ds, a, dev, dtype, num_workers=n,
                       batch_transform=RECIPES[r](len(ds.classes)))
            rows[f"{r}-{n}"] = rate(dev, lambda: step(*next(fed)), a.steps, b)
    for n in (int(p) for p in a.procs.split(",") if p):
        procs = _fed(ds, a, dev, dtype, backend=fastdata.TorchBackend(num_workers=n,
                                                                      workers="process"))
        rows[f"procs-{n}"] = rate(dev, lambda: step(*next(procs)), a.steps, b)
    if a.profile:
        _profile(dev, lambda: step(*next(it)), a.profile)
    for loader in _LOADERS:
        loader.close()
    top = rows["ceiling"]
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(f"{a.model} batch {b}, {s}px stored → {a.crop}, {dtype} channels_last on {name}:")
    for k, v in rows.items():
        print(f"  {k:<14} {v:8.0f} img/s  {v / top:6.1%} of the ceiling")


_LOADERS: list = []     # closed at the end (worker processes left running make noise)


def _profile(dev, fn, path: str) -> None:
    from torch.profiler import ProfilerActivity, profile

    cuda = dev.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * cuda) as prof:
        for _ in range(10):
            fn()
        if cuda:
            torch.cuda.synchronize(dev)
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=25))
    prof.export_chrome_trace(path)


def _fed(ds, a, dev, dtype, **kw):
    """Endless training batches from a ``fastdata.Loader`` over ``ds``."""
    loader = fastdata.Loader(ds, batch_size=a.batch, crop=a.crop, device=dev, dtype=dtype,
                             drop_last=True, **kw)
    _LOADERS.append(loader)
    return iter(_forever(loader))


def _forever(loader):
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        yield from loader
        epoch += 1


if __name__ == "__main__":
    main()
