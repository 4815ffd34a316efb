"""Boxes as a field: parsed from a labels file's column, stored per shard, moved with their
images through the crop and flip on both backends, as torchvision's detection targets."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

import fastdata
from fastdata.converters.convert import convert
from fastdata.fields import FieldError, field_of
from fastdata.fields.infer import kind_named
from tests.fields.test_keypoints import MARKERS, NAMES, _centroid, _person_folder


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


@pytest.fixture(scope="module")
def boxes_set(tmp_path_factory):
    """The person pictures, a box around each painted marker labelled with its point's name,
    as fractions of each picture; stretched onto the square."""
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
            fields={"objects": "boxes"}, fit="stretch", progress=False)
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
    assert on_marker >= 30 and dropped >= 1


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
