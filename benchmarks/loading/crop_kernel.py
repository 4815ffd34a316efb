"""The CPU crop kernel alone (no loader, no Python per image): one thread, 64 random
RandomResizedCrop boxes on 256² uint8 images to 224², each output type and layout, best of 25
calls; this tree and optionally another checkout, alternating in fresh interpreters (the kernel
figures of docs/performance.md):

    python -m benchmarks.loading.crop_kernel --ref /tmp/fd-ref --rounds 3
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

RUN = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np, torch
from fastdata.kernels.cpu import crop_resize
torch.set_num_threads(1)
rng = np.random.default_rng(0)
B = 64
images = list(torch.from_numpy(rng.integers(0, 255, (B, 256, 256, 3), dtype=np.uint8)))
params = []
for k in range(B):
    area = rng.uniform(0.08, 1) * 256 * 256
    aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
    w, h = (int(min(256, round(v))) for v in ((area * aspect) ** .5, (area / aspect) ** .5))
    params.append([rng.integers(0, 256 - h + 1), rng.integers(0, 256 - w + 1), h, w, k % 2])
params = torch.tensor(params)
row = []
for dtype in (torch.float32, torch.bfloat16, torch.uint8):
    for layout in (torch.contiguous_format, torch.channels_last):
        out = torch.empty(B, 3, 224, 224, dtype=dtype, memory_format=layout)
        scale, shift = ((1, 1, 1), (0, 0, 0)) if dtype == torch.uint8 else (
            (1 / 255 / 0.25,) * 3, (-2.0,) * 3)
        best = float("inf")
        for _ in range(25):
            t = time.perf_counter()
            crop_resize(images, params, out, torch.tensor(scale), torch.tensor(shift))
            best = min(best, time.perf_counter() - t)
        name = "channels_last" if layout == torch.channels_last else "NCHW"
        row.append(f"{str(dtype)[6:]} {name} {1000 * best / B:.4f}")
print("; ".join(row))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ref", help="another checkout of fastdata, its kernel built")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    trees = {"this": os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))}
    if a.ref:
        trees["ref"] = os.path.abspath(a.ref)
    for r in range(a.rounds):
        for name, tree in trees.items():
            out = subprocess.run([sys.executable, "-c", RUN, tree], check=True,
                                 capture_output=True, text=True).stdout.strip()
            print(f"round {r} {name} (ms an image): {out}", flush=True)


if __name__ == "__main__":
    main()
