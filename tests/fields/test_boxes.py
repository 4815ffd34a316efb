"""Boxes as a field: parsed from a labels file's column, stored per shard, moved with their
images through the crop and flip on both backends, as torchvision's detection targets."""
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
from fastdata.fields.infer import kind_named
from tests.fields.test_keypoints import MARKERS, NAMES, _centroid, _person_folder
from tests.loader.test_detection import eroded


def test_boxes_round_trip_and_bad_ones_are_refused_naming_where():
    kind = kind_named("boxes", ['[{"box": [0.1, 0.2, 0.5, 0.6], "label": "nose"}]',
                                '[{"box": [0, 0, 1, 1], "label": "eye"}]', "[]"])
    assert kind.classes == ["eye", "nose"]
    assert field_of("boxes", **kind.params()) == kind
    value = kind.parse([{"box": [0.1, 0.2, 0.5, 0.6], "label": "nose"}], "row 1")
    assert np.allclose(value, [[0.1, 0.2, 0.5, 0.6, 1]])
    column = kind.pack([value, kind.parse("[]", "row 2")])
    kind.check(column, 2, "shard-00000")
    assert [len(v) for v in kind.read(column, np.array([1, 0]))] == [0, 1]
    moved = kind.move(value, (0, 0, 10, 10), True, 10, 20)
    assert np.allclose(moved["boxes"], [[10.0, 4.0, 18.0, 12.0]])
    assert moved["labels"].tolist() == [2]
    plain = kind_named("boxes", ["[[0.1, 0.1, 0.2, 0.2]]"])
    assert plain.classes is None and "labels" not in plain.move(
        plain.parse("[[0.1, 0.1, 0.2, 0.2]]", ""), (0, 0, 8, 8), False, 8, 8)
    for cell, match in [('[{"box": [0.5, 0.5, 0.2, 0.9], "label": "eye"}]',
                         "outside the image .* or empty"),
                        ('[{"box": [0, 0, 1.5, 1], "label": "eye"}]', "outside the image"),
                        ('[{"box": [0, 0, 1], "label": "eye"}]', "is not a box"),
                        ('[{"box": [0, 0, 1, 1], "label": "ear"}]', "'ear' is not one of"),
                        ("[[0, 0, 1, 1]]", "a box without a label"),
                        ('{"box": 1}', "not a list of boxes"),
                        ("[[0, 0, 1", "not a JSON list of boxes")]:
        with pytest.raises(FieldError, match=f"row 3: .*{match}"):
            kind.parse(cell, "row 3")
    with pytest.raises(FieldError, match="labelled 'x' in a field without classes"):
        plain.parse([{"box": [0, 0, 1, 1], "label": "x"}], "row 4")
    tampered = column.values.copy().view(np.float32)
    tampered[4] = 7                     # a class index the field has not
    bad = type(column)(tampered.view(np.uint8), column.offsets)
    with pytest.raises(FieldError, match="class index"):
        kind.check(bad, 2, "shard-00000")
    with pytest.raises(FieldError, match="class index"):     # and as a batch reads it
        kind.read(bad, np.array([1, 0]))
    with pytest.raises(FieldError, match="not whole 20-byte records"):
        kind.read(type(column)(column.values, np.array([0, 7, 20])), np.array([0]))


@pytest.fixture(scope="module", params=["crop", "pad", "stretch"])
def boxes_set(tmp_path_factory, request):
    """The person pictures, a box around each painted marker labelled with its point's name,
    as fractions of each picture; cropped, padded or stretched onto the square."""
    tmp = tmp_path_factory.mktemp("boxes")
    src, ann = _person_folder(tmp / "src")
    coco = json.loads(open(ann).read())
    with open(tmp / "labels.jsonl", "w") as f:
        for im, a in zip(coco["images"], coco["annotations"]):
            w, h, p = im["width"], im["height"], a["keypoints"]
            boxes = [{"box": [(p[3 * k] - 2) / w, (p[3 * k + 1] - 2) / h,
                              (p[3 * k] + 3) / w, (p[3 * k + 1] + 3) / h], "label": name}
                     for k, name in enumerate(NAMES)]
            f.write(json.dumps({"path": im["file_name"], "objects": boxes}) + "\n")
    out = str(tmp / "set")
    convert(src, out, sizes=[64], labels=str(tmp / "labels.jsonl"),
            fields={"objects": "boxes"}, fit=request.param, progress=False)
    return out


