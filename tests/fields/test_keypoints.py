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
from fastdata.cli.info import info_dict
from fastdata.converters.convert import convert
from fastdata.fields import FieldError, field_of
from tests.helpers import earlier_detection_set

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


def _check_on_markers(image: np.ndarray, points: torch.Tensor, out: int) -> tuple[int, bool]:
    """How many of one image's points lie within a pixel of their markers, and whether the
    image is mirrored (each eye where the other's marker was painted)."""
    checked, mirrored = 0, False
    for k, name in enumerate(NAMES):
        x, y, v = points[0, k].tolist()
        if v == 0:      # cut away by the crop: its marker is (mostly) not there
            assert not (0 <= x < out and 0 <= y < out)
            continue
        here = _centroid(image, MARKERS[name])
        other = {"left_eye": "right_eye", "right_eye": "left_eye"}.get(name)
        there = _centroid(image, MARKERS[other]) if other else None
        if here is None and there is None:      # blurred past its colour: nothing to check
            continue
        if here is not None and abs(here[0] - x) <= 1 and abs(here[1] - y) <= 1:
            checked += 1
        elif there is not None and abs(there[0] - x) <= 1 and abs(there[1] - y) <= 1:
            mirrored = True     # a flipped image: the left eye is where the right one was
        else:   # unchecked only where one eye's marker is blurred away: which way is unknown
            assert other is not None and None in (here, there), (name, (x, y), here, there)
    return checked, mirrored


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
    assert ds.label_field.points.names == NAMES and len(ds) == 6
    loader = fastdata.Loader(person_set, batch_size=6, crop=48, device="cpu", mean=(0, 0, 0),
                             std=(1, 1, 1), scale=(0.5, 1.0), seed=1, backend=backend)
    flipped = checked = 0
    for epoch in range(4):
        loader.set_epoch(epoch)
        images, targets = next(iter(loader))
        for image, t in zip(images.permute(0, 2, 3, 1).numpy(), targets):
            points = t["keypoints"]
            assert points.shape == (1, 3, 3) and points.dtype == torch.float32
            c, m = _check_on_markers(image, points, 48)
            checked, flipped = checked + c, flipped + m
    assert checked >= 20 and flipped >= 2


def test_unflipped_and_uncropped_keypoints_are_the_stored_ones(person_set):
    loader = fastdata.Loader(person_set, batch_size=6, train=False, device="cpu",
                             targets="padded")
    _, targets = next(iter(loader))
    ds = fastdata.open(person_set)
    assert targets["keypoints"].shape == (6, 1, 3, 3)
    want = np.stack([v[:, 6:] for v in ds.field_values("label", np.arange(6))]).reshape(
        6, 3, 3)
    want[..., :2] *= 64
    assert torch.allclose(targets["keypoints"][:, 0], torch.from_numpy(want))


def test_a_version_3_person_set_gives_todays_keypoints(tmp_path):
    """A version 3 set's keypoints (in ``annotations.bin``) move as today's field's."""
    src, ann = _person_folder(tmp_path / "src")
    old = earlier_detection_set(src, str(tmp_path / "v3"), ann, sizes=[64])
    assert fastdata.open(old).annotations.keypoints.shape == (6, 3, 3)
    for path in (old, old + "-now"):
        assert info_dict(path)["keypoints"] == NAMES
    kw = dict(batch_size=6, crop=48, device="cpu", num_workers=0, seed=2, scale=(0.3, 1.0))
    for epoch in range(3):
        loaders = [fastdata.Loader(p, **kw) for p in (old, old + "-now")]
        for ld in loaders:
            ld.set_epoch(epoch)
        (_, a), (_, b) = (next(iter(ld)) for ld in loaders)
        for x, y in zip(a, b, strict=True):
            assert torch.allclose(x["keypoints"], y["keypoints"], atol=1e-4)
            assert torch.equal(x["labels"], y["labels"])


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


