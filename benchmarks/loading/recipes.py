"""Augmentation recipes, loader only, on the CPU: fastdata's hooks against per-image pipelines.

    python -m benchmarks.inputs.make_photos /tmp/photos
    python -m benchmarks.loading.recipes /tmp/photos --work /tmp/fd-recipes

Contenders (batch 64, crop 224, float32, 2 workers, device cpu), each run ``--rounds`` times,
interleaved, after 3 untimed batches:

* ``built-in``: fastdata, RandomResizedCrop + flip (raw HDF5 at 256).
* ``heavy``: the built-in path + ``batch_transform`` = ColorJitter(0.4, 0.4, 0.4, 0.1) →
  RandomErasing(0.25) → MixUp(0.8) or CutMix(1.0), fastdata's batch operations.
* ``heavy, per image``: ImageFolder + PIL decode + RandomResizedCrop + flip + ColorJitter (PIL
  ImageEnhance and HSV, torchvision's PIL definitions) + ToTensor + Normalize + RandomErasing per
  image in DataLoader workers, MixUp/CutMix on the batch: torchvision's reference recipe.
* ``PIL ColorJitter sample_transform``: fastdata with the same PIL ColorJitter as a
  ``sample_transform`` (worker processes: PIL holds the GIL through part of it).
* ``PIL ColorJitter, per image``: ImageFolder + PIL decode + RandomResizedCrop + flip + the same
  PIL ColorJitter + ToTensor + Normalize.
* ``PIL TrivialAugment ...``: the same two with torchvision's TrivialAugmentWide (one PIL
  operation per image) instead of the ColorJitter.
* ``TrivialAugment batch_transform``: fastdata's batched ``TrivialAugment`` instead.
* with ``--dali``: the DALI backend (CPU-only mode), built-in and with the PIL TrivialAugment
  ``sample_transform`` (run by the reader threads that feed DALI).

Prints one JSON line per run and a table of medians.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics

import numpy as np
import torch
from PIL import Image, ImageEnhance, ImageOps

import fastdata  # noqa: E402
from benchmarks.loading.compare_cpu import warm  # noqa: E402
from benchmarks.loading.loaders_cpu import throughput  # noqa: E402
from fastdata import transforms as T  # noqa: E402
from fastdata.bench.baseline import PILFolder  # noqa: E402
from fastdata.converters.convert import convert  # noqa: E402
from fastdata.ops.boxes import random_resized_crop_boxes  # noqa: E402
from fastdata.ops.normalize import IMAGENET_MEAN, IMAGENET_STD  # noqa: E402

BATCH, CROP, WORKERS = 64, 224, 2


def pil_jitter(img: Image.Image, rng) -> Image.Image:
    """torchvision's ColorJitter(0.4, 0.4, 0.4, 0.1) on a PIL image, in a random order."""
    ops = [lambda im, f: ImageEnhance.Brightness(im).enhance(f),
           lambda im, f: ImageEnhance.Contrast(im).enhance(f),
           lambda im, f: ImageEnhance.Color(im).enhance(f), _hue]
    factors = [rng.uniform(0.6, 1.4) for _ in range(3)] + [rng.uniform(-0.1, 0.1)]
    for k in rng.permutation(4):
        img = ops[k](img, factors[k])
    return img


def _hue(img: Image.Image, shift: float) -> Image.Image:
    h, s, v = img.convert("HSV").split()
    h = np.array(h, np.uint8)
    with np.errstate(over="ignore"):
        h += np.array(shift * 255).astype(np.uint8)
    return Image.merge("HSV", (Image.fromarray(h, "L"), s, v)).convert("RGB")


def trivial_augment(img: Image.Image, rng) -> Image.Image:
    """torchvision's TrivialAugmentWide on a PIL image (its PIL operations and magnitude
    ranges, 31 bins): one operation per image, at a random magnitude."""
    m = rng.integers(31) / 30
    sign = 1 if rng.random() < 0.5 else -1
    ops = [
        lambda im: im,
        lambda im: im.transform(im.size, Image.AFFINE, (1, sign * 0.99 * m, 0, 0, 1, 0)),
        lambda im: im.transform(im.size, Image.AFFINE, (1, 0, 0, sign * 0.99 * m, 1, 0)),
        lambda im: im.transform(im.size, Image.AFFINE, (1, 0, sign * 32 * m, 0, 1, 0)),
        lambda im: im.transform(im.size, Image.AFFINE, (1, 0, 0, 0, 1, sign * 32 * m)),
        lambda im: im.rotate(sign * 135 * m),
        lambda im: ImageEnhance.Brightness(im).enhance(1 + sign * 0.99 * m),
        lambda im: ImageEnhance.Color(im).enhance(1 + sign * 0.99 * m),
        lambda im: ImageEnhance.Contrast(im).enhance(1 + sign * 0.99 * m),
        lambda im: ImageEnhance.Sharpness(im).enhance(1 + sign * 0.99 * m),
        lambda im: ImageOps.posterize(im, 8 - int(6 * m)),
        lambda im: ImageOps.solarize(im, 255 * (1 - m)),
        ImageOps.autocontrast,
        ImageOps.equalize,
    ]
    return ops[rng.integers(len(ops))](img)


def trivial_sample(image: np.ndarray, rng) -> Image.Image:
    """TrivialAugmentWide as a fastdata ``sample_transform``."""
    return trivial_augment(Image.fromarray(image), rng)