@pytest.mark.parametrize("backend", ["torch", "dali"])
def test_boxes_land_on_their_markers_after_crop_and_flip(boxes_set, backend):
    if backend == "dali":
        pytest.importorskip("nvidia.dali", reason="needs DALI")
    names = fastdata.open(boxes_set).fields["objects"].classes
    loader = fastdata.Loader(boxes_set, batch_size=6, crop=48, device="cpu", mean=(0, 0, 0),
                             std=(1, 1, 1), scale=(0.5, 1.0), seed=4, backend=backend,
                             fields=["image", "objects"])
    on_marker = dropped = 0
    for epoch in range(4):
        loader.set_epoch(epoch)
        batch = next(iter(loader))
        for image, t in zip(batch["image"].permute(0, 2, 3, 1).numpy(), batch["objects"]):
            assert t["boxes"].dtype == torch.float32 and t["labels"].dtype == torch.int64
            dropped += 3 - len(t["boxes"])
            for (x0, y0, x1, y1), label in zip(t["boxes"].tolist(), t["labels"].tolist()):
                assert 0 <= x0 < x1 <= 48 and 0 <= y0 < y1 <= 48
                at = _centroid(image, MARKERS[names[label - 1]])
                if at is not None and x1 - x0 > 2 and y1 - y0 > 2:    # wholly inside the crop
                    assert abs(at[0] - (x0 + x1) / 2) <= 1 and abs(at[1] - (y0 + y1) / 2) <= 1
                    on_marker += 1
    # a padded picture's markers lie further in: no crop need cut one away
    assert on_marker >= 30 and (dropped >= 1 or fastdata.open(boxes_set).manifest["fit"] == "pad")


def test_info_describes_the_boxes_and_verify_checks_them(boxes_set, capsys):
    from fastdata.cli import main as cli
    from fastdata.shards.verify import verify

    assert cli(["info", boxes_set]) == 0
    assert "boxes (classes=3): 3-3 boxes, mean 3.0" in capsys.readouterr().out
    assert verify(boxes_set) == []


def test_a_batch_of_boxes_moves_as_each_image_would():
    kind = field_of("boxes", classes=["a", "b"])
    values = [kind.parse([{"box": [0.1, 0.1, 0.4, 0.5], "label": "b"},
                          {"box": [0.8, 0.8, 0.9, 0.95], "label": "a"}], ""),
              kind.parse([], ""), kind.parse([{"box": [0, 0, 1, 1], "label": "a"}], "")]
    crops = np.array([[0, 0, 16, 16], [2, 2, 8, 8], [4, 0, 8, 12]])
    flips = np.array([True, False, False])
    batch = kind.move_batch(values, crops, flips, 20, 10)
    for got, v, c, f in zip(batch, values, crops, flips):
        one = kind.move(v, c, f, 20, 10)
        assert torch.equal(got["boxes"], one["boxes"]) and torch.equal(got["labels"],
                                                                         one["labels"])
    assert len(batch[0]["boxes"]) == 1 and batch[0]["labels"].tolist() == [2]   # one cut away
    assert batch[2]["boxes"].tolist() == [[0.0, 0.0, 10.0, 10.0]]