@pytest.fixture(scope="module", params=["crop", "pad", "stretch"])
def pose_set(tmp_path_factory, request):
    """The person pictures with their keypoints as a labels file's field (named points, as
    fractions of each picture), cropped, padded or stretched onto the square."""
    tmp = tmp_path_factory.mktemp("pose")
    src, ann = _person_folder(tmp / "src")
    coco = json.loads(open(ann).read())
    size = {im["id"]: (im["width"], im["height"]) for im in coco["images"]}
    path = tmp / "labels.jsonl"
    with open(path, "w") as f:
        for im, a in zip(coco["images"], coco["annotations"]):
            w, h = size[a["image_id"]]
            p = a["keypoints"]
            person = {name: [(p[3 * k] + 0.5) / w, (p[3 * k + 1] + 0.5) / h, 2]
                      for k, name in enumerate(NAMES)}
            f.write(json.dumps({"path": im["file_name"], "pose": [person],
                                "caption": f"person {im['id']}"}) + "\n")
    out = str(tmp / "set")
    convert(src, out, sizes=[64], labels=str(path), fields={"pose": "keypoints"},
            fit=request.param, progress=False)
    return out


@pytest.mark.parametrize("backend,workers", [("torch", "thread"), ("torch", "process"),
                                             ("dali", "thread")])
def test_a_labels_file_keypoints_field_moves_with_its_images(pose_set, backend, workers):
    if backend == "dali":
        pytest.importorskip("nvidia.dali", reason="needs DALI")
    ds = fastdata.open(pose_set)
    assert ds.fields["pose"].names == NAMES and ds[0]["pose"].shape == (1, 3, 3)
    if backend == "torch":
        backend = fastdata.TorchBackend(workers=workers, num_workers=2)
    loader = fastdata.Loader(pose_set, batch_size=6, crop=48, device="cpu", mean=(0, 0, 0),
                             std=(1, 1, 1), scale=(0.5, 1.0), seed=2, backend=backend,
                             fields=["image", "pose", "caption"])
    checked = flipped = 0
    for epoch in range(4):
        loader.set_epoch(epoch)
        batch = next(iter(loader))
        assert len(batch["caption"]) == 6 and len(batch["pose"]) == 6
        for image, points in zip(batch["image"].permute(0, 2, 3, 1).numpy(), batch["pose"]):
            assert points.shape == (1, 3, 3) and points.dtype == torch.float32
            c, m = _check_on_markers(image, points, 48)
            checked, flipped = checked + c, flipped + m
    assert checked >= 20 and flipped >= 2


def test_a_keypoints_field_without_crops_is_in_stored_pixels(pose_set):
    loader = fastdata.Loader(pose_set, batch_size=6, train=False, device="cpu",
                             fields=["image", "pose"])
    batch = next(iter(loader))
    stored = fastdata.open(pose_set).field_values("pose", np.arange(6))
    for points, want in zip(batch["pose"], stored):
        want = want.copy()
        want[..., :2] *= 64
        assert torch.allclose(points, torch.from_numpy(want))


def test_a_keypoints_field_names_its_points_and_a_point_the_fit_cuts_away_is_not_labelled(
        tmp_path):
    from fastdata.fields.infer import kind_named

    with pytest.raises(ValueError, match="names its points"):
        kind_named("keypoints", ["[[[0.5, 0.5, 2]]]"])
    kind = kind_named("keypoints", ['[{"nose": [0.5, 0.5]}]', '[{"left_eye": [0.1, 0.2, 1]}]'])
    assert kind.names == ["nose", "left_eye"]
    with pytest.raises(FieldError, match="'ear' is not one of the field's points"):
        kind.parse([{"ear": [0.1, 0.1]}], "row 3")
    src, _ = _person_folder(tmp_path / "src", n=2)
    labels = tmp_path / "l.jsonl"
    # 120x90 pictures: a crop keeps x from 15 to 105 px; a pad puts y at 0.125-0.875
    labels.write_text("".join(json.dumps({"path": f"img/{i}.png", "pose": [
        {"nose": [.5, .5], "left_eye": [.05, .5], "right_eye": [.95, 1.0]}]}) + "\n"
        for i in range(2)))
    for fit, want in [("crop", [[.5, .5, 2], [0, 0, 0], [0, 0, 0]]),
                      ("pad", [[.5, .5, 2], [.05, .5, 2], [.95, .875, 2]])]:
        convert(src, str(tmp_path / fit), sizes=[32], labels=str(labels), fit=fit,
                fields={"pose": "keypoints"}, progress=False)
        got = fastdata.open(str(tmp_path / fit)).field_values("pose", [0])[0]
        assert np.allclose(got, [want], atol=1e-6), (fit, got)


