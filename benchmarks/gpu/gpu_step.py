"""``TrainStep`` vs a plain hand-written training loop on synthetic on-device data, and whether
``TrainStep``'s hot loop is free of host syncs (``torch.cuda.set_sync_debug_mode("error")``).
Figures: docs/performance.md, "Feeding a GPU".

    python -m benchmarks.gpu.gpu_step --model resnet50 --batch 256 --crop 224     # on the GPU
    .venv/bin/python -m benchmarks.gpu.gpu_step --device cpu --model resnet8 --batch 16 --crop 64 \\
        --precision fp32 --steps 5 --warmup 2                                  # logic check

Both sides: the same model (channels_last), SGD with momentum, the loader's input dtype for the
precision; the sides alternate over rounds and are timed with CUDA events on a GPU. Needs only
torch (and torchvision for its model names): no shard set, lmdb or simplejpeg.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from fastdata.train.models import build_model
from fastdata.train.step import PRECISIONS, TrainStep, input_dtype


def timed(device: torch.device, fn, steps: int) -> float:
    """Seconds for ``steps`` calls of ``fn``."""
    if device.type == "cuda":
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(steps):
            fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / 1000
    t = time.perf_counter()
    for _ in range(steps):
        fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--crop", type=int, default=224)
    ap.add_argument("--precision", choices=list(PRECISIONS), default="bf16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    dev = torch.device(a.device)
    if dev.type == "cuda":
        torch.backends.cudnn.benchmark = True
    x = torch.randn(a.batch, 3, a.crop, a.crop, device=dev).to(input_dtype(a.precision, dev))
    x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (a.batch,), device=dev)

    def model():
        torch.manual_seed(0)
        m = build_model(a.model, 1000).to(dev, memory_format=torch.channels_last)
        return m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)

    m, opt = model()
    step = TrainStep(m, opt, precision=a.precision, channels_last=True)
    hm, hopt = model()
    ce, low = nn.CrossEntropyLoss(), PRECISIONS[a.precision]
    scaler = torch.amp.GradScaler(dev.type, enabled=a.precision == "fp16")

    def plain():                    # what a careful user writes by hand
        with torch.autocast(dev.type, dtype=low, enabled=low is not None):
            loss = ce(hm(x), y)
        scaler.scale(loss).backward()
        scaler.step(hopt)
        scaler.update()
        hopt.zero_grad(set_to_none=True)

    sides = {"TrainStep": lambda: step(x, y), "hand-written loop": plain}
    for fn in sides.values():
        timed(dev, fn, a.warmup)
    rates: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(a.rounds):
        for k, fn in sides.items():
            rates[k].append(a.steps * a.batch / timed(dev, fn, a.steps))
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(f"{a.model} {a.crop}px batch {a.batch} {a.precision} channels_last on {name}, "
          f"{a.rounds} rounds of {a.steps} steps:")
    for k, v in rates.items():
        print(f"  {k:<18} {statistics.median(v):8.0f} img/s (runs "
              f"{', '.join(f'{r:.0f}' for r in v)})")
    ratio = [s / p for s, p in zip(rates["TrainStep"], rates["hand-written loop"])]
    print(f"  TrainStep / hand-written: {statistics.median(ratio):.3f} (rounds "
          f"{min(ratio):.3f}-{max(ratio):.3f})")
    if dev.type == "cuda" and a.precision != "fp16":    # fp16: GradScaler.step syncs (torch's)
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(a.steps):
                step(x, y)
            verdict = "no host sync"
        except RuntimeError as e:
            verdict = f"a host sync: {e}"
        finally:
            torch.cuda.set_sync_debug_mode(0)
        print(f"  set_sync_debug_mode('error') over {a.steps} TrainStep calls: {verdict}")


if __name__ == "__main__":
    main()