def test_crowd_flags_and_keypoints_ride_with_their_boxes():
    """A box's crowd flag and points round-trip, are placed and moved with it (the points
    mirrored by the flip with their names swapped), and bad ones are refused."""
    kind = field_of("boxes", classes=["person"], crowd=True, keypoints={"names": NAMES})
    assert field_of("boxes", **kind.params()) == kind and kind.width == 15
    cell = [{"box": [0.25, 0.25, 0.75, 0.75], "label": "person", "iscrowd": 1,
             "keypoints": {"nose": [0.5, 0.5], "left_eye": [0.375, 0.375, 1]}},
            {"box": [0.0, 0.0, 0.2, 0.5], "label": "person"}]
    value = kind.parse(json.dumps(cell), "row 1")
    assert np.array_equal(kind.from_bytes(kind.to_bytes(value), ""), value)
    assert value[:, 5].tolist() == [1, 0] and not value[1, 6:].any()
    placed = kind.place(value, (2.0, 1.0, -0.5, 0.0))    # a crop of the middle half across
    assert placed[:, 5].tolist() == [1] and placed[0, 6:9].tolist() == [0.5, 0.5, 2]
    assert placed[0, 9:12].tolist() == [0.25, 0.375, 1]
    (t,) = kind.move_batch([value], [[0, 0, 8, 8]], [True], 8, 16)
    assert t["iscrowd"].tolist() == [1, 0] and t["labels"].tolist() == [1, 1]
    points = t["keypoints"]
    assert points.shape == (2, 3, 3) and points[0, 0].tolist() == [8.0, 8.0, 2.0]
    assert points[0, 2].tolist() == [10.0, 6.0, 1.0] and points[0, 1, 2] == 0  # swapped
    (kept,) = kind.move_batch([value], [[0, 0, 4, 4]], [False], 8, 8, min_visible=0.5)
    assert kept["iscrowd"].tolist() == [0] and kept["keypoints"].shape == (1, 3, 3)
    with pytest.raises(FieldError, match="crowd flag is not 0 or 1"):
        kind.parse([{"box": [0, 0, 1, 1], "label": "person", "iscrowd": 2}], "row 2")
    with pytest.raises(FieldError, match="with keypoints in a field without them"):
        field_of("boxes").parse([{"box": [0, 0, 1, 1], "keypoints": []}], "row 3")
    with pytest.raises(ValueError, match="keypoints=.* is not valid"):
        field_of("boxes", keypoints={"nams": NAMES})


def test_a_tampered_box_in_a_shard_is_refused_naming_the_shard_and_field(boxes_set, tmp_path):
    import shutil

    import h5py

    from fastdata.shards.verify import verify

    copy = str(tmp_path / "set")
    shutil.copytree(boxes_set, copy)
    shard = os.path.join(copy, fastdata.open(copy).manifest["shards"][0]["file"])
    with h5py.File(shard, "r+") as f:
        values = f["fields/objects/values"]
        first = np.frombuffer(values[:20].tobytes(), np.float32).copy()
        first[0] = 2.0                  # x0 past the square's edge
        values[:20] = np.frombuffer(first.tobytes(), np.uint8)
    with pytest.raises(OSError, match=r"shard-00000.h5: field objects: a value read: a box "
                                      r"outside the image"):
        fastdata.open(copy).field_values("objects", [0])
    assert any("field objects" in p.message for p in verify(copy))


def _inside(x: np.ndarray, y: np.ndarray, px: float, py: float) -> bool:
    """Even-odd: whether the point is inside the outline (a ray cast to the right)."""
    inside = False
    for k in range(len(x)):
        x0, y0, x1, y1 = x[k], y[k], x[k - 1], y[k - 1]
        if (y0 <= py < y1 or y1 <= py < y0) and px > x0 + (py - y0) * (x1 - x0) / (y1 - y0):
            inside = not inside
    return inside


def test_an_outline_is_drawn_where_pixel_centres_are_inside_it():
    from fastdata.fields.boxes import draw

    rng = np.random.default_rng(3)
    for _ in range(20):
        x, y = rng.uniform(-4, 20, 7), rng.uniform(-4, 20, 7)     # crossing, partly outside
        want = [[_inside(x, y, c + 0.5, r + 0.5) for c in range(16)] for r in range(16)]
        mask = np.zeros((16, 16), np.uint8)
        draw(mask, x, y)
        assert np.array_equal(mask, np.array(want, np.uint8))


