"""Detection and segmentation sets through the loader: boxes, masks and class maps move with
their pixels through every crop, flip and resize, in threads and processes, from both
containers and both encodings, on both backends."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import fastdata
from fastdata.converters.convert import convert
from tests.helpers import colour_regions, detection_folder, stored_targets


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("det")
    src, ann = detection_folder(tmp / "src", n=10, maps=True)
    out = {"segmentation": str(tmp / "segmentation")}
    convert(src, out["segmentation"], sizes=[64, 128], masks=f"{src}-maps", shard_size=4,
            num_workers=1, progress=False)
    for container, encoding, fit in (("hdf5", "raw", "crop"), ("lmdb", "raw", "crop"),
                                     ("hdf5", "raw", "pad"), ("hdf5", "raw", "stretch"),
                                     ("hdf5", "jpeg", "crop")):
        key = f"{container}-{encoding}-{fit}"
        out[key] = str(tmp / key)
        convert(src, out[key], container=container, encoding=encoding, fit=fit,
                sizes=[64, 128], coco=ann, shard_size=4, num_workers=1, progress=False)
    return out


def eroded(m: np.ndarray, r: int = 1) -> np.ndarray:
    """Pixels of ``m`` whose (2r+1)^2 neighbourhood is all in ``m``."""
    p = np.pad(m, r)
    h, w = m.shape
    k = 2 * r + 1
    return np.logical_and.reduce([p[i:i + h, j:j + w] for i in range(k) for j in range(k)])


def iou(a, b) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def check_batch(images: torch.Tensor, targets: list[dict], r: int = 1) \
        -> list[tuple[float, float]]:
    """Every target box and mask against the colours of its image: each box's shorter side
    and IoU with the region of its colour (boxes of 8 output pixels or more a side), each of
    its edges inside the crop within 0.75 output pixels of the region's (which is whole
    pixels); each mask's pixels farther than ``r`` output pixels (a stored pixel, magnified
    by the crop) from its edge have its colour inside, and not outside."""
    out = images.shape[-1]
    regions = colour_regions(images.permute(0, 2, 3, 1).numpy())
    ious = []
    for region, t in zip(regions, targets):
        assert t["boxes"].dtype == torch.float32 and t["labels"].dtype == torch.int64
        for j, box in enumerate(t["boxes"].tolist()):
            x0, y0, x1, y1 = (round(v) for v in box)
            inside = region[y0:y1, x0:x1]
            colour = np.bincount(inside[inside >= 0]).argmax()
            assert t["labels"][j].item() == 1 + colour % 2      # cat (id 3), dog, cat
            ys, xs = np.nonzero(region == colour)
            region_box = (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)
            inner = [0.5 < v < out - 0.5 for v in box]
            assert all(abs(a - b) <= 0.75 for a, b, i in zip(region_box, box, inner) if i)
            side = min(box[2] - box[0], box[3] - box[1])
            if side >= 8:
                ious.append((side, iou(box, region_box)))
            if "masks" in t:        # inside the mask: its colour; off it: not
                m = t["masks"][j].numpy().astype(bool)
                core, outside = eroded(m, r), eroded(~m, r)
                assert (region[core] == colour).all()
                assert (region[outside] != colour).all()
    return ious


@pytest.mark.parametrize("key", ["hdf5-raw-crop", "lmdb-raw-crop", "hdf5-raw-pad",
                                 "hdf5-raw-stretch"])
@pytest.mark.parametrize("crop", [64, 128])
def test_boxes_and_masks_follow_crops_and_flips(sets, key, crop):
    """Box edges within 0.75 output pixels of their pixels' (``check_batch``); IoU >= 0.9
    for boxes from 8 output pixels a side, and >= 0.95 from 40 (a region's extent is whole
    pixels: half a pixel each side weighs more on a small box)."""
    # crops of a quarter of the stored area or more: a stored pixel is at most
    # crop / sqrt(0.25 * 128^2 * 3/4) output pixels wide
    r = math.ceil(crop / math.sqrt(0.25 * 128 ** 2 * 0.75))
    ld = fastdata.Loader(sets[key], batch_size=5, crop=crop, dtype="uint8", device="cpu",
                         num_workers=2, seed=3, scale=(0.25, 1.0))
    ious = []
    for epoch in range(3):
        ld.set_epoch(epoch)
        for images, targets in ld:
            assert images.shape == (5, 3, crop, crop) and len(targets) == 5
            ious += check_batch(images, targets, r)
    assert len(ious) > 20 and min(v for _, v in ious) >= 0.9, sorted(ious)[:5]
    assert min(v for side, v in ious if side >= 40) >= 0.95


def test_eval_resizes_without_randomness(sets):
    ld = fastdata.Loader(sets["hdf5-raw-crop"], batch_size=4, train=False, crop=64,
                         dtype="uint8", device="cpu", num_workers=0)
    first = [t["boxes"] for _, ts in ld for t in ts]
    again = [t["boxes"] for _, ts in ld for t in ts]
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    ious = [v for images, ts in ld for _, v in check_batch(images, ts)]
    assert min(ious) >= 0.9


def test_threads_processes_and_containers_give_the_same_targets(sets):
    def all_targets(path, **kw):
        ld = fastdata.Loader(path, batch_size=3, crop=64, device="cpu", seed=1, **kw)
        return [t for _, ts in ld for t in ts]

    a = all_targets(sets["hdf5-raw-crop"], num_workers=0)
    processes = fastdata.TorchBackend(num_workers=2, workers="process")
    for path, kw in ((sets["hdf5-raw-crop"], {"backend": processes}),
                     (sets["lmdb-raw-crop"], {"num_workers": 2}),
                     (sets["hdf5-jpeg-crop"], {"num_workers": 2})):
        b = all_targets(path, **kw)
        assert len(a) == len(b) and len(a) > 0
        for x, y in zip(a, b):
            assert x.keys() == y.keys()
            assert all(torch.equal(x[k], y[k]) for k in x)


def test_jpeg_shards_targets_follow_their_pixels(sets):
    ld = fastdata.Loader(sets["hdf5-jpeg-crop"], batch_size=5, crop=64, dtype="uint8",
                         device="cpu", num_workers=1)
    boxes = [t for _, ts in ld for t in ts]
    assert sum(len(t["boxes"]) for t in boxes) > 0
    for images, targets in ld:          # JPEG's edges blur: boxes only, by their IoU
        regions = colour_regions(images.permute(0, 2, 3, 1).numpy())
        for region, t in zip(regions, targets):
            for box in t["boxes"].tolist():
                if min(box[2] - box[0], box[3] - box[1]) < 12:
                    continue
                x0, y0, x1, y1 = (round(v) for v in box)
                inside = region[y0:y1, x0:x1]
                colour = np.bincount(inside[inside >= 0]).argmax()
                ys, xs = np.nonzero(region == colour)
                assert iou(box, (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)) >= 0.9


def test_padded_targets_hold_the_list_targets(sets):
    kw = {"batch_size": 4, "crop": 64, "device": "cpu", "num_workers": 0, "seed": 5}
    listed = fastdata.Loader(sets["hdf5-raw-crop"], **kw)
    padded = fastdata.Loader(sets["hdf5-raw-crop"], targets="padded", **kw)
    for (_, ts), (_, p) in zip(listed, padded):
        assert p["counts"].tolist() == [len(t["labels"]) for t in ts]
        for i, t in enumerate(ts):
            n = len(t["labels"])
            assert torch.equal(p["boxes"][i, :n], t["boxes"])
            assert torch.equal(p["masks"][i, :n], t["masks"])
            assert (p["labels"][i, n:] == -1).all() and torch.equal(p["labels"][i, :n],
                                                                    t["labels"])


@pytest.mark.parametrize("backend", ["torch", "dali"])
def test_the_boxes_a_crop_keeps_follow_the_rule_given(sets, backend):
    """By default every box of which a pixel is left stays (torchvision's convention); with
    ``min_visible=0.1`` those cut to less than a tenth of their area go, and only those; the
    same on both backends. Labels are class index + 1."""
    if backend == "dali":
        pytest.importorskip("nvidia.dali", reason="DALI not installed")
    ds = fastdata.open(sets["hdf5-raw-crop"])
    kw = dict(batch_size=5, crop=64, device="cpu", num_workers=0, scale=(0.02, 0.05), seed=2,
              backend=backend)
    plain = [ts for _, ts in fastdata.Loader(ds, **kw)]
    strict = [ts for _, ts in fastdata.Loader(ds, targets=fastdata.Targets(min_visible=0.1),
                                              **kw)]
    kept = sum(len(t["boxes"]) for ts in plain for t in ts)
    total = sum(len(t["boxes"]) for t in stored_targets(ds, 64)) // 5 * 5
    assert 0 < sum(len(t["boxes"]) for ts in strict for t in ts) < kept <= total
    for loose, tight in zip(plain, strict):
        for a, b in zip(loose, tight):
            assert ((a["labels"] >= 1) & (a["labels"] <= len(ds.classes))).all()
            assert (a["boxes"][:, 2:] - a["boxes"][:, :2] >= 1).all()
            rows = {tuple(r) for r in a["boxes"].tolist()}
            assert {tuple(r) for r in b["boxes"].tolist()} <= rows


def test_batch_transform_receives_the_targets(sets):
    seen = []

    def hook(images, targets):
        seen.append(targets)
        return images, targets

    ld = fastdata.Loader(sets["hdf5-raw-crop"], batch_size=4, crop=64, device="cpu",
                         num_workers=0, batch_transform=hook)
    for _, ts in ld:
        assert ts is seen[-1] and isinstance(ts, list) and "boxes" in ts[0]


@pytest.mark.parametrize("key", ["hdf5-raw-crop", "hdf5-raw-pad", "hdf5-jpeg-crop"])
@pytest.mark.parametrize("train", [True, False])
def test_the_dali_backend_gives_the_torch_backends_targets(sets, key, train):
    pytest.importorskip("nvidia.dali", reason="DALI not installed")
    kw = {"batch_size": 4, "crop": 64, "device": "cpu", "num_workers": 2, "seed": 4,
          "train": train, "dtype": "uint8", "scale": (0.25, 1.0)}
    torch_ld = fastdata.Loader(sets[key], **kw)
    dali_ld = fastdata.Loader(sets[key], backend="dali", **kw)
    ious = []
    for epoch in (0, 1):
        torch_ld.set_epoch(epoch)
        dali_ld.set_epoch(epoch)
        pairs = list(zip(torch_ld, dali_ld, strict=True))
        assert len(pairs) == len(torch_ld) > 0
        for (_, a), (images, b) in pairs:
            assert len(a) == len(b)
            for x, y in zip(a, b):
                assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
            if "raw" in key:        # DALI's pixels: the same crops, so the same boxes on them
                ious += check_batch(images, b, r=2)
    assert not ious or min(v for _, v in ious) >= 0.9


def test_a_mixture_refuses_a_detection_set(sets):
    with pytest.raises(ValueError, match="segmentation sets are read one at a time"):
        fastdata.Loader([sets["hdf5-raw-crop"], sets["lmdb-raw-crop"]], batch_size=2,
                        device="cpu")


def test_class_maps_follow_crops_and_flips(sets):
    r = math.ceil(64 / math.sqrt(0.25 * 128 ** 2 * 0.75))
    for workers in ("thread", "process"):
        ld = fastdata.Loader(sets["segmentation"], batch_size=5, crop=64, dtype="uint8",
                             device="cpu", backend=fastdata.TorchBackend(num_workers=2,
                                                                         workers=workers), seed=1,
                             scale=(0.25, 1.0))
        for epoch in range(2):
            ld.set_epoch(epoch)
            for images, maps in ld:
                assert maps.shape == (5, 64, 64) and maps.dtype == torch.int64
                regions = colour_regions(images.permute(0, 2, 3, 1).numpy())
                for region, m in zip(regions, maps.numpy()):
                    for c in range(4):      # away from its edges, a class is its colour
                        assert (region[eroded(m == c, r)] == c - 1).all()


def test_both_backends_give_the_same_class_maps(sets):
    pytest.importorskip("nvidia.dali", reason="DALI not installed")
    kw = {"batch_size": 4, "crop": 48, "device": "cpu", "num_workers": 2, "seed": 2}
    pairs = list(zip(fastdata.Loader(sets["segmentation"], **kw),
                     fastdata.Loader(sets["segmentation"], backend="dali", **kw), strict=True))
    assert pairs and all(torch.equal(a, b) for (_, a), (_, b) in pairs)


@pytest.mark.gpu
@pytest.mark.parametrize("key", ["hdf5-raw-crop", "segmentation"])
def test_targets_reach_a_cuda_device_as_on_the_cpu(sets, key):
    kw = {"batch_size": 4, "crop": 64, "num_workers": 2, "seed": 6}
    for (_, a), (_, b) in zip(fastdata.Loader(sets[key], device="cpu", **kw),
                              fastdata.Loader(sets[key], device="cuda", **kw), strict=True):
        if torch.is_tensor(a):
            assert b.is_cuda and torch.equal(a, b.cpu())
            continue
        for x, y in zip(a, b):
            assert all(y[k].is_cuda and torch.equal(x[k], y[k].cpu()) for k in x)


@pytest.mark.parametrize("backend", ["torch", "dali"])
@pytest.mark.parametrize("key", ["hdf5-raw-crop", "segmentation"])
def test_a_dict_batch_holds_the_targets_as_its_label(sets, key, backend):
    if backend == "dali":
        pytest.importorskip("nvidia.dali", reason="DALI not installed")
    kw = {"batch_size": 4, "crop": 48, "device": "cpu", "seed": 3, "backend": backend}
    pairs = list(zip(fastdata.Loader(sets[key], **kw),
                     fastdata.Loader(sets[key], fields=["image", "label"], **kw), strict=True))
    assert pairs
    for (images, targets), batch in pairs:
        assert list(batch) == ["image", "label"] and torch.equal(images, batch["image"])
        if key == "segmentation":
            assert torch.equal(targets, batch["label"])
            continue
        assert len(targets) == len(batch["label"]) == len(images)
        for x, y in zip(targets, batch["label"]):
            assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
