"""The built-in sample dataset: a small, learnable image folder drawn on the fly.

Classes are shapes (circle, square, triangle, cross, ring, bars) in random colours, positions
and sizes over noisy backgrounds. Files are deliberately mixed like real folders: JPEG and PNG,
varied sizes and aspect ratios, some grayscale, some RGBA with transparent backgrounds.
"""
from __future__ import annotations

import os
import shutil

import numpy as np
from PIL import Image, ImageDraw

CLASSES = ("bars", "circle", "cross", "ring", "square", "triangle")


def _draw(shape: str, w: int, h: int, rng: np.random.Generator) -> Image.Image:
    bg = rng.integers(0, 256, 3)
    noise = rng.normal(0, 18, (h, w, 3))
    img = Image.fromarray(np.clip(bg + noise, 0, 255).astype(np.uint8), "RGB")
    d = ImageDraw.Draw(img)
    colour = tuple(int(c) for c in (bg + rng.integers(80, 176, 3)) % 256)
    r = rng.uniform(0.22, 0.4) * min(w, h)
    cx, cy = rng.uniform(r, w - r), rng.uniform(r, h - r)
    lw = max(2, int(r / 4))
    if shape == "circle":
        d.ellipse((cx - r, cy - r, cx + r, cy + r), fill=colour)
    elif shape == "ring":
        d.ellipse((cx - r, cy - r, cx + r, cy + r), outline=colour, width=lw)
    elif shape == "square":
        d.rectangle((cx - r, cy - r, cx + r, cy + r), fill=colour)
    elif shape == "triangle":
        d.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=colour)
    elif shape == "cross":
        d.rectangle((cx - r, cy - lw, cx + r, cy + lw), fill=colour)
        d.rectangle((cx - lw, cy - r, cx + lw, cy + r), fill=colour)
    else:  # bars
        for k in (-1, 0, 1):
            x = cx + k * r * 0.7
            d.rectangle((x - lw / 2, cy - r, x + lw / 2, cy + r), fill=colour)
    return img


def make_sample_folder(root: str, *, per_class: int = 80, seed: int = 0) -> str:
    """Write the sample image folder ``root`` (ImageFolder layout) and return ``root``.

    Drawn beside it and renamed when complete: ``root`` exists only whole (a demo stopped
    while drawing used to go on next time with the classes drawn so far).
    """
    partial = root.rstrip(os.sep) + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    _draw_folder(partial, per_class, seed)
    os.replace(partial, root)
    return root


def _draw_folder(root: str, per_class: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for shape in CLASSES:
        os.makedirs(os.path.join(root, shape), exist_ok=True)
        for i in range(per_class):
            w, h = (int(x) for x in rng.integers(64, 200, 2))
            img = _draw(shape, w, h, rng)
            kind = rng.choice(["jpeg", "jpeg", "png", "gray", "rgba"])
            base = os.path.join(root, shape, f"{shape}_{i:04d}")
            if kind == "jpeg":
                img.save(base + ".jpg", quality=int(rng.integers(70, 96)))
            elif kind == "png":
                img.save(base + ".png")
            elif kind == "gray":
                img.convert("L").save(base + (".png" if i % 2 else ".jpg"))
            else:
                a = img.convert("RGBA")
                a.putalpha(Image.fromarray((rng.random((h, w)) > 0.1).astype(np.uint8) * 255))
                a.save(base + ".png")