def test_boxes_with_masks_round_trip_and_bad_outlines_are_refused():
    cells = ['[{"box": [0.1, 0.1, 0.5, 0.5], "label": "a", "polygons": '
             '[[0.1, 0.1, 0.5, 0.1, 0.5, 0.5], [0.1, 0.3, 0.2, 0.3, 0.2, 0.5]]}, '
             '{"box": [0.6, 0.6, 0.9, 0.9], "label": "b", "polygons": []}]', "[]"]
    kind = kind_named("boxes", cells)
    assert kind.params() == {"classes": ["a", "b"], "masks": True}
    assert field_of("boxes", **kind.params()) == kind
    values = [kind.parse(c, "row 1") for c in cells]
    column = kind.pack(values)
    kind.check(column, 2, "shard-00000")
    first, empty = kind.read(column, np.array([0, 1]))
    assert np.allclose(first["boxes"][:, 4], [0, 1]) and len(empty["boxes"]) == 0
    assert [len(p) for p in first["polygons"]] == [2, 0]
    assert np.allclose(first["polygons"][0][1], [[0.1, 0.3], [0.2, 0.3], [0.2, 0.5]])
    moved = kind.move(values[0], (0, 0, 10, 10), True, 10, 10)
    assert moved["masks"].shape == (2, 10, 10) and moved["masks"].dtype == torch.uint8
    assert moved["masks"][0, 1:5, 5:9].any() and not moved["masks"][0, :, :5].any()
    assert not moved["masks"][1].any()
    for cell, match in [('[{"box": [0, 0, 1, 1], "label": "a"}]', "a box without its polygons"),
                        ('[{"box": [0, 0, 1, 1], "label": "a", "polygons": [[0, 0, 1, 1]]}]',
                         "not an outline"),
                        ('[{"box": [0, 0, 1, 1], "label": "a", "polygons": [[0, 0, 1, 0, 2, '
                         '1]]}]', "outline's point outside the image")]:
        with pytest.raises(FieldError, match=f"row 3: .*{match}"):
            kind.parse(cell, "row 3")
    with pytest.raises(FieldError, match="a box with polygons in a field without masks"):
        field_of("boxes").parse('[{"box": [0, 0, 1, 1], "polygons": []}]', "row 4")
    data = column.values[column.offsets[0]:column.offsets[1]].tobytes()
    cut = data[:-8]
    with pytest.raises(FieldError, match="are not 2 boxes with 2 outlines of 6 points"):
        kind.from_bytes(cut, "value 0")
    counts = bytearray(data)
    counts[12 + 40:12 + 44] = np.uint32(3).tobytes()     # the first box claims 3 outlines
    with pytest.raises(FieldError, match="outlines' counts do not add up"):
        kind.from_bytes(bytes(counts), "value 0")


@pytest.fixture(scope="module", params=["crop", "pad", "stretch"])
def masked_set(tmp_path_factory, request):
    """The painted pictures of the class maps' test, each rectangle a box with its outline;
    cropped, padded or stretched onto the square."""
    from tests.fields.test_classmap import COLOURS, _painted

    tmp = tmp_path_factory.mktemp("masked")
    src = _painted(tmp / "src")
    names = {1: "red", 2: "blue"}
    with open(os.path.join(src, "labels.jsonl"), "w") as f:
        for i in range(6):
            m = np.asarray(Image.open(os.path.join(src, "maps", f"{i}.png")))
            objects = []
            for cls in COLOURS:
                ys, xs = np.nonzero(m == cls)
                x0, x1 = xs.min() / m.shape[1], (xs.max() + 1) / m.shape[1]
                y0, y1 = ys.min() / m.shape[0], (ys.max() + 1) / m.shape[0]
                objects.append({"box": [x0, y0, x1, y1], "label": names[cls],
                                "polygons": [[x0, y0, x1, y0, x1, y1, x0, y1]]})
            f.write(json.dumps({"path": f"img/{i}.png", "objects": objects}) + "\n")
    out = str(tmp / "set")
    convert(src, out, sizes=[64], labels=os.path.join(src, "labels.jsonl"),
            fields={"objects": "boxes"}, fit=request.param, progress=False)
    return out


