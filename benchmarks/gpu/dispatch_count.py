"""Operations a batch transform queues on its device per batch, counted without a GPU.

    python -m benchmarks.gpu.dispatch_count [--batch 256] [--size 224]

On a GPU each operation on the batch is a kernel launch the training loop's thread pays for
in host time. The batch lives on PyTorch's ``meta`` device here (shapes, no data), so every
operation that touches it is counted and nothing is computed; what a transform draws and
computes on the host is counted apart. A CPU generator stands in for the device's: the draws
are made on the host either way. Only transforms whose CUDA path is plain torch operations are
listed (the Triton kernels of ColorJitter and RandomErasing have no meta path: each is one or
two launches on CUDA).
"""
from __future__ import annotations

import argparse

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from fastdata import transforms as T


class Count(TorchDispatchMode):
    """Operations dispatched, split by whether one of their tensors is on the meta device."""

    def __init__(self):
        super().__init__()
        self.device = self.host = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        on_device = any(isinstance(t, torch.Tensor) and t.device.type == "meta"
                        for t in tree_leaves((args, kwargs)))
        if on_device:
            self.device += 1
        else:
            self.host += 1
        return func(*args, **kwargs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--size", type=int, default=224)
    a = ap.parse_args()
    transforms = {
        "TrivialAugment": T.TrivialAugment(),
        "MixUp": T.MixUp(0.8, num_classes=1000),
        "CutMix": T.CutMix(1.0, num_classes=1000),
        "RandomGrayscale": T.RandomGrayscale(0.2),
    }
    print(f"batch {a.batch}, {a.size}px: operations on the batch's device, on the host")
    for name, fn in transforms.items():
        x = torch.empty(a.batch, 3, a.size, a.size, device="meta")
        x = x.contiguous(memory_format=torch.channels_last)
        labels = torch.zeros(a.batch, dtype=torch.long, device="meta")
        with Count() as c:
            fn(x, labels, generator=torch.Generator().manual_seed(0))
        print(f"  {name:<16} {c.device:5d} {c.host:5d}")


if __name__ == "__main__":
    main()
