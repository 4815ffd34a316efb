"""JPEG shards read with each record decoded only where its crop needs it, against whole
decodes (the region decoder switched off), loader only (the figures of docs/performance.md):

    OPENBLAS_NUM_THREADS=1 python -W ignore -m benchmarks.loading.jpeg_regions /tmp/photos \\
        --rounds 5

The photos converted to JPEG HDF5 (quality 90) at 256 px; RandomResizedCrop 224 + flip +
normalise to float32, batch 64, 2 threads; 3 epochs after an untimed one, each run a fresh
interpreter, the two interleaved round by round: img/s and CPU ms per image. Then the decodes
alone (no crop, no loader), 512 records with the same boxes: ms per record.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

RUN = r"""
import os, sys, time, torch, fastdata
torch.set_num_threads(1)
if sys.argv[2] == "whole":
    import fastdata.kernels.jpeg as j
    j.available = lambda: False
loader = fastdata.Loader(sys.argv[1], batch_size=64, crop=224, device="cpu", num_workers=2)
loader.set_epoch(0)
for _ in loader:
    pass
c, t, n = os.times(), time.perf_counter(), 0
for e in range(1, 4):
    loader.set_epoch(e)
    for x, _ in loader:
        n += len(x)
c2, secs = os.times(), time.perf_counter() - t
print(n / secs, 1000 * (c2.user + c2.system - c.user - c.system) / n)
"""

DECODES = r"""
import sys, time, numpy as np, torch, fastdata
from fastdata.loader.decode import decode_regions
from fastdata.ops.boxes import random_resized_crop_boxes
from fastdata.shards.jpeg import decode_jpeg
ds = fastdata.open(sys.argv[1])
payloads = ds.read_encoded(range(min(512, len(ds))))
boxes = random_resized_crop_boxes(len(payloads), 256, 256,
                                  generator=torch.Generator().manual_seed(0))
out = torch.empty((len(payloads), 256, 256, 3), dtype=torch.uint8)
runs = {"whole": lambda: [decode_jpeg(p, out[k].numpy()) for k, p in enumerate(payloads)],
        "regions": lambda: decode_regions(payloads, boxes, out, None)}
for name, run in runs.items():
    run()
    t = time.perf_counter()
    for _ in range(5):
        run()
    print(name, 1000 * (time.perf_counter() - t) / 5 / len(payloads))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("photos")
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    from fastdata.converters.convert import convert

    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        out = os.path.join(tmp, "jpeg")
        convert(a.photos, out, sizes=[256], encoding="jpeg", progress=False)
        got: dict[str, list[tuple[float, float]]] = {"whole": [], "regions": []}
        for r in range(a.rounds):
            for mode in (("whole", "regions") if r % 2 == 0 else ("regions", "whole")):
                done = subprocess.run([sys.executable, "-c", RUN, out, mode], check=True,
                                      capture_output=True, text=True)
                rate, cpu = map(float, done.stdout.split())
                got[mode].append((rate, cpu))
                print(f"round {r}: {mode}: {rate:.0f} img/s, {cpu:.4f} CPU ms/img", flush=True)
        for mode, rows in got.items():
            print(f"{mode}: median {statistics.median(r for r, _ in rows):.0f} img/s, "
                  f"{statistics.median(c for _, c in rows):.4f} CPU ms/img")
        ratio = [w[1] / r[1] for w, r in zip(got["whole"], got["regions"])]
        print(f"CPU per image, regions / whole: {1 / statistics.median(ratio):.3f} (rounds "
              f"{1 / max(ratio):.3f}-{1 / min(ratio):.3f})")
        print(subprocess.run([sys.executable, "-c", DECODES, out], check=True,
                             capture_output=True, text=True).stdout, end="")


if __name__ == "__main__":
    main()