@pytest.mark.parametrize("backend", ["torch", "dali"])
def test_masks_cover_their_painted_pixels_after_crop_and_flip(masked_set, backend):
    from tests.fields.test_classmap import COLOURS

    if backend == "dali":
        pytest.importorskip("nvidia.dali", reason="needs DALI")
    kind = fastdata.open(masked_set).fields["objects"]
    assert kind.masks and kind.classes == ["blue", "red"]
    colour = {1: COLOURS[2], 2: COLOURS[1]}         # label (class index + 1) -> its paint
    loader = fastdata.Loader(masked_set, batch_size=6, crop=48, device="cpu", mean=(0, 0, 0),
                             std=(1, 1, 1), scale=(0.5, 1.0), seed=5, backend=backend,
                             fields=["image", "objects"])
    checked = 0
    for epoch in range(3):
        loader.set_epoch(epoch)
        batch = next(iter(loader))
        for image, t in zip(batch["image"].permute(0, 2, 3, 1).numpy(), batch["objects"]):
            assert t["masks"].shape == (len(t["boxes"]), 48, 48)
            white = np.abs(image - 1).max(-1) < 0.2
            for mask, label in zip(t["masks"].numpy().astype(bool), t["labels"].tolist()):
                painted = np.abs(image - np.asarray(colour[label]) / 255).max(-1) < 0.2
                if painted.sum() >= 50:
                    # its paint within a pixel of it (the resize blurs an edge); its inside
                    # on no white (the other rectangle may be painted over a part of it)
                    assert (painted & ~eroded(~mask)).sum() >= 0.98 * painted.sum()
                    assert (eroded(mask) & white).sum() <= 0.02 * mask.sum()
                    checked += 1
    assert checked >= 20


def test_boxes_and_outlines_are_placed_as_the_fit_placed_their_picture():
    kind = field_of("boxes", classes=["a"], masks=True)
    value = kind.parse([{"box": [0.0, 0.2, 0.1, 0.6], "label": "a", "polygons": [[0, .2, .1, .2,
                                                                                  .1, .6]]},
                        {"box": [0.25, 0.0, 1.0, 1.0], "label": "a", "polygons": []}], "")
    # a 4:3 picture cropped: the square is its middle 3/4 of x
    placed = kind.place(value, (4 / 3, 1.0, -1 / 6, 0.0))
    assert len(placed["boxes"]) == 1 and len(placed["polygons"]) == 1     # the first cut away
    assert np.allclose(placed["boxes"], [[1 / 6, 0, 1, 1, 0]])
    # padded: the picture is the square's middle 3/4 of y
    placed = kind.place(value, (1.0, 0.75, 0.0, 0.125))
    assert np.allclose(placed["boxes"][0, :4], [0, 0.275, 0.1, 0.575])
    assert np.allclose(placed["polygons"][0][0], [[0, .275], [.1, .275], [.1, .575]])
    assert len(kind.from_bytes(kind.to_bytes(placed), "")["boxes"]) == 2
    plain = field_of("boxes")
    assert plain.place(np.array([[0.0, 0.0, 0.1, 0.1, -1]], np.float32),
                       (4 / 3, 1.0, -1 / 6, 0.0)).shape == (0, 5)


def test_the_c_kernel_draws_what_numpy_draws(monkeypatch):
    from fastdata.fields import boxes
    from fastdata.kernels import cpu

    if not cpu.available():
        pytest.skip("fastdata.kernels._native not built")
    rng = np.random.default_rng(11)
    polygons = [[rng.uniform(-0.3, 1.3, (int(rng.integers(3, 30)), 2)).astype(np.float32)
                 for _ in range(int(rng.integers(0, 3)))] for _ in range(12)]
    crops = [(0, 0, 40, 40), (5, 9, 20, 13), (30, 2, 7, 38)]
    with pytest.raises(ValueError, match="not finite"):
        cpu.fill_outlines(np.array([[0, 0], [np.nan, 1], [1, 1]]), np.array([0, 3]),
                          np.array([0]), np.zeros((1, 4, 4), np.uint8))
    with pytest.raises(ValueError, match="do not fit together"):
        cpu.fill_outlines(np.zeros((3, 2)), np.array([0, 3]), np.array([1]),
                          np.zeros((1, 4, 4), np.uint8))
    def drawn(c, f):
        return boxes._masks(polygons, np.tile(c, (12, 1)), np.full(12, f), 40, 32)

    native = [drawn(c, f) for c in crops for f in (False, True)]
    monkeypatch.setattr(cpu, "available", lambda: False)
    for got, (c, f) in zip(native, [(c, f) for c in crops for f in (False, True)]):
        assert np.array_equal(got, drawn(c, f))
    assert sum(int(m.sum()) for m in native) > 1000
