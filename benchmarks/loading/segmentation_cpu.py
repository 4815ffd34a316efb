"""A segmentation set against images alone: the same photos converted with and without a class
map each (``--masks``), loaded interleaved round by round (the segmentation figures of
docs/performance.md).

    OPENBLAS_NUM_THREADS=1 python -W ignore -m benchmarks.loading.segmentation_cpu /tmp/photos \\
        --rounds 5 --json benchmarks/results/RUN/segmentation.json

Each photo's class map is a PNG of its size (as Pascal VOC's are): 1-5 rectangles of classes
0-9 on 255 (no class). Both sets raw HDF5 at 256 px (the default centre crop). Loading:
RandomResizedCrop(224) + flip + normalise to float32, batch 64, 2 reader threads, 3 epochs
after an untimed one, each run in a fresh interpreter; the segmentation set's labels are its
maps through each crop and flip, int64 ``(64, 224, 224)``. img/s and CPU ms an image (every
thread).
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

from benchmarks.harness import fresh_run, interleaved, medians, write_results

RUN = """
import json, sys, time
import torch, fastdata
from benchmarks.harness import tree_cpu_seconds
torch.set_num_threads(1)
loader = fastdata.Loader(sys.argv[1], batch_size=64, crop=224, device="cpu", num_workers=2)
for x, y in loader:
    pass
del x, y
t, c, n = time.perf_counter(), tree_cpu_seconds(), 0
for epoch in range(1, 4):
    loader.set_epoch(epoch)
    for x, y in loader:
        n += x.shape[0]
print(json.dumps({"img_s": n / (time.perf_counter() - t),
                  "cpu_ms": (tree_cpu_seconds() - c) / n * 1e3}))
"""


def write_maps(photos: str, masks: str) -> int:
    """Each photo's class map under ``masks``, at the photo's size; returns how many."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(1)
    n = 0
    for d, _, files in os.walk(photos):
        for f in sorted(files):
            rel = os.path.relpath(os.path.join(d, f), photos)
            with Image.open(os.path.join(photos, rel)) as img:
                w, h = img.size
            m = np.full((h, w), 255, np.uint8)
            for _ in range(rng.integers(1, 6)):
                x, y = rng.integers(0, w), rng.integers(0, h)
                m[y:y + rng.integers(1, h // 2 + 2), x:x + rng.integers(1, w // 2 + 2)] = \
                    rng.integers(0, 10)
            path = os.path.join(masks, os.path.splitext(rel)[0] + ".png")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            Image.fromarray(m).save(path)
            n += 1
    return n


def loading(path: str):
    return lambda: fresh_run(RUN, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("photos")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", default=None, help="write the results here")
    a = p.parse_args()
    from fastdata.converters.convert import convert

    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        masks = os.path.join(tmp, "masks")
        n = write_maps(a.photos, masks)
        sets = {"images": os.path.join(tmp, "images"), "segmentation": os.path.join(tmp, "seg")}
        t = time.perf_counter()
        convert(a.photos, sets["images"], sizes=[256], progress=False)
        convert(a.photos, sets["segmentation"], sizes=[256], masks=masks, progress=False)
        print(f"{n} photos and maps converted in {time.perf_counter() - t:.1f} s", flush=True)
        load = interleaved({k: loading(v) for k, v in sets.items()}, a.rounds)
    base = medians(load["images"])["img_s"]
    rows = []
    for name, runs in load.items():
        ratios = [r["img_s"] / b["img_s"] for r, b in zip(runs, load["images"])]
        row = {"variant": name, **medians(runs), "of_images_alone": medians(runs)["img_s"] / base,
               "rounds_of_images_alone": sorted(ratios), "rounds": runs}
        rows.append(row)
        print(f"{name:13} {row['img_s']:7.0f} img/s  {row['cpu_ms']:.3f} CPU ms/img  "
              f"{row['of_images_alone']:.3f} of images alone", flush=True)
    if a.json:
        write_results(a.json, "loading.segmentation_cpu", rows)


if __name__ == "__main__":
    main()
