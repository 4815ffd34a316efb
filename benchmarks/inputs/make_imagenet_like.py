"""A deterministic ImageNet-shaped folder: N JPEGs over 1000 class folders, of varied sizes and
aspect ratios, cheap to make (a pool of distinct JPEGs, encoded once, written N times).

    .venv/bin/python -m benchmarks.inputs.make_imagenet_like /tmp/inet-10k --images 10000

Sizes: short side 64-200 px, aspect 3:4..4:3 either way, quality 90; file ``k`` is pool image
``hash(k) % pool`` in class ``k % classes``, named ``img_<k>.jpg``. The folder is complete once
``.done`` is written (a run killed halfway is redone).
"""
from __future__ import annotations

import argparse
import io
import os

import numpy as np
from PIL import Image


def pool(count: int, seed: int) -> list[bytes]:
    """``count`` distinct JPEGs: smooth random colour fields at random sizes."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        short = int(rng.integers(64, 201))
        long = int(short * rng.uniform(1.0, 4 / 3))
        w, h = (long, short) if rng.random() < 0.5 else (short, long)
        small = Image.fromarray(rng.integers(0, 256, (4, 4, 3), np.uint8))
        buf = io.BytesIO()
        small.resize((w, h), Image.BILINEAR).save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def make(root: str, images: int, classes: int = 1000, pool_size: int = 512,
         seed: int = 0) -> str:
    """Write the folder (skipped where ``root/.done`` says it is complete); returns root."""
    done = os.path.join(root, ".done")
    if os.path.exists(done):
        return root
    jpegs = pool(pool_size, seed)
    for c in range(classes):
        os.makedirs(os.path.join(root, f"n{c:05d}"), exist_ok=True)
    pick = np.random.default_rng(seed + 1).integers(0, pool_size, images)
    for k in range(images):
        with open(os.path.join(root, f"n{k % classes:05d}", f"img_{k:08d}.jpg"), "wb") as f:
            f.write(jpegs[pick[k]])
    open(done, "w").close()
    return root


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", help="folder to write")
    ap.add_argument("--images", type=int, required=True, help="number of JPEGs")
    ap.add_argument("--classes", type=int, default=1000, help="class folders (default 1000)")
    ap.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    a = ap.parse_args()
    make(a.root, a.images, a.classes, seed=a.seed)


if __name__ == "__main__":
    main()
