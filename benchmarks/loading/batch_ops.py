"""CPU time of each batch operation of ``fastdata.transforms``, per image, on one thread.

    python -m benchmarks.loading.batch_ops [--batch 64] [--size 224] [--repeat 5]

A channels_last float32 batch of ``torch.rand`` images, as the loader hands a batch transform;
each operation runs on a fresh copy, the best of ``--repeat`` runs. ColorJitter is timed as
fastdata runs it (the C kernel, where built), with the loader's normalisation folded into its
pass, and as the torch operations one after another (its path without the kernel, and on a
GPU).
"""
from __future__ import annotations

import argparse
import time

import torch

from fastdata import transforms as T
from fastdata.kernels import cpu
from fastdata.ops import color as C
from fastdata.ops.normalize import Normalize


def per_image_ms(fn, x: torch.Tensor, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        y = x.clone(memory_format=torch.channels_last)
        t = time.perf_counter()
        fn(y)
        best = min(best, time.perf_counter() - t)
    return 1000 * best / len(x)


def torch_jitter(op: T.ColorJitter):
    """``op``'s adjustments as torch operations, with one factor per image."""
    def run(x):
        g = torch.Generator().manual_seed(0)
        for k, (fn, rng, identity) in enumerate([
                (C.adjust_brightness, op.brightness, (1.0, 1.0)),
                (C.adjust_contrast, op.contrast, (1.0, 1.0)),
                (C.adjust_saturation, op.saturation, (1.0, 1.0)),
                (C.adjust_hue, op.hue, (0.0, 0.0))]):
            if rng != identity:
                lo, hi = rng
                x = fn(x, lo + (hi - lo) * torch.rand(len(x), 1, 1, 1, generator=g))
        return x
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(1)        # as in a loader's worker thread
    x = torch.rand(a.batch, 3, a.size, a.size).contiguous(memory_format=torch.channels_last)
    labels = torch.arange(a.batch) % 10
    g = torch.Generator().manual_seed(0)
    jitter, no_hue = T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.ColorJitter(0.4, 0.4, 0.4)
    norm = Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225), torch.float32,
                       torch.channels_last)
    ops = {
        "ColorJitter(0.4, 0.4, 0.4, 0.1)": lambda y: jitter(y, labels, generator=g),
        "ColorJitter(0.4, 0.4, 0.4)": lambda y: no_hue(y, labels, generator=g),
        "ColorJitter(0.4, 0.4, 0.4, 0.1), normalising": lambda y: jitter.fold_normalization(
            norm.scale, norm.shift)(y, labels, generator=g),
        "ColorJitter(0.4, 0.4, 0.4, 0.1), torch ops": torch_jitter(jitter),
        "ColorJitter(0.4, 0.4, 0.4), torch ops": torch_jitter(no_hue),
        "RandomErasing(0.25)": lambda y: T.RandomErasing(0.25)(y, labels, generator=g),
        "MixUp(0.8)": lambda y: T.MixUp(0.8, num_classes=10)(y, labels, generator=g),
        "CutMix(1.0)": lambda y: T.CutMix(1.0, num_classes=10)(y, labels, generator=g),
        "TrivialAugment()": lambda y: T.TrivialAugment()(y, labels, generator=g),
        "normalisation after a batch transform": norm,
    }
    print(f"batch {a.batch} x 3 x {a.size}^2 float32 channels_last, one thread, "
          f"C kernel {'built' if cpu.available() else 'NOT built'}; ms per image:")
    for name, fn in ops.items():
        print(f"  {name:<45} {per_image_ms(fn, x, a.repeat):7.3f}")


if __name__ == "__main__":
    main()
