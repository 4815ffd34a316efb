"""Convert throughput of this tree vs another checkout of fastdata (e.g. an older commit), the
runs interleaved round by round so machine noise hits both alike; figures in RESULTS.md.

    git worktree add /tmp/fd-ref 1d069fc
    .venv/bin/python -W ignore benchmarks/ab_convert.py /tmp/photos --ref /tmp/fd-ref

Each conversion runs in a fresh interpreter with its tree first on ``sys.path`` and times only
the ``convert()`` call (the same as ``benchmarks/convert.py`` measures). First, in this tree:
the worker's per-image CPU time with the simplejpeg decode path vs PIL's decoder.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

RUN = """
import sys, time
sys.path.insert(0, sys.argv[1])
from converters.convert import convert
t = time.perf_counter()
m = convert(sys.argv[2], sys.argv[3], container=sys.argv[4], sizes=[int(sys.argv[5])],
            overwrite=True, progress=False)
print(m["num_samples"] / (time.perf_counter() - t))
"""


def decode_ab(photos: str, size: int, rounds: int, n: int = 300) -> None:
    """Worker CPU time of ``prepare`` per image: simplejpeg into RGBX vs PIL's decoder (the
    fast path switched off, as in tests/test_convert_inputs.py), interleaved rounds."""
    from converters import decode
    from converters.scan import scan_folder

    files = [os.path.join(photos, p) for p, _ in scan_folder(photos).files[:n]]
    opts = decode.DecodeOptions(sizes=(size,))
    fast = decode._decode_jpeg
    ms: dict[str, list[float]] = {"PIL": [], "simplejpeg": []}
    for _ in range(rounds):
        for side, fn in (("PIL", lambda *a: None), ("simplejpeg", fast)):
            decode._decode_jpeg = fn
            t = time.process_time()
            for f in files:
                decode.prepare(f, opts)
            ms[side].append((time.process_time() - t) / len(files) * 1e3)
    decode._decode_jpeg = fast
    print(f"prepare() {size}px, {len(files)} images: " + ", ".join(
        f"{k} {statistics.median(v):.2f} ms CPU/img" for k, v in ms.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("photos")
    ap.add_argument("--ref", required=True, help="the other checkout")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    trees = {"ref": os.path.abspath(a.ref),
             "this": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    decode_ab(a.photos, a.size, a.rounds)
    tmp = tempfile.mkdtemp(prefix="fd-ab-")
    try:
        for container in ("hdf5", "lmdb"):
            rates: dict[str, list[float]] = {k: [] for k in trees}
            for _ in range(a.rounds):
                for name, tree in trees.items():
                    out = subprocess.run(
                        [sys.executable, "-c", RUN, tree, a.photos, os.path.join(tmp, name),
                         container, str(a.size)], check=True, capture_output=True, text=True)
                    rates[name].append(float(out.stdout.split()[-1]))
            ratio = [t / r for t, r in zip(rates["this"], rates["ref"])]
            print(f"{container} {a.size}px: ref {statistics.median(rates['ref']):.0f} img/s, "
                  f"this {statistics.median(rates['this']):.0f} img/s, this/ref "
                  f"{statistics.median(ratio):.2f}x (rounds {min(ratio):.2f}-{max(ratio):.2f})")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
