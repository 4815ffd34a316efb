"""Cut Debian's ukui-wallpapers into ~3000 ImageNet-sized JPEGs for the benchmarks.

    python -m benchmarks.inputs.make_photos /tmp/photos     # fetches the .deb: apt-get download
    python -m benchmarks.inputs.make_photos /tmp/photos --deb ukui-wallpapers_20.04.3-1.1_all.deb
    python -m benchmarks.inputs.make_photos /tmp/photos-2x --scale 2      # web-sized

Random crops with short side 333-500 (aspect 3:4..4:3, either orientation), quality 90, fixed
seed, 10 class folders. The images are never committed: regenerate them with this script.
"""
from __future__ import annotations

import argparse
import glob
import multiprocessing
import os
import random
import subprocess
import tempfile

from PIL import Image


def wallpapers(workdir: str, deb: str | None = None) -> list[str]:
    if deb is None:
        subprocess.run(["apt-get", "download", "ukui-wallpapers"], cwd=workdir, check=True,
                       stdout=subprocess.DEVNULL)
        deb = glob.glob(os.path.join(workdir, "ukui-wallpapers*.deb"))[0]
    subprocess.run(["dpkg", "-x", deb, os.path.join(workdir, "x")], check=True)
    found = glob.glob(os.path.join(workdir, "x", "**", "*.*"), recursive=True)
    return sorted(p for p in found if p.lower().endswith((".jpg", ".jpeg", ".png")))


def sources(deb: str | None = None) -> list[Image.Image]:
    """The wallpapers, decoded to RGB."""
    with tempfile.TemporaryDirectory() as tmp:
        return [Image.open(p).convert("RGB") for p in wallpapers(tmp, deb)]


def plans(images: list[Image.Image], count: int, seed: int, scale: float = 1.0):
    """``(source index, size, box)`` of ``count`` random ImageNet-sized crops of ``images``
    (``scale`` times larger: 2 for web-sized photos)."""
    rng = random.Random(seed)
    for i in range(count):
        src = images[i % len(images)]
        short = round(rng.randint(333, 500) * scale)
        long = int(short * rng.uniform(1.0, 4 / 3) + 0.5)
        w, h = (long, short) if rng.random() < 0.75 else (short, long)
        zoom = rng.uniform(1.0, min(src.width / w, src.height / h))  # crop zoom-out, then resize
        cw, ch = int(w * zoom), int(h * zoom)
        x, y = rng.randint(0, src.width - cw), rng.randint(0, src.height - ch)
        yield i % len(images), (w, h), (x, y, x + cw, y + ch)


def crop(images: list[Image.Image], plan) -> Image.Image:
    src, size, box = plan
    return images[src].resize(size, Image.BICUBIC, box=box)


def crops(images: list[Image.Image], count: int, seed: int):
    """``count`` random ImageNet-sized crops of ``images`` (PIL images, before JPEG coding)."""
    return (crop(images, p) for p in plans(images, count, seed))


_IMAGES: list = []      # the sources, inherited by the forked savers


def _save(job) -> None:
    i, plan, out, classes = job
    path = os.path.join(out, f"class_{i % classes:02d}", f"{i:05d}.jpg")
    crop(_IMAGES, plan).save(path, quality=90)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--count", type=int, default=3000)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", type=float, default=1.0,
                    help="short sides of 333-500 px times this (2: web-sized photos, 666-1000)")
    ap.add_argument("--deb", help="a downloaded ukui-wallpapers .deb (on a machine with no "
                    "package registry, e.g. the GPU machine)")
    args = ap.parse_args()
    for c in range(args.classes):
        os.makedirs(os.path.join(args.out, f"class_{c:02d}"), exist_ok=True)
    _IMAGES[:] = sources(args.deb)
    jobs = [(i, p, args.out, args.classes)
            for i, p in enumerate(plans(_IMAGES, args.count, args.seed, args.scale))]
    with multiprocessing.get_context("fork").Pool() as pool:   # the same files, on every core
        for _ in pool.imap_unordered(_save, jobs, chunksize=16):
            pass


if __name__ == "__main__":
    main()
