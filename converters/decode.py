"""Worker-side image preparation: open → fix orientation/mode → fit to squares → encode.

Runs in worker processes; pure functions of (path, options), so output is deterministic.
"""
from __future__ import annotations

import io
import math
import warnings
import zlib
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps

from fastdata.format import BACKGROUND

_RESAMPLE = Image.Resampling.BICUBIC


@dataclass(frozen=True)
class DecodeOptions:
    sizes: tuple[int, ...]          # ascending
    fit: str = "crop"
    encoding: str = "raw"
    quality: int = 90


def to_rgb(img: Image.Image) -> Image.Image:
    """Any PIL mode → 8-bit RGB; alpha is composited onto ``BACKGROUND``, 16-bit is scaled."""
    if img.mode == "RGB":
        return img
    if img.mode in ("I", "F") or img.mode.startswith("I;16"):
        a = np.asarray(img).astype(np.float64)
        if img.mode.startswith("I;16") or (img.mode == "I" and a.max(initial=0) > 255):
            hi = 65535.0
        else:
            hi = 1.0 if (img.mode == "F" and a.max(initial=0) <= 1.0) else 255.0
        a = np.clip(a * (255.0 / hi) + 0.5, 0, 255).astype(np.uint8)
        return Image.fromarray(a, "L").convert("RGB")
    has_alpha = img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (
        img.mode == "P" and "transparency" in img.info)
    if has_alpha:
        rgba = img.convert("RGBA")
        bg = Image.new("RGB", rgba.size, BACKGROUND)
        bg.paste(rgba, mask=rgba.getchannel("A"))
        return bg
    return img.convert("RGB")


def _draft_request(w: int, h: int, size: int, fit: str) -> tuple[int, int]:
    """Smallest decoded (w, h) that still leaves every needed side >= size."""
    if fit == "crop":
        k = size / min(w, h)
    elif fit == "pad":
        k = size / max(w, h)
    else:   # stretch: each side independently
        return min(w, size), min(h, size)
    return math.ceil(w * k), math.ceil(h * k)


def fit_square(img: Image.Image, size: int, fit: str) -> Image.Image:
    w, h = img.size
    if fit == "stretch":
        return img.resize((size, size), _RESAMPLE)
    if fit == "crop":
        s = min(w, h)
        x, y = (w - s) / 2, (h - s) / 2
        return img.resize((size, size), _RESAMPLE, box=(x, y, x + s, y + s))
    k = size / max(w, h)    # pad: fit the longer side, centre on the background
    nw, nh = max(1, round(w * k)), max(1, round(h * k))
    out = Image.new("RGB", (size, size), BACKGROUND)
    out.paste(img.resize((nw, nh), _RESAMPLE), ((size - nw) // 2, (size - nh) // 2))
    return out


def encode(img: Image.Image, opts: DecodeOptions) -> bytes:
    if opts.encoding == "raw":
        return img.tobytes()
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=opts.quality)
    return buf.getvalue()


def prepare(path: str, opts: DecodeOptions) -> list[bytes]:
    """Payloads for ``path``, one per size (ascending). Raises on unreadable input."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # EXIF/metadata chatter; real damage still raises
        with Image.open(path) as img:
            if img.format == "JPEG":
                img.draft("RGB", _draft_request(*img.size, opts.sizes[-1], opts.fit))
            img = ImageOps.exif_transpose(img)   # loads the pixels: truncation raises here
            img = to_rgb(img)
    largest = fit_square(img, opts.sizes[-1], opts.fit)
    squares = [largest] + [largest.resize((s, s), _RESAMPLE) for s in opts.sizes[-2::-1]]
    return [encode(sq, opts) for sq in reversed(squares)]


def prepare_batch(jobs: list[tuple[int, str]], opts: DecodeOptions) -> list[tuple]:
    """Worker entry: ``[(position, path)]`` → ``[(position, payloads, crc32s, error)]``."""
    out = []
    for pos, path in jobs:
        try:
            payloads = prepare(path, opts)
            out.append((pos, payloads, [zlib.crc32(p) for p in payloads], None))
        except Exception as e:      # noqa: BLE001 - any failure is a skipped input, reported
            out.append((pos, None, None, f"{type(e).__name__}: {e}"))
    return out
