"""How fastdata's costs grow with the number of images: for each N, an ImageNet-shaped folder
(``make_imagenet_like.py``) is converted and loaded, each step in a fresh process.

    .venv/bin/python -m benchmarks.convert.growth /tmp/growth --n 10000,100000,1280000 --size 32 \\
        --json growth.json --plot growth.png

Per N: convert img/s and the peak RSS of any converter process; the manifest's size;
``fastdata.open()`` time; a ``Loader``'s first-batch latency (construction included, torch
imported before, as in a training script); two
shuffled epochs (RandomResizedCrop to the stored size, float32, batch 256): img/s and the
loading process's RSS after each (its own memory, ``RssAnon``, and all it has resident,
``VmRSS``, which counts the pages of the shards it has mapped too: the set in the page cache).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

LOAD = """
import json, sys, time
import torch, fastdata              # a training script has them imported already
t = time.perf_counter()
ds = fastdata.open(sys.argv[1])
opened = time.perf_counter() - t
t = time.perf_counter()
loader = fastdata.Loader(ds, batch_size=256, device="cpu")
next(iter(loader))
first = time.perf_counter() - t
epochs = []
for e in range(2):
    loader.set_epoch(e)
    t, n = time.perf_counter(), 0
    for images, labels in loader:
        n += len(labels)
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    kb = lambda key: int(status[key].split()[0]) / 1024  # noqa: E731
    epochs.append({"img_per_s": n / (time.perf_counter() - t), "rss_mb": kb("VmRSS"),
                   "anon_mb": kb("RssAnon")})
print(json.dumps({"open_s": opened, "first_batch_s": first, "epochs": epochs}))
"""


CONVERT = """
import json, resource, sys, time
from fastdata.cli import main
t = time.perf_counter()
rc = main(["-q", "convert", *sys.argv[1:]])
seconds = time.perf_counter() - t
peak = max(resource.getrusage(w).ru_maxrss for w in (resource.RUSAGE_SELF,
                                                     resource.RUSAGE_CHILDREN))
print(json.dumps({"rc": rc, "seconds": seconds, "peak_rss_mb": peak / 1024}))
"""


def measure(root: str, n: int, size: int) -> dict:
    src = os.path.join(root, f"images-{n}")
    out = os.path.join(root, f"shards-{n}")
    from benchmarks.inputs.make_imagenet_like import make

    make(src, n)
    conv = json.loads(subprocess.run([sys.executable, "-c", CONVERT, src, out, "--size",
                                      str(size), "--overwrite"], check=True,
                                     capture_output=True, text=True).stdout)
    assert conv["rc"] == 0, conv
    load = json.loads(subprocess.run([sys.executable, "-c", LOAD, out], check=True,
                                     capture_output=True, text=True).stdout)
    return {"n": n, "convert_img_per_s": n / conv["seconds"],
            "convert_peak_rss_mb": conv["peak_rss_mb"],
            "manifest_kb": os.path.getsize(os.path.join(out, "manifest.json")) / 1024, **load}


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [r["n"] for r in rows]
    series = {"convert img/s": [r["convert_img_per_s"] for r in rows],
              "epoch img/s": [r["epochs"][-1]["img_per_s"] for r in rows],
              "convert peak RSS (MB)": [r["convert_peak_rss_mb"] for r in rows],
              "loader RssAnon (MB)": [r["epochs"][-1]["anon_mb"] for r in rows],
              "loader VmRSS (MB)": [r["epochs"][-1]["rss_mb"] for r in rows],
              "manifest (kB)": [r["manifest_kb"] for r in rows],
              "open() (ms)": [1000 * r["open_s"] for r in rows],
              "first batch (ms)": [1000 * r["first_batch_s"] for r in rows]}
    fig, ax = plt.subplots(figsize=(8, 5))
    for label, ys in series.items():
        ax.loglog(n, ys, marker="o", label=label)
    ax.set_xlabel("images")
    ax.set_ylabel("value (unit in the legend)")
    ax.set_title("fastdata's costs against the number of images")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", help="working folder (the generated images and the sets)")
    ap.add_argument("--n", default="10000,100000,1280000", help="image counts, ascending")
    ap.add_argument("--size", type=int, default=32, help="stored size (default 32)")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--plot", help="write a log-log plot here (needs matplotlib)")
    a = ap.parse_args()
    rows = []
    for n in sorted(int(x) for x in a.n.split(",")):
        rows.append(measure(a.root, n, a.size))
        r = rows[-1]
        epochs = ", ".join(f"{e['img_per_s']:.0f} img/s, RSS {e['rss_mb']:.0f} MB "
                           f"(anon {e['anon_mb']:.0f})" for e in r["epochs"])
        print(f"N={n}: convert {r['convert_img_per_s']:.0f} img/s, peak RSS "
              f"{r['convert_peak_rss_mb']:.0f} MB; manifest {r['manifest_kb']:.1f} kB; open "
              f"{1000 * r['open_s']:.0f} ms; first batch {1000 * r['first_batch_s']:.0f} ms; "
              f"epochs {epochs}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    if a.plot:
        plot(rows, a.plot)


if __name__ == "__main__":
    main()
