"""FFCV 1.0.2 on the same pixels as a fastdata shard set, loader only, on CPU.

Runs in its own environment (FFCV is not a dependency of fastdata), e.g.
    apt-get install pkg-config libturbojpeg0-dev libopencv-dev
    python -m venv /tmp/ffcv-venv && /tmp/ffcv-venv/bin/pip install torch==2.13.0 ffcv==1.0.2 \
        pillow h5py lmdb tqdm simplejpeg zlib-ng
    PYTHONPATH=. /tmp/ffcv-venv/bin/python -m benchmarks.peers.ffcv_cpu SHARDS --mode raw
The .beton is written from the shard set's own 256x256 images (identical pixels), then read
with FFCV's RandomResizedCrop decoder (224) + flip + normalise to float32 + ToTensor +
ToTorchImage, batch 64, 2 workers, random order. Prints one JSON line with the runs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

import fastdata
from fastdata.ops.normalize import IMAGENET_MEAN, IMAGENET_STD


class Pixels:
    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        img, label = self.ds[i]
        return np.ascontiguousarray(img), int(label)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shards")
    ap.add_argument("--mode", choices=("raw", "jpg"), default="raw")
    ap.add_argument("--work", default="/tmp/fd-ffcv")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    from ffcv.fields import IntField, RGBImageField
    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import (
        NormalizeImage,
        RandomHorizontalFlip,
        Squeeze,
        ToTensor,
        ToTorchImage,
    )
    from ffcv.writer import DatasetWriter

    ds = fastdata.open(a.shards)
    os.makedirs(a.work, exist_ok=True)
    beton = os.path.join(a.work, f"{os.path.basename(a.shards.rstrip('/'))}-{a.mode}.beton")
    if not os.path.exists(beton):
        DatasetWriter(beton, {"image": RGBImageField(write_mode=a.mode, max_resolution=ds.size,
                                                     jpeg_quality=90),
                              "label": IntField()}, num_workers=a.workers).from_indexed_dataset(
            Pixels(ds))
    with open(beton, "rb") as f:        # warm page cache, as for every other contender
        while f.read(1 << 24):
            pass
    mean, std = np.array(IMAGENET_MEAN) * 255, np.array(IMAGENET_STD) * 255
    loader = Loader(beton, batch_size=a.batch_size, num_workers=a.workers,
                    order=OrderOption.RANDOM, drop_last=True, os_cache=True, pipelines={
                        "image": [RandomResizedCropRGBImageDecoder((224, 224)),
                                  RandomHorizontalFlip(), NormalizeImage(mean, std, np.float32),
                                  ToTensor(), ToTorchImage()],
                        "label": [IntDecoder(), ToTensor(), Squeeze()]})

    def forever():
        while True:
            yield from loader
    it = forever()
    for _ in range(a.warmup):
        x, _ = next(it)
    runs = []
    for _ in range(a.repeat):
        t0, n = time.perf_counter(), 0
        for _ in range(a.batches):
            x, _ = next(it)
            n += len(x)
        runs.append(n / (time.perf_counter() - t0))
    print(json.dumps({"backend": f"ffcv-{a.mode}", "shape": list(x.shape), "dtype": str(x.dtype),
                      "img_per_s": {"median": statistics.median(runs), "min": min(runs),
                                    "max": max(runs), "runs": runs}}))


if __name__ == "__main__":
    main()
