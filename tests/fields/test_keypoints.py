"""Keypoints (COCO person keypoints): converted through the image's fit, moved by the crop
and flip with their images, left/right swapped by the flip, cut away points invisible."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from PIL import Image

import fastdata
from fastdata.converters.convert import convert
from fastdata.fields import FieldError, field_of

NAMES = ["nose", "left_eye", "right_eye"]
MARKERS = {"nose": (255, 0, 0), "left_eye": (0, 200, 0), "right_eye": (0, 0, 255)}


def _person_folder(root, n: int = 6, seed: int = 0):
    """``root/img/<i>.png``: white pictures (wider than high: the fit crops them) of one
    person each, its three keypoints painted as 5x5 squares of their marker colour; and
    ``root/person.json``, the COCO annotations with those keypoints."""
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(root, "img"), exist_ok=True)
    images, anns = [], []
    for i in range(n):
        w, h = 120, 90
        a = np.full((h, w, 3), 255, np.uint8)
        points = []
        for name in NAMES:
            x, y = int(rng.integers(25, 95)), int(rng.integers(10, 80))
            a[y - 2:y + 3, x - 2:x + 3] = MARKERS[name]
            points += [x, y, 2]
        Image.fromarray(a).save(os.path.join(root, "img", f"{i}.png"))
        images.append({"id": i + 1, "file_name": f"img/{i}.png", "width": w, "height": h})
        anns.append({"id": i + 1, "image_id": i + 1, "category_id": 1, "iscrowd": 0,
                     "bbox": [15.0, 5.0, 90.0, 80.0], "keypoints": points, "num_keypoints": 3})
    path = os.path.join(root, "person.json")
    with open(path, "w") as f:
        json.dump({"images": images, "annotations": anns, "categories": [
            {"id": 1, "name": "person", "keypoints": NAMES, "skeleton": [[2, 3], [1, 2]]}]}, f)
    return str(root), path


@pytest.fixture(scope="module")
def person_set(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kp")
    src, ann = _person_folder(tmp / "src")
    out = str(tmp / "set")
    convert(src, out, sizes=[64], coco=ann, progress=False)
    return out


def _centroid(image: np.ndarray, colour) -> tuple[float, float] | None:
    """The centre of the pixels of ``image`` (HWC, values in [0, 1]) near ``colour``."""
    c = np.asarray(colour, np.float64) / 255
    near = np.abs(image - c).max(-1) < 0.25
    if near.sum() < 2:
        return None
    ys, xs = np.nonzero(near)
    return xs.mean() + 0.5, ys.mean() + 0.5


def test_the_field_takes_its_names_and_mirrors_left_and_right():
    kind = field_of("keypoints", names=NAMES)
    assert kind.flip_pairs == [("left_eye", "right_eye")]
    assert kind.flip_order.tolist() == [0, 2, 1]
    assert field_of("keypoints", **kind.params()) == kind
    value = kind.parse("[[[0.5, 0.5, 2], [0.25, 0.5, 1], [0.75, 0.5, 0]]]", "row 1")
    assert value.shape == (1, 3, 3)
    assert np.array_equal(kind.from_bytes(kind.to_bytes(value), ""), value)
    moved = kind.move(value[0][None], (0, 0, 8, 8), True, 8, 16)
    assert moved[0, 1].tolist() == [4.0, 8.0, 0.0] and moved[0, 2].tolist() == [12.0, 8.0, 1.0]
    with pytest.raises(FieldError, match="v is not 0, 1 or 2"):
        kind.parse([[[0, 0, 3]] * 3], "row 2")
    with pytest.raises(FieldError, match="not instances of 3 points"):
        kind.parse([[0, 0]], "row 3")
    with pytest.raises(ValueError, match="names a point that is not one"):
        field_of("keypoints", names=NAMES, flip_pairs=[["nose", "ear"]])


@pytest.mark.parametrize("backend", ["torch", "dali"])
def test_keypoints_land_on_their_markers_after_crop_and_flip(person_set, backend):
    if backend == "dali":
        pytest.importorskip("nvidia.dali", reason="needs DALI")
    ds = fastdata.open(person_set)
    assert ds.annotations.keypoints.shape == (6, 3, 3)
    loader = fastdata.Loader(person_set, batch_size=6, crop=48, device="cpu", mean=(0, 0, 0),
                             std=(1, 1, 1), scale=(0.5, 1.0), seed=1, backend=backend)
    flipped = checked = 0
    for epoch in range(4):
        loader.set_epoch(epoch)
        images, targets = next(iter(loader))
        for image, t in zip(images.permute(0, 2, 3, 1).numpy(), targets):
            points = t["keypoints"]
            assert points.shape == (1, 3, 3) and points.dtype == torch.float32
            mirrored = False
            for k, name in enumerate(NAMES):
                x, y, v = points[0, k].tolist()
                if v == 0:      # cut away by the crop: its marker is (mostly) not there
                    assert not (0 <= x < 48 and 0 <= y < 48)
                    continue
                here = _centroid(image, MARKERS[name])
                other = {"left_eye": "right_eye", "right_eye": "left_eye"}.get(name)
                there = _centroid(image, MARKERS[other]) if other else None
                if here is not None and abs(here[0] - x) <= 1 and abs(here[1] - y) <= 1:
                    checked += 1
                else:       # a flipped image: the left eye is where the right one was painted
                    assert there is not None and abs(there[0] - x) <= 1 and \
                        abs(there[1] - y) <= 1, (name, (x, y), here, there)
                    mirrored = True
            flipped += mirrored
    assert checked >= 20 and flipped >= 2


def test_unflipped_and_uncropped_keypoints_are_the_stored_ones(person_set):
    loader = fastdata.Loader(person_set, batch_size=6, train=False, device="cpu",
                             targets="padded")
    _, targets = next(iter(loader))
    ann = fastdata.open(person_set).annotations
    assert targets["keypoints"].shape == (6, 1, 3, 3)
    want = ann.keypoints.copy()
    want[..., :2] *= 64
    assert torch.allclose(targets["keypoints"][:, 0], torch.from_numpy(want))


def test_bad_keypoints_in_a_coco_file_skip_their_annotation(tmp_path):
    src, ann = _person_folder(tmp_path / "src", n=2)
    d = json.loads(open(ann).read())
    d["annotations"][0]["keypoints"] = [1, 2, 5] * 3
    d["annotations"][1]["keypoints"] = [1, 2]
    with open(ann, "w") as f:
        json.dump(d, f)
    m = convert(src, str(tmp_path / "o"), sizes=[32], coco=ann, progress=False)
    reasons = [s["reason"] for s in m["skipped"]]
    assert "a keypoint's visibility is not 0, 1 or 2" in reasons
    assert "keypoints is not 9 finite numbers [x1, y1, v1, ...]" in reasons
