"""JPEG chroma upsampling in the converter: libjpeg-turbo's default ("fancy") against its fast
one, scored against the pixels before JPEG coding (figures in RESULTS.md).

    python benchmarks/upsampling.py --deb /tmp/ukui-wallpapers_20.04.3-1.1_all.deb

Crops are made as ``make_photos.py`` makes them (another seed), JPEG-coded at quality 90 in
memory, decoded both ways by simplejpeg and fitted to each size as the converter does (centre
crop, bicubic). For each, PSNR against the same fit of the crop before coding; the difference
(fast − fancy, dB) is grouped by how much the decoded image is shrunk. Then decode time per
image, both ways, on the photos at their full size (the converter's case at 256 px).
"""
from __future__ import annotations

import argparse
import io
import math
import os
import sys
import time

import numpy as np
import simplejpeg
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_photos import crops, sources  # noqa: E402

BINS = ((0.5, 0.9), (0.9, 1.1), (1.1, 1.25), (1.25, 1.4), (1.4, 1.6), (1.6, 2.0))


def fit(img: Image.Image, size: int) -> np.ndarray:
    w, h = img.size
    s = min(w, h)
    x, y = (w - s) / 2, (h - s) / 2
    return np.asarray(img.resize((size, size), Image.BICUBIC, box=(x, y, x + s, y + s)),
                      np.float64)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a - b) ** 2)
    return 10 * math.log10(255 ** 2 / mse) if mse else math.inf


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deb", help="a downloaded ukui-wallpapers .deb (else apt-get download)")
    ap.add_argument("--count", type=int, default=150)
    ap.add_argument("--sizes", default="256,384,512")
    args = ap.parse_args()
    rows, coded = [], []        # (shrink, fast - fancy dB)
    for img in crops(sources(args.deb), args.count, seed=1):
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=90)
        coded.append(buf.getvalue())
        fancy, fast = (Image.fromarray(simplejpeg.decode_jpeg(coded[-1], colorspace="RGB",
                                                              fastupsample=f))
                       for f in (False, True))
        for size in map(int, args.sizes.split(",")):
            truth = fit(img, size)
            a, b = psnr(fit(fancy, size), truth), psnr(fit(fast, size), truth)
            if math.isfinite(a) and math.isfinite(b):
                rows.append((min(img.size) / size, b - a))
    rows = np.array(rows)
    print(f"{args.count} crops, sizes {args.sizes}: PSNR against the crop before JPEG coding, "
          f"fast - fancy upsampling (dB)")
    for lo, hi in BINS:
        d = rows[(rows[:, 0] >= lo) & (rows[:, 0] < hi), 1]
        if len(d):
            print(f"  shrunk {lo:.2f}-{hi:.2f}x: n={len(d):3d}  median {np.median(d):+.2f}  "
                  f"range {d.min():+.2f} .. {d.max():+.2f}")
    for _ in range(2):      # the second pass is the one to read (caches warm)
        ms = {}
        for f in (False, True):
            t = time.process_time()
            for data in coded:
                simplejpeg.decode_jpeg(data, colorspace="RGBX", fastupsample=f)
            ms[f] = (time.process_time() - t) / len(coded) * 1e3
    print(f"decode, full size: fancy {ms[False]:.3f} ms, fast {ms[True]:.3f} ms of CPU per "
          f"image ({ms[False] / ms[True]:.2f}x)")


if __name__ == "__main__":
    main()
