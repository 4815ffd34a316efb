"""This tree vs another checkout of fastdata (e.g. an older commit), the runs interleaved round
by round so machine noise hits both alike (the A/B figures of docs/performance.md).

    git worktree add /tmp/fd-ref <commit>
    .venv/bin/python -W ignore -m benchmarks.compare_trees /tmp/photos --ref /tmp/fd-ref
    .venv/bin/python -W ignore -m benchmarks.compare_trees /tmp/photos --ref /tmp/fd-ref \
        --job loader

Each run is a fresh interpreter with its tree first on ``sys.path``.
``--job convert``: times only the ``convert()`` call (as ``benchmarks/convert/convert.py`` once
did: the previous output is deleted inside it), HDF5 and LMDB, and reports the CPU time of
all its processes per image too; with ``--torch``, in an interpreter that imported torch first
(as ``benchmarks/convert/convert.py``'s once did, and a notebook's); with ``--fresh``, the
previous output deleted and synced before the clock (as ``benchmarks/convert/convert.py``
does, which also runs each conversion in a fresh interpreter, without torch), and also timed
with the sync after it (its "on disk" figure).
``--job scan``: ``scan_folder`` over the photos, best of 10 in each interpreter (files/s).
``--job loader``: a loader backend (``--backend``: torch by default; DALI runs its CPU-only
mode) over raw (or ``--encoding jpeg``) shards stored at ``--size`` (made by this tree;
``--container``, HDF5 by default),
RandomResizedCrop(224) + flip + normalise to float32 (or ``--dtype``), batch 64, 2 worker
threads (or processes:
``--workers process``, started as ``--mp-context`` says), NCHW and
channels_last, one epoch after 5 untimed batches (as ``benchmarks/loading/loaders_cpu.py``
(b)); with ``--epochs N``, epochs 2..N after an untimed first (the maps' pages and the buffers
warm); img/s and the CPU time of all the run's processes per image.
"""
from __future__ import annotations

import argparse
import functools
import glob
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from benchmarks.harness import interleaved, medians, write_results

# each child runs one tree's code: its fastdata, and its converters/ folder as
# fastdata.converters (an editable install would map that name to the installed tree's folder)
PRELUDE = """
import importlib.util, os, sys
sys.path.insert(0, sys.argv[1])
_conv = os.path.join(sys.argv[1], "converters")
_spec = importlib.util.spec_from_file_location(
    "fastdata.converters", os.path.join(_conv, "__init__.py"), submodule_search_locations=[_conv])
sys.modules["fastdata.converters"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sys.modules["fastdata.converters"])
"""
CONVERT = PRELUDE + """
import os, resource, shutil, sys, time
if sys.argv[6] == "torch":
    import torch
from fastdata.converters.convert import convert
def cpu():
    return sum(r.ru_utime + r.ru_stime for r in map(resource.getrusage, (
        resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))
fresh = sys.argv[7] == "fresh"
if fresh:
    shutil.rmtree(sys.argv[3], ignore_errors=True)
    os.sync()
t, c = time.perf_counter(), cpu()
m = convert(sys.argv[2], sys.argv[3], container=sys.argv[4], sizes=[int(sys.argv[5])],
            overwrite=True, progress=False)
n = m["num_samples"]
rate, per_image = n / (time.perf_counter() - t), (cpu() - c) / n * 1e3
if fresh:
    os.sync()
    print(rate, per_image, n / (time.perf_counter() - t))
else:
    print(rate, per_image)
"""
SCAN = PRELUDE + """
import sys, time
from fastdata.converters.scan import scan_folder
best = float("inf")
for _ in range(10):
    t = time.perf_counter()
    n = len(scan_folder(sys.argv[2]).files)
    best = min(best, time.perf_counter() - t)
print(n / best)
"""
LOADER = PRELUDE + """
import sys, time
import torch, fastdata
from harness import tree_cpu_seconds as cpu    # the live worker processes' CPU included
torch.set_num_threads(1)
options = dict(num_workers=2, workers=sys.argv[6], mp_context=sys.argv[7] or None)
if hasattr(fastdata, "TorchBackend"):       # a tree whose backends own their options
    backend = (fastdata.TorchBackend(**options) if sys.argv[5] == "torch" else
               fastdata.DaliBackend(num_workers=2))
    options = {}
else:
    backend = sys.argv[5]
loader = fastdata.Loader(sys.argv[2], batch_size=64, crop=224, device="cpu", backend=backend,
                         channels_last=sys.argv[3] == "channels_last",
                         dtype=getattr(torch, sys.argv[8]), **options)

epochs, t, n = int(sys.argv[4]), None, 0
# "hold": a batch of a first pass kept all along, as a program's variable keeps one
held = next(iter(loader)) if sys.argv[9] == "hold" else None
for e in range(epochs):
    loader.set_epoch(e)
    for k, (x, _) in enumerate(loader):
        if t is None and (k == 5 if epochs == 1 else e == 1):
            t, c = time.perf_counter(), cpu()
        n += len(x) if t is not None else 0
print(n / (time.perf_counter() - t), 1000 * (cpu() - c) / n)
"""


FIGURES = ("img_s", "cpu_ms_per_img", "img_s_on_disk")     # what a job's child prints, in order


