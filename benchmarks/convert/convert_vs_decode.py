"""The converter against a loop that only decodes the same photos on the same cores.

    python -W ignore -m benchmarks.convert.convert_vs_decode /tmp/photos --workers 2 --rounds 3

Each round, in a fresh interpreter each (no import or page cache advantage for either), the
sides alternating which goes first:
- ``convert``: ``fastdata.converters.convert.convert(photos, tmp, sizes=[SIZE], num_workers=N)``,
  raw HDF5, its whole wall time (scan, decode, resize, pack, write, manifest);
- ``decode (scaled)``: N processes that each read and decode their share of the files with
  libjpeg-turbo at the smallest DCT scale that still covers SIZE (what the converter decodes,
  simplejpeg's ``min_width``/``min_height``), and nothing else;
- ``decode (full)``: the same at full resolution.
Printed: img/s of each, medians of the rounds, and the converter's share of each decode loop;
then where a converter worker's CPU goes, per image, in one process over the first 1000 photos
(best of 3 passes): reading and decoding (``decode._load``), fitting to the square
(``decode.fit_square``, Pillow's bicubic resize), packing into a ring slot and its CRC.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

CONVERT = """
import sys, time, shutil
from fastdata.converters.convert import convert
out, t = sys.argv[2], time.perf_counter()
m = convert(sys.argv[1], out, sizes=[int(sys.argv[3])], num_workers=int(sys.argv[4]),
            overwrite=True, progress=False)
print(m["num_samples"] / (time.perf_counter() - t))
shutil.rmtree(out)
"""

DECODE = """
import multiprocessing as mp, os, sys, time
import simplejpeg

def files(root):
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
                  if f.lower().endswith((".jpg", ".jpeg")))

def decode(job):
    paths, size = job
    for p in paths:
        with open(p, "rb") as f:
            data = f.read()
        if size:
            h, w, _, _ = simplejpeg.decode_jpeg_header(data)
            k = next((s for s in (8, 4, 2) if min(w, h) // size >= s), 1)
            simplejpeg.decode_jpeg(data, colorspace="RGB", min_width=-(-w // k),
                                   min_height=-(-h // k))
        else:
            simplejpeg.decode_jpeg(data, colorspace="RGB")
    return len(paths)

if __name__ == "__main__":
    paths, size, n = files(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    t = time.perf_counter()
    with mp.get_context("fork").Pool(n) as pool:
        done = sum(pool.map(decode, [(paths[k::n], size) for k in range(n)]))
    print(done / (time.perf_counter() - t))
"""

STEPS = """
import os, sys, time
import numpy as np
from fastdata.converters.decode import DecodeOptions, Scratch, _load, fit_square, pack_into
from fastdata.format import crc32
root, size = sys.argv[1], int(sys.argv[2])
paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
               if f.lower().endswith((".jpg", ".jpeg")))[:1000]
opts, scratch = DecodeOptions(sizes=(size,)), Scratch()
slot = np.empty(3 * size * size, np.uint8)
best = [float("inf")] * 3
for _ in range(3):
    t = [0.0] * 3
    for p in paths:
        a = time.process_time()
        img = _load(p, opts, scratch)
        b = time.process_time()
        sq = fit_square(img, size, "crop")
        c = time.process_time()
        pack_into(sq, slot)
        crc32(slot)
        t = [t[0] + b - a, t[1] + c - b, t[2] + time.process_time() - c]
    best = [min(x, y) for x, y in zip(best, t)]
print(" ".join(f"{1e3 * x / len(paths):.3f}" for x in best))
"""


def child(code: str, *args) -> str:
    """``code`` run in a fresh interpreter with ``args``; its last line of output."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(code)
    try:
        out = subprocess.run([sys.executable, f.name, *map(str, args)], check=True,
                             capture_output=True, text=True)
    finally:
        os.remove(f.name)
    return out.stdout.strip().splitlines()[-1]


def run(code: str, *args) -> float:
    return float(child(code, *args))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("photos")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="fd-convert-")
    out = os.path.join(work, "set")
    sides = {"convert": lambda: run(CONVERT, a.photos, out, a.size, a.workers),
             "decode (scaled)": lambda: run(DECODE, a.photos, a.size, a.workers),
             "decode (full)": lambda: run(DECODE, a.photos, 0, a.workers)}
    rates: dict[str, list[float]] = {k: [] for k in sides}
    for r in range(a.rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for name in order:
            rates[name].append(sides[name]())
    shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    for k, v in rates.items():
        print(f"{k}: {med[k]:.0f} img/s (rounds {', '.join(f'{x:.0f}' for x in v)})")
    for k in ("decode (scaled)", "decode (full)"):
        share = [c / d for c, d in zip(rates["convert"], rates[k])]
        print(f"convert / {k}: {statistics.median(share):.2f} "
              f"(rounds {min(share):.2f}-{max(share):.2f})")
    load, fit, pack = map(float, child(STEPS, a.photos, a.size).split())
    print(f"a worker's CPU ms an image: read and decode {load:.3f}, fit to {a.size} px {fit:.3f}, "
          f"pack and CRC {pack:.3f}")


if __name__ == "__main__":
    main()