def jitter_sample(image: np.ndarray, rng) -> Image.Image:
    """The PIL jitter as a fastdata ``sample_transform`` (module level: picklable)."""
    return pil_jitter(Image.fromarray(image), rng)


class PerImage(PILFolder):
    """ImageFolder + PIL: RandomResizedCrop + flip, ``jitter``, tensor, normalise, ``erase``."""

    def __init__(self, root, *, jitter, erase: bool):
        super().__init__(root, crop=CROP)
        self.jitter, self.eraser = jitter, T.RandomErasing(0.25) if erase else None
        self.tf, self.kind = self._recipe, "PIL, per image"
        self.mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
        self.std = torch.tensor(IMAGENET_STD).view(3, 1, 1)

    def _recipe(self, img):
        t, l, h, w = random_resized_crop_boxes(1, img.height, img.width)[0].tolist()
        img = img.resize((CROP, CROP), Image.BILINEAR, box=(l, t, l + w, t + h))
        if random.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        if self.jitter is not None:
            img = self.jitter(img, np.random.default_rng(random.getrandbits(64)))
        x = torch.from_numpy(np.array(img)).permute(2, 0, 1).float().div_(255)
        x = (x - self.mean) / self.std
        if self.eraser is not None:
            x = self.eraser(x[None], None)[0][0]
        return x


class Mixed:
    """A DataLoader whose batches get MixUp or CutMix, as torchvision's references do."""

    def __init__(self, dl, mix):
        self.dl, self.mix = dl, mix

    def __iter__(self):
        for x, y in self.dl:
            yield self.mix(x, y)


def heavy_recipe(classes: int) -> tuple[T.Compose, T.RandomChoice]:
    """The heavy recipe's ``batch_transform``, and its MixUp-or-CutMix part alone."""
    mix = T.RandomChoice([T.MixUp(0.8, num_classes=classes), T.CutMix(1.0, num_classes=classes)])
    return T.Compose([T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.RandomErasing(0.25), mix]), mix


def contenders(photos: str, shards: str, classes: int, dali: bool = False) -> dict:
    heavy, mix = heavy_recipe(classes)
    fd = dict(batch_size=BATCH, crop=CROP, device="cpu", num_workers=WORKERS)
    # the PIL hooks, which hold the GIL, in worker processes
    procs = dict(batch_size=BATCH, crop=CROP, device="cpu",
                 backend=fastdata.TorchBackend(workers="process", num_workers=WORKERS))

    def folder(jitter, erase):
        dl = torch.utils.data.DataLoader(PerImage(photos, jitter=jitter, erase=erase),
                                         batch_size=BATCH, shuffle=True, drop_last=True,
                                         num_workers=WORKERS, persistent_workers=True)
        return Mixed(dl, mix) if erase else dl

    return {
        "built-in": fastdata.Loader(shards, **fd),
        "heavy": fastdata.Loader(shards, batch_transform=heavy, **fd),
        "heavy, per image": folder(pil_jitter, True),
        "PIL ColorJitter sample_transform": fastdata.Loader(
            shards, sample_transform=jitter_sample, **procs),
        "PIL ColorJitter, per image": folder(pil_jitter, False),
        "PIL TrivialAugment sample_transform": fastdata.Loader(
            shards, sample_transform=trivial_sample, **procs),
        "PIL TrivialAugment, per image": folder(trivial_augment, False),
        "TrivialAugment batch_transform": fastdata.Loader(
            shards, batch_transform=T.TrivialAugment(), **fd),
        **({"DALI built-in": fastdata.Loader(shards, backend="dali", **fd),
            "DALI PIL TrivialAugment sample_transform": fastdata.Loader(
                shards, backend="dali", sample_transform=trivial_sample, **fd)} if dali else {}),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("photos")
    ap.add_argument("--work", default="/tmp/fd-recipes")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=40, help="timed batches a run")
    ap.add_argument("--dali", action="store_true", help="add the DALI backend (CPU-only mode)")
    ap.add_argument("--only", default="", help="run the contenders whose name has this text")
    a = ap.parse_args()
    torch.set_num_threads(1)    # the loaders parallelise over their own workers
    shards = os.path.join(a.work, "hdf5-raw-256")
    if not os.path.exists(os.path.join(shards, "manifest.json")):
        convert(a.photos, shards, container="hdf5", sizes=[256], encoding="raw", progress=False)
    warm(a.photos)
    warm(shards)
    loaders = {k: v for k, v in contenders(a.photos, shards, len(fastdata.open(shards).classes),
                                           a.dali).items() if a.only in k}
    runs: dict[str, list[float]] = {k: [] for k in loaders}
    for r in range(a.rounds):
        for name, loader in loaders.items():
            rate, _ = throughput(loader, max_batches=a.batches, warmup=3)
            runs[name].append(rate)
            print(json.dumps({"round": r, "contender": name, "img_s": round(rate, 1)}),
                  flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    print("\n| Contender | img/s (median) | runs | vs per image |\n| --- | --- | --- | --- |")
    ref = {k: k.replace(" sample_transform", ", per image") for k in med
           if "sample_transform" in k and k.replace(" sample_transform", ", per image") in med}
    ref["heavy"] = "heavy, per image"
    ref["TrivialAugment batch_transform"] = "PIL TrivialAugment, per image"
    for name, rate in med.items():
        vs = f"{rate / med[ref[name]]:.1f}x" if ref.get(name) in med else ""
        print(f"| {name} | {rate:.0f} | {', '.join(f'{v:.0f}' for v in runs[name])} | {vs} |")


if __name__ == "__main__":
    main()