def _run(script: str, tree: str, name: str, args) -> dict:
    # the child imports the tree's fastdata and, from this folder, the harness
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [os.path.dirname(os.path.abspath(__file__)), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", script, tree,
                          *(a.replace("{name}", name) for a in args)],
                         check=True, capture_output=True, text=True, env=env)
    return dict(zip(FIGURES, map(float, out.stdout.splitlines()[-1].split())))


def compare(trees: dict, rounds: int, label: str, script: str, *args: str) -> dict:
    """``script`` run per tree, interleaved, ``rounds`` times; prints medians and the ratio
    this/ref of each figure, and returns them as a results row."""
    runs = interleaved({name: functools.partial(_run, script, tree, name, args)
                        for name, tree in trees.items()}, rounds)
    row: dict = {"label": label, "rounds": rounds}
    ref, this = medians(runs["ref"]), medians(runs["this"])
    for figure in this:
        ratio = [t[figure] / r[figure] for t, r in zip(runs["this"], runs["ref"])
                 if r[figure]] or [0.0]
        mid, lo, hi = statistics.median(ratio), min(ratio), max(ratio)
        row[figure] = {"ref": ref[figure], "this": this[figure], "this/ref": mid,
                       "rounds this/ref": [lo, hi]}
        print(f"{label}: {figure} ref {ref[figure]:.4g}, this {this[figure]:.4g}, this/ref "
              f"{mid:.3f} (rounds {lo:.3f}-{hi:.3f})")
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("photos")
    ap.add_argument("--ref", required=True, help="the other checkout")
    ap.add_argument("--job", choices=("convert", "scan", "loader"), default="convert")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--torch", action="store_true", help="convert: import torch first")
    ap.add_argument("--fresh", action="store_true",
                    help="convert: delete the previous output and sync before the clock (as "
                         "benchmarks/convert/convert.py does), and time the sync after it too")
    ap.add_argument("--container", choices=("hdf5", "lmdb"), default="hdf5",
                    help="loader: the shards' container")
    ap.add_argument("--encoding", choices=("raw", "jpeg"), default="raw",
                    help="loader: the shards' encoding")
    ap.add_argument("--backend", choices=("torch", "dali"), default="torch",
                    help="loader: the backend")
    ap.add_argument("--workers", choices=("thread", "process"), default="thread",
                    help="loader: the torch backend's workers")
    ap.add_argument("--mp-context", choices=("fork", "spawn", "forkserver"), default=None,
                    help="loader: how worker processes start (default: Python's)")
    ap.add_argument("--dtype", action="append", choices=("float32", "bfloat16", "uint8"),
                    help="loader: the output's dtype; repeatable (default float32)")
    ap.add_argument("--json", metavar="PATH", help="also write the rows there "
                    "(benchmarks/README.md, the results' schema)")
    ap.add_argument("--epochs", type=int, default=1,
                    help="loader: epochs per run; with more than one, the first is untimed")
    ap.add_argument("--hold", action="store_true",
                    help="loader: keep one batch of a first pass while the runs are timed")
    a = ap.parse_args()
    trees = {"ref": os.path.abspath(a.ref),
             "this": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    # the C kernel is in fastdata/kernels/ (fastdata/ in trees before that layout)
    built = {k: glob.glob(os.path.join(t, "fastdata", "**", "_native*.so"), recursive=True)
             for k, t in trees.items()}
    if built["this"] and not built["ref"] and glob.glob(
            os.path.join(trees["ref"], "fastdata", "**", "_native.c"), recursive=True):
        sys.exit(f"{a.ref} has fastdata's _native.c but not its build, so it would run without "
                 f"the C kernel: copy {built['this'][0]} there (a git worktree has no build "
                 f"outputs) or build it")
    tmp = tempfile.mkdtemp(prefix="fd-ab-")
    try:
        rows = _job(a, trees, tmp)
    finally:
        shutil.rmtree(tmp)
    if a.json:
        write_results(a.json, f"compare_trees {a.job}", rows)


def _job(a, trees: dict, tmp: str) -> list[dict]:
    if a.job == "convert":
        return [compare(trees, a.rounds, f"{container} {a.size}px", CONVERT, a.photos,
                        os.path.join(tmp, "{name}"), container, str(a.size),
                        "torch" if a.torch else "-", "fresh" if a.fresh else "-")
                for container in ("hdf5", "lmdb")]
    if a.job == "scan":
        return [compare(trees, a.rounds, "scan (files/s)", SCAN, a.photos)]
    from fastdata.converters.convert import convert

    shards = os.path.join(tmp, "raw")
    convert(a.photos, shards, container=a.container, sizes=[a.size], encoding=a.encoding,
            progress=False)
    return [compare(trees, a.rounds, f"loader {a.backend} {a.container} {a.encoding} RRC224 "
                    f"{dtype} {layout}, {a.workers} workers", LOADER, shards, layout,
                    str(a.epochs), a.backend, a.workers, a.mp_context or "", dtype,
                    "hold" if a.hold else "-")
            for dtype in a.dtype or ["float32"] for layout in ("NCHW", "channels_last")]


if __name__ == "__main__":
    main()
