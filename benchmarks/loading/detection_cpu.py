"""Detection loading on the CPU, loader only (the figures of docs/performance.md): fastdata
against the per-sample pipeline a user writes today, with boxes and with instance masks.

    OPENBLAS_NUM_THREADS=1 python -W ignore -m benchmarks.loading.detection_cpu /tmp/photos \\
        --rounds 3

Photos (any folder of JPEGs, e.g. ``make_photos.py``'s) with generated COCO annotations: ~7
instances an image, each a random star-shaped polygon of 8 to 16 points (its box and
polygon). fastdata converts them at 256 px (raw HDF5) three times, timed: without
annotations (class folders), with the boxes only and with masks; and reads the last two with
RandomResizedCrop 224 + flip + normalise to float32, targets moved with the pixels. The
baseline is a ``DataLoader`` over a ``Dataset`` that does what torchvision's v2 transforms
do per sample: PIL decode, the masks from pycocotools' ``annToMask``, RandomResizedCrop (PIL
bilinear for the image, nearest for the masks), boxes shifted, scaled, clipped and filtered,
flip, to float and normalised; the targets collated as a list of dicts. Batch 32, 2 workers
each (threads for fastdata, processes for the DataLoader, their start in the timed epoch);
each run a fresh interpreter, an untimed pass of 3 batches, then one timed epoch; the runs
interleaved round by round; medians of img/s and CPU ms per image.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

BASELINE = r"""
import math, random, sys, json, os, time, numpy as np, torch
import pycocotools.mask as mask_api
from PIL import Image
from torch.nn import functional as F
torch.set_num_threads(1)
root, ann_path, with_masks = sys.argv[1], sys.argv[2], sys.argv[3] == "masks"
coco = json.load(open(ann_path))
by_image = {}
for a in coco["annotations"]:
    by_image.setdefault(a["image_id"], []).append(a)
cats = {c["id"]: k + 1 for k, c in enumerate(sorted(coco["categories"], key=lambda c: c["id"]))}
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1) * 255
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1) * 255


def rrc_params(w, h, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    area = w * h
    for _ in range(10):
        target = area * random.uniform(*scale)
        aspect = math.exp(random.uniform(math.log(ratio[0]), math.log(ratio[1])))
        cw, ch = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < cw <= w and 0 < ch <= h:
            return random.randint(0, h - ch), random.randint(0, w - cw), ch, cw
    return 0, 0, h, w


class Detection(torch.utils.data.Dataset):
    def __init__(self):
        self.images = coco["images"]

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        info = self.images[i]
        img = Image.open(os.path.join(root, info["file_name"])).convert("RGB")
        anns = by_image.get(info["id"], [])
        w, h = img.size
        boxes = torch.tensor([a["bbox"] for a in anns], dtype=torch.float32).view(-1, 4)
        boxes[:, 2:] += boxes[:, :2]
        labels = torch.tensor([cats[a["category_id"]] for a in anns], dtype=torch.int64)
        top, left, ch, cw = rrc_params(w, h)
        img = img.resize((224, 224), Image.BILINEAR, box=(left, top, left + cw, top + ch))
        sx, sy = 224 / cw, 224 / ch
        boxes = (boxes - torch.tensor([left, top, left, top])) * torch.tensor([sx, sy, sx, sy])
        area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
        boxes = boxes.clamp(0, 224)
        cw_, ch_ = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
        keep = (cw_ >= 1) & (ch_ >= 1) & (cw_ * ch_ >= 0.1 * area)
        boxes, labels = boxes[keep], labels[keep]
        target = {"boxes": boxes, "labels": labels}
        if with_masks:
            m = np.stack([mask_api.decode(mask_api.merge(mask_api.frPyObjects(
                a["segmentation"], h, w))) for a in anns]) if anns else \
                np.zeros((0, h, w), np.uint8)
            m = torch.from_numpy(m)[:, top:top + ch, left:left + cw]
            m = F.interpolate(m[None].float(), size=(224, 224), mode="nearest")[0].to(torch.uint8)
            target["masks"] = m[keep]
        x = torch.from_numpy(np.asarray(img)).permute(2, 0, 1)
        if random.random() < 0.5:
            x = x.flip(-1)
            target["boxes"] = torch.stack([224 - boxes[:, 2], boxes[:, 1], 224 - boxes[:, 0],
                                           boxes[:, 3]], 1)
            if with_masks:
                target["masks"] = target["masks"].flip(-1)
        return (x.float() - MEAN) / STD, target


def collate(batch):
    return torch.stack([b[0] for b in batch]), [b[1] for b in batch]


loader = torch.utils.data.DataLoader(Detection(), batch_size=32, shuffle=True, num_workers=2,
                                     collate_fn=collate, drop_last=True)
for k, _ in enumerate(loader):
    if k == 2:
        break
# the workers' CPU time is counted once they exit: fresh ones for the timed epoch, joined
# at its end
c, t, n = os.times(), time.perf_counter(), 0
for x, y in loader:
    n += len(x)
secs = time.perf_counter() - t
c2 = os.times()
cpu = c2.user + c2.system - c.user - c.system + c2.children_user + c2.children_system \
    - c.children_user - c.children_system
print(json.dumps([n / secs, 1000 * cpu / n]))
"""

FASTDATA = r"""
import json, os, sys, time, torch, fastdata
torch.set_num_threads(1)
loader = fastdata.Loader(sys.argv[1], batch_size=32, crop=224, device="cpu", num_workers=2)
loader.set_epoch(0)
for k, _ in enumerate(loader):
    if k == 2:
        break
c, t, n = os.times(), time.perf_counter(), 0
loader.set_epoch(1)
for x, y in loader:
    n += len(x)
c2, secs = os.times(), time.perf_counter() - t
print(json.dumps([n / secs, 1000 * (c2.user + c2.system - c.user - c.system) / n]))
"""


def star(rng, cx, cy, r) -> list[float]:
    """A random star-shaped polygon around (cx, cy) of radius about ``r``."""
    k = int(rng.integers(8, 17))
    angles = np.sort(rng.uniform(0, 2 * np.pi, k))
    radii = r * rng.uniform(0.4, 1.0, k)
    return np.stack([cx + radii * np.cos(angles), cy + radii * np.sin(angles)], 1).ravel().tolist()


def annotate(root: str, count: int | None, dest: str, seed: int = 0) -> tuple[str, str]:
    """COCO files (masks, boxes only) in ``dest`` for ``count`` of the JPEGs under ``root``."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    paths = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root)
                   for f in fs if f.lower().endswith((".jpg", ".jpeg")))[:count or None]
    images, anns = [], []
    for i, p in enumerate(paths):
        with Image.open(os.path.join(root, p)) as im:
            w, h = im.size
        images.append({"id": i, "file_name": p, "width": w, "height": h})
        for _ in range(int(rng.integers(4, 11))):
            r = rng.uniform(0.05, 0.3) * min(w, h)
            poly = np.array(star(rng, rng.uniform(r, w - r), rng.uniform(r, h - r), r))
            x, y = poly[0::2].clip(0, w), poly[1::2].clip(0, h)
            anns.append({"id": len(anns), "image_id": i, "category_id": int(rng.integers(1, 11)),
                         "bbox": [x.min(), y.min(), x.max() - x.min(), y.max() - y.min()],
                         "iscrowd": 0, "segmentation": [poly.tolist()]})
    cats = [{"id": k, "name": f"class{k:02d}"} for k in range(1, 11)]
    masks, boxes = os.path.join(dest, "masks.json"), os.path.join(dest, "boxes.json")
    with open(masks, "w") as f:
        json.dump({"images": images, "annotations": anns, "categories": cats}, f)
    with open(boxes, "w") as f:
        json.dump({"images": images, "categories": cats,
                   "annotations": [{k: v for k, v in a.items() if k != "segmentation"}
                                   for a in anns]}, f)
    return masks, boxes


