"""A/B/C: one CPU training step (fp32, SGD) on batches in memory, by layout: an NCHW model fed
NCHW batches, an NCHW model fed channels_last batches (its convolutions then run channels_last),
and a channels_last model (``TrainStep(channels_last=True)``, what ``fastdata train`` and
``fastdata bench`` use). The three alternate over rounds in one process; figures in
benchmarks/RESULTS.md ("Model layout").

    .venv/bin/python -W ignore benchmarks/ab_layout.py --model resnet8 --crop 64 --batch 32
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from fastdata.env import keep_freed_memory
from fastdata.train import TrainStep, build_model


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet8")
    ap.add_argument("--crop", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    keep_freed_memory()                 # as `fastdata train`/`bench` on a CPU
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(a.batch, 3, a.crop, a.crop, generator=g) for _ in range(4)]
    ys = [torch.randint(0, 10, (a.batch,), generator=g) for _ in range(4)]
    xcl = [x.contiguous(memory_format=torch.channels_last) for x in xs]

    def step(cl):
        torch.manual_seed(0)
        m = build_model(a.model, 10)
        return TrainStep(m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9),
                         precision="fp32", channels_last=cl)
    sides = {"NCHW model, NCHW batches": (step(False), xs),
             "NCHW model, channels_last batches": (step(False), xcl),
             "channels_last model": (step(True), xcl)}
    for s, batches in sides.values():               # warm-up
        for x, y in zip(batches, ys):
            s(x, y)
    runs = {k: [] for k in sides}
    for _ in range(a.rounds):
        for k, (s, batches) in sides.items():
            t = time.perf_counter()
            for _ in range(3):
                for x, y in zip(batches, ys):
                    s(x, y)
            runs[k].append(3 * len(ys) * a.batch / (time.perf_counter() - t))
    base = statistics.median(runs["NCHW model, NCHW batches"])
    print(f"{a.model}, crop {a.crop}, batch {a.batch}, {a.rounds} rounds, img/s medians:")
    for k, v in runs.items():
        m = statistics.median(v)
        print(f"  {k:<36} {m:7.0f}  ({m / base:.2f}x; runs {', '.join(f'{x:.0f}' for x in v)})")


if __name__ == "__main__":
    main()
