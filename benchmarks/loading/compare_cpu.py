"""Loader-only at 224 train augmentation on this CPU machine, one run, every contender:
baseline (PIL folder) vs fastdata torch (HDF5 raw, LMDB raw, HDF5 JPEG) vs fastdata DALI CPU
vs FFCV 1.0.2 (raw and JPEG .beton written from the same 256x256 pixels).

    python -m benchmarks.inputs.make_photos /tmp/photos
    .venv/bin/python -m benchmarks.loading.compare_cpu /tmp/photos --work /tmp/fd-compare \
        --ffcv-python /tmp/ffcv-venv/bin/python     # see benchmarks/peers/ffcv_cpu.py for that venv

Prints a markdown table (docs/performance.md, "Loading on a CPU"), writes WORK/compare.json; then
with ``--rounds``, × baseline measured pairwise in interleaved rounds (baseline, then each
fastdata torch set, seconds apart), which this noisy machine needs for a trustworthy ratio.
Batch 64, 2 workers/threads, RandomResizedCrop(224) + flip + normalise to float32; fastdata and
FFCV deliver channels_last (FFCV's ``ToTorchImage()`` default, a view of its NHWC batch), the
baseline NCHW (``ToTensor``).
Every input is read once before it is timed (warm page cache for all contenders).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

import torch

from fastdata.bench import Bench
from fastdata.converters.convert import convert
from fastdata.env import env_info

SETS = {"raw-hdf5": dict(container="hdf5"), "raw-lmdb": dict(container="lmdb"),
        "jpeg-hdf5": dict(container="hdf5", encoding="jpeg", quality=90)}


def warm(path: str) -> None:
    """Read every file under ``path`` once, so each contender starts from a warm page cache
    (LMDB readers use readahead=False, which makes a cold first epoch disk-bound)."""
    for dp, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(dp, name), "rb") as f:
                while f.read(1 << 24):
                    pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("photos")
    ap.add_argument("--work", default="/tmp/fd-compare")
    ap.add_argument("--ffcv-python", default=None, help="python of an environment with ffcv")
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5,
                    help="interleaved baseline/torch rounds after the table (0: none)")
    a = ap.parse_args()
    kw = dict(batch_size=64, crop=224, warmup=5, batches=a.batches, repeat=a.repeat,
              device="cpu", num_workers=2, channels_last=True)     # FFCV's ToTorchImage's too
    rows = []
    for name, opts in SETS.items():
        out = os.path.join(a.work, name)
        if not os.path.exists(os.path.join(out, "manifest.json")):
            convert(a.photos, out, sizes=[256], overwrite=True, progress=False, **opts)
        backends = ["baseline", "torch", "dali"] if name == "raw-hdf5" else ["torch", "dali"]
        warm(out)
        if "baseline" in backends:
            warm(a.photos)
        rep = Bench(out, source=a.photos, backends=backends, **kw).run(progress=False)
        for r in rep["results"]:
            label = r["backend"] if r["backend"] == "baseline" else f"{r['backend']} {name}"
            rows.append((label, r.get("loader", {}).get("img_per_s"), r.get("what", ""),
                         r.get("reason")))
            print(rows[-1], file=sys.stderr, flush=True)
        if a.ffcv_python and name in ("raw-hdf5", "jpeg-hdf5"):
            mode = "raw" if name == "raw-hdf5" else "jpg"
            ffcv = os.path.join(os.path.dirname(__file__), "..", "peers", "ffcv_cpu.py")
            p = subprocess.run([a.ffcv_python, ffcv, out, "--mode", mode,
                                "--work", os.path.join(a.work, "ffcv"), "--batches",
                                str(a.batches), "--repeat", str(a.repeat)],
                               capture_output=True, text=True,
                               env={**os.environ, "PYTHONPATH": os.getcwd()})
            if p.returncode:
                rows.append((f"ffcv {mode}", None, "", p.stderr[-300:]))
            else:
                f = json.loads(p.stdout.strip().splitlines()[-1])
                rows.append((f"ffcv {mode} (same 256px pixels)", f["img_per_s"], "", None))
            print(rows[-1], file=sys.stderr, flush=True)
    base = rows[0][1]["median"]
    print(f"# {os.cpu_count()} cpus, torch {torch.__version__}, batch 64, RRC224 float32, "
          f"channels_last (baseline NCHW)")
    print("| loader | img/s (median) | min–max | × baseline |")
    print("| --- | --- | --- | --- |")
    for label, s, what, why in rows:
        if s is None:
            print(f"| {label} | skipped: {why} | | |")
        else:
            print(f"| {label} | {s['median']:.0f} | {s['min']:.0f}–{s['max']:.0f} | "
                  f"{s['median'] / base:.1f}× |")
    ratios = interleaved(a, kw) if a.rounds else {}
    with open(os.path.join(a.work, "compare.json"), "w") as f:
        json.dump({"env": env_info(), "rows": rows, "interleaved": ratios}, f, indent=1)


def interleaved(a, kw) -> dict:
    """× baseline measured pairwise: each round runs the baseline and then one fastdata torch
    set, seconds apart, so the host's drift (up to 2× over minutes) hits both alike."""
    kw = {**kw, "repeat": 1}
    ratios: dict[str, list[float]] = {name: [] for name in SETS}
    for _ in range(a.rounds):
        for name in SETS:
            rep = Bench(os.path.join(a.work, name), source=a.photos,
                        backends=["baseline", "torch"], **kw).run(progress=False)
            base, torch_ = (r["loader"]["img_per_s"]["median"] for r in rep["results"])
            ratios[name].append(torch_ / base)
            print(("interleaved", name, base, torch_), file=sys.stderr, flush=True)
    print(f"\nInterleaved, {a.rounds} rounds (baseline then torch, {a.batches} batches each): "
          f"× baseline, median (min–max) of the per-round ratios")
    for name, r in ratios.items():
        print(f"- torch {name}: {statistics.median(r):.1f}× ({min(r):.1f}–{max(r):.1f})")
    return ratios


if __name__ == "__main__":
    main()