def run(code: str, *args: str) -> list[float]:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("photos")
    p.add_argument("--images", type=int, default=None, help="annotate this many (default: all)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None, help="write the results here as JSON")
    a = p.parse_args()
    import fastdata
    from fastdata.converters.convert import convert

    with tempfile.TemporaryDirectory() as tmp:
        masks_json, boxes_json = annotate(a.photos, a.images, tmp)
        sets, seconds = {}, {}
        for what, ann in (("plain", None), ("boxes", boxes_json), ("masks", masks_json)):
            sets[what] = os.path.join(tmp, what)
            t = time.perf_counter()
            convert(a.photos, sets[what], sizes=[256], coco=ann, progress=False)
            seconds[what] = time.perf_counter() - t
        n = fastdata.open(sets["masks"]).manifest["num_samples"]
        print("convert, s: " + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items()) +
              f"; annotations: boxes {1000 * (seconds['boxes'] - seconds['plain']) / n:.2f}, "
              f"masks {1000 * (seconds['masks'] - seconds['plain']) / n:.2f} ms an image "
              f"({n} images)", flush=True)
        results: dict = {f"{who} {what}": [] for what in ("boxes", "masks")
                         for who in ("fastdata", "baseline")}
        for r in range(a.rounds):
            for what, ann in (("boxes", boxes_json), ("masks", masks_json)):
                results[f"fastdata {what}"].append(run(FASTDATA, sets[what]))
                results[f"baseline {what}"].append(run(BASELINE, a.photos, ann, what))
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1][0]:.0f} img/s"
                                                for k, v in results.items()), flush=True)
    table: dict = {k: {"img_per_s": statistics.median(x[0] for x in v),
                       "cpu_ms_per_img": statistics.median(x[1] for x in v), "runs": v}
                   for k, v in results.items()}
    for what in ("boxes", "masks"):
        f, b = table[f"fastdata {what}"], table[f"baseline {what}"]
        print(f"{what}: fastdata {f['img_per_s']:.0f} img/s ({f['cpu_ms_per_img']:.2f} CPU "
              f"ms/img), baseline {b['img_per_s']:.0f} img/s ({b['cpu_ms_per_img']:.2f} CPU "
              f"ms/img): {f['img_per_s'] / b['img_per_s']:.1f}x")
    if a.out:
        with open(a.out, "w") as fh:
            json.dump({**table, "convert_seconds": seconds}, fh, indent=1)


if __name__ == "__main__":
    main()