def test_a_new_kind_that_moves_with_the_pixels_is_one_registered_class(tmp_path):
    """A point per sample, defined here: converted from a labels file and loaded through crops
    and flips with nothing else told of it."""
    from fastdata.fields import FIELDS, FieldKind, register

    @register
    class Spot(FieldKind):
        kind, shape, moves = "spot", (2,), True

        def parse(self, cell, where):
            return np.asarray(json.loads(cell) if isinstance(cell, str) else cell, np.float32)

        def move(self, value, crop, flip, stored, out):
            top, left, h, w = (float(v) for v in crop)
            x, y = (value[0] * stored - left) * out / w, (value[1] * stored - top) * out / h
            return np.array([out - x if flip else x, y], np.float32)

    try:
        src, ann = _person_folder(tmp_path / "src")
        coco = json.loads(open(ann).read())
        with open(tmp_path / "l.jsonl", "w") as f:
            for im, a in zip(coco["images"], coco["annotations"]):
                x, y = a["keypoints"][:2]       # the nose
                f.write(json.dumps({"path": im["file_name"],
                                    "spot": [(x + .5) / im["width"], (y + .5) / im["height"]]})
                        + "\n")
        out = str(tmp_path / "set")
        convert(src, out, sizes=[64], labels=str(tmp_path / "l.jsonl"),
                fields={"spot": "spot"}, fit="stretch", progress=False)
        loader = fastdata.Loader(out, batch_size=6, crop=48, device="cpu", mean=(0, 0, 0),
                                 std=(1, 1, 1), scale=(0.6, 1.0), seed=3, fields=["image", "spot"])
        with pytest.raises(ValueError, match=r"field 'spot' \(spot\) moves with the pixels but "
                                             r"its kind has no place\(\) for --fit crop"):
            convert(src, str(tmp_path / "cropped"), sizes=[64], labels=str(tmp_path / "l.jsonl"),
                    fields={"spot": "spot"}, progress=False)
        assert not os.path.exists(tmp_path / "cropped")
        near = 0
        for epoch in range(3):
            loader.set_epoch(epoch)
            batch = next(iter(loader))
            assert batch["spot"].shape == (6, 2)
            for image, (x, y) in zip(batch["image"].permute(0, 2, 3, 1).numpy(),
                                     batch["spot"].tolist()):
                at = _centroid(image, MARKERS["nose"])
                if at is not None and 2 <= x < 46 and 2 <= y < 46:
                    assert abs(at[0] - x) <= 1 and abs(at[1] - y) <= 1, ((x, y), at)
                    near += 1
        assert near >= 6
    finally:
        del FIELDS["spot"]


def test_a_batch_moves_as_each_of_its_samples_would():
    kind = field_of("keypoints", names=NAMES)
    rng = np.random.default_rng(5)
    values = [np.dstack([rng.uniform(0, 1, (n, 3, 2)), np.full((n, 3, 1), 2.0)]).astype(
        np.float32) for n in (1, 0, 2, 3)]
    crops = np.array([[0, 0, 32, 32], [4, 8, 20, 16], [10, 2, 12, 30], [1, 1, 30, 31]])
    flips = np.array([False, True, True, False])
    batch = kind.move_batch(values, crops, flips, 32, 24)
    assert [len(b) for b in batch] == [1, 0, 2, 3]
    for got, v, c, f in zip(batch, values, crops, flips):
        assert np.array_equal(got, kind.move(v, c, f, 32, 24))
        if len(v) and f:        # the left eye lands where the right one would unflipped
            plain = kind.move(v, c, False, 32, 24)
            assert np.allclose(got[:, 1, 0], 24 - plain[:, 2, 0])
