"""The converter against a loop that only decodes the same photos on the same cores.

    python -W ignore benchmarks/convert_vs_decode.py /tmp/photos --workers 2 --rounds 3

Each round, in a fresh interpreter each (no import or page cache advantage for either), the
sides alternating which goes first:
- ``convert``: ``fastdata.converters.convert.convert(photos, tmp, sizes=[SIZE], workers=N)``,
  raw HDF5, its whole wall time (scan, decode, resize, pack, write, manifest);
- ``decode (scaled)``: N processes that each read and decode their share of the files with
  libjpeg-turbo at the smallest DCT scale that still covers SIZE (what the converter decodes,
  simplejpeg's ``min_width``/``min_height``), and nothing else;
- ``decode (full)``: the same at full resolution.
Printed: img/s of each, medians of the rounds, and the converter's share of each decode loop.
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
m = convert(sys.argv[1], out, sizes=[int(sys.argv[3])], workers=int(sys.argv[4]),
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


def run(code: str, *args) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(code)
    try:
        out = subprocess.run([sys.executable, f.name, *map(str, args)], check=True,
                             capture_output=True, text=True)
    finally:
        os.remove(f.name)
    return float(out.stdout.split()[-1])


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


if __name__ == "__main__":
    main()
