"""Detection sets from COCO annotations: crowd regions decoded as pycocotools decodes them and
drawn again exactly, the converter's rules for what it keeps, EXIF orientation, a version 3
set's annotations file and its checks, and hostile annotations refused or skipped with a
reason."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

import fastdata
from fastdata.cli import main as cli
from fastdata.cli.info import info_dict
from fastdata.converters.coco import MAX_BOXES, MAX_POINTS, rectangles, rle_mask
from fastdata.converters.convert import convert
from fastdata.fields.boxes import _masks
from fastdata.format import ShardFormatError
from fastdata.shards.verify import verify
from tests.helpers import (
    PEAK_KIB,
    colour_regions,
    detection_folder,
    earlier_detection_set,
    stored_targets,
    write_annotations,
)

mask_api = pytest.importorskip("pycocotools.mask")
# pycocotools' decode passes copy=False to NumPy 2's __array__: a warning per call, not ours
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


def _rle_of(m: np.ndarray) -> tuple[str, list[int]]:
    """A mask's COCO RLE, compressed (pycocotools') and as counts."""
    flat = m.T.ravel()
    edges = np.flatnonzero(np.diff(flat)) + 1
    counts = np.diff(np.concatenate([[0], edges, [flat.size]])).tolist()
    return mask_api.encode(np.asfortranarray(m))["counts"].decode(), \
        [0] + counts if flat[0] else counts


def test_rle_decodes_as_pycocotools_and_its_rectangles_draw_it_again():
    rng = np.random.default_rng(1)
    for it in range(50):
        h, w = (int(v) for v in rng.integers(1, 70, 2))
        m = (rng.random((h, w)) < rng.uniform(0.05, 0.95)).astype(np.uint8)
        if it % 5 == 0:                 # blobs: runs that neighbouring columns share
            m = np.zeros((h, w), np.uint8)
            m[h // 4:h // 2 + 1, w // 5:w - 1] = 1
        text, counts = _rle_of(m)
        assert np.array_equal(rle_mask({"counts": text, "size": [h, w]}, h, w), m)
        want = mask_api.decode(mask_api.frPyObjects({"counts": counts, "size": [h, w]}, h, w))
        assert np.array_equal(rle_mask({"counts": counts, "size": [h, w]}, h, w), want)
        r = rectangles(m)
        side = max(h, w)
        outlines = list((r[:, [0, 1, 2, 1, 2, 3, 0, 3]].reshape(-1, 4, 2) / side).astype(
            np.float32))
        drawn = _masks([outlines], np.array([[0, 0, side, side]]), np.zeros(1, bool), side,
                       side)[0]
        assert np.array_equal(drawn[:h, :w], m) and not drawn[h:].any() and \
            not drawn[:, w:].any(), it
        assert len(r) <= int(m.sum())


@pytest.mark.parametrize("container", ["hdf5", "lmdb"])
def test_convert_keeps_what_the_file_and_folder_share(tmp_path, container):
    src, ann = detection_folder(tmp_path / "src", n=6)
    d = json.load(open(ann))
    d["images"].append({"id": 99, "file_name": "img/gone.png", "width": 10, "height": 10})
    d["annotations"] += [
        {"id": 500, "image_id": 12345, "category_id": 3, "bbox": [1, 1, 5, 5]},
        {"id": 501, "image_id": 1, "category_id": 999, "bbox": [1, 1, 5, 5]},
        {"id": 502, "image_id": 1, "category_id": 3, "bbox": [1, 1, -5, 5]},
        {"id": 503, "image_id": 1, "category_id": 3, "bbox": [1, float("nan"), 5, 5]},
        {"id": 504, "image_id": 1, "category_id": 3, "bbox": [1, 1, 5, 5],
         "segmentation": {"counts": "not an rle", "size": [3, 3]}},
        {"id": 505, "image_id": 2, "category_id": 7, "bbox": [-500, -500, 10, 10],
         "segmentation": [[-500, -500, -490, -500, -490, -490]]},
    ]
    with open(ann, "w") as f:
        json.dump(d, f)         # NaN written as JSON's NaN, which Python reads
    shutil.copy(os.path.join(src, "img", "0.png"), os.path.join(src, "img", "extra.png"))
    out = str(tmp_path / "out")
    m = convert(src, out, container=container, sizes=[32, 64], coco=ann, progress=False)
    assert m["version"] == 4 and m["label_kind"] == "detection" and m["classes"] == ["cat", "dog"]
    assert m["fields"] == [{"name": "label", "kind": "boxes", "params": {
        "classes": ["cat", "dog"], "masks": True, "crowd": True}}] and "annotations" not in m
    reasons = {s["path"]: s["reason"] for s in m["skipped"]}
    assert "not in the annotations file" in reasons["img/extra.png"]
    assert "not an image in the source folder" in reasons["img/gone.png"]
    assert "not an image of the file" in reasons["annotation 500"]
    assert "not a category" in reasons["annotation 501"]
    assert "bbox" in reasons["annotation 502"] and "bbox" in reasons["annotation 503"]
    assert "RLE" in reasons["annotation 504"]
    assert "near the image" in reasons["annotation 505"]
    ds = fastdata.open(out)
    assert len(ds) == 6 and ds.annotations is None and ds.label_field.masks
    assert info_dict(out)["boxes"] == len(json.load(open(ann))["annotations"]) - 6
    image, label = ds[0]            # its stored boxes: records of 6 floats, and their outlines
    assert image.shape == (64, 64, 3) and label["boxes"].shape[1] == 6
    assert len(label["polygons"]) == len(label["boxes"]) > 0
    assert verify(out) == []
    again = convert(src, out, container=container, sizes=[32, 64], coco=ann, progress=False,
                    resume=True)
    assert again["shards"] == m["shards"]        # finished: recognised


def test_boxes_and_masks_land_on_their_pixels_in_the_stored_squares(tmp_path):
    src, ann = detection_folder(tmp_path / "src", n=6)
    out = str(tmp_path / "out")
    convert(src, out, sizes=[64], coco=ann, progress=False)
    ds = fastdata.open(out)
    images = ds.read_batch(np.arange(len(ds)))
    regions = colour_regions(images)
    for i, t in enumerate(stored_targets(ds, 64)):
        for j, (box, mask) in enumerate(zip(t["boxes"].numpy(), t["masks"].numpy())):
            colour = j      # the fixture's k-th box has the k-th colour
            ys, xs = np.nonzero(regions[i] == colour)
            assert np.abs(box - (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)).max() <= 0.75
            assert ((mask == 1) == (regions[i] == colour)).mean() > 0.98


@pytest.mark.parametrize("orientation", [6, 3])
def test_annotations_of_a_rotated_photo_follow_its_pixels(tmp_path, orientation):
    """Annotated as stored (6), the boxes turn with the pixels; where the sizes cannot tell
    the frame (3), the annotations are taken as upright."""
    src, ann = detection_folder(tmp_path / "src", n=4, fmt="jpg", orientation=orientation)
    out = str(tmp_path / "out")
    convert(src, out, sizes=[64], fit="stretch", coco=ann, progress=False)
    ds = fastdata.open(out)
    regions = colour_regions(ds.read_batch(np.arange(len(ds))))
    for i, t in enumerate(stored_targets(ds, 64)):
        for j, box in enumerate(t["boxes"].numpy()):
            ys, xs = np.nonzero(regions[i] == j)
            assert np.abs(box - (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)).max() <= 1.5


def test_cli_convert_info_and_a_damaged_annotations_file(tmp_path, capsys):
    src, ann = detection_folder(tmp_path / "src", n=3)
    out = str(tmp_path / "out")
    assert cli(["-q", "convert", src, out, "--coco", ann, "--size", "32"]) == 0
    assert cli(["info", out]) == 0
    shown = capsys.readouterr().out
    boxes = len(json.load(open(ann))["annotations"])
    assert "detection" in shown and f"{boxes} boxes with instance masks" in shown
    out = earlier_detection_set(src, str(tmp_path / "v3"), ann, sizes=[32])
    path = os.path.join(out, "annotations.bin")
    data = bytearray(open(path, "rb").read())
    data[-3] ^= 0xFF
    with open(path, "wb") as f:
        f.write(bytes(data))
    problems = verify(out)
    assert [p.shard for p in problems] == ["annotations.bin"] and "checksum" in problems[0].message
    with pytest.raises(ShardFormatError, match="checksum"):
        _ = fastdata.open(out).annotations


@pytest.mark.parametrize("bad, why", [
    ({"boxes": [[0.5, 0.1, 0.2, 0.9]]}, "boxes outside the square or empty"),
    ({"boxes": [[0.1, 0.1, 1.5, 0.9]]}, "boxes outside the square or empty"),
    ({"classes": [7]}, "box classes"),
    ({"offsets": [0, 99]}, "offsets"),
    ({"runs": [np.array([10, 5], np.uint32)]}, "do not cover"),
])
def test_an_inconsistent_annotations_file_is_refused(tmp_path, bad, why):
    """Checksummed as the manifest says, yet wrong: refused, naming what is wrong."""
    src, ann = detection_folder(tmp_path / "src", n=1)
    out = earlier_detection_set(src, str(tmp_path / "out"), ann, sizes=[8])
    m = json.load(open(os.path.join(out, "manifest.json")))
    a = fastdata.open(out).annotations
    k = len(a.boxes)
    fields = {"offsets": [0, k], "boxes": a.boxes.copy(), "classes": a.classes.copy(),
              "iscrowd": a.iscrowd.copy(), "runs": [np.array([0, 64], np.uint32)] * k}
    if "boxes" in bad:
        fields["boxes"][0] = bad["boxes"][0]
    if "classes" in bad:
        fields["classes"][0] = bad["classes"][0]
    if "offsets" in bad:
        fields["offsets"] = bad["offsets"]
    if "runs" in bad:
        fields["runs"] = bad["runs"] * k
    entry = write_annotations(os.path.join(out, "annotations.bin"), fields["offsets"],
                              fields["boxes"], fields["classes"], fields["iscrowd"],
                              {8: fields["runs"]})
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump({**m, "annotations": entry}, f)
    with pytest.raises(ShardFormatError, match=why):
        _ = fastdata.open(out).annotations


def _coco_with(path, images, annotations):
    with open(path, "w") as f:
        json.dump({"images": images, "annotations": annotations,
                   "categories": [{"id": 1, "name": "thing"}]}, f)
    return str(path)


def test_hostile_annotations_are_skipped_or_refused(tmp_path):
    src, ann = detection_folder(tmp_path / "src", n=2)
    d = json.load(open(ann))
    box = {"image_id": 1, "category_id": 1, "bbox": [1, 1, 5, 5]}
    many = [{**box, "id": k} for k in range(MAX_BOXES + 1)]
    zigzag = [float(v) for _ in range((MAX_POINTS + 2) // 2) for v in (0, 0, 80, 80)]
    Image.new("RGB", (400, 400), "white").save(os.path.join(src, "img", "big.png"))
    big = {"id": 3, "file_name": "img/big.png", "width": 400, "height": 400}
    checkerboard = {"counts": [0] + [1] * 160000, "size": [400, 400]}   # 80,000 runs
    path = _coco_with(tmp_path / "a.json", d["images"] + [big], many + [
        {**box, "image_id": 2, "id": -1, "segmentation": [zigzag]},
        {**box, "image_id": 2, "id": -2, "segmentation": [[0, 0, 80, 80] * 20000 + [0, 0]]},
        {**box, "image_id": 3, "id": -3, "iscrowd": 1, "segmentation": checkerboard},
        {**box, "image_id": 3, "id": -4, "iscrowd": 1, "segmentation": {
            "counts": [400 * 100, 400 * 200, 400 * 100], "size": [400, 400]}}])
    m = convert(src, str(tmp_path / "out"), sizes=[16], coco=path, progress=False)
    reasons = {s["path"]: s["reason"] for s in m["skipped"]}
    assert f"more than {MAX_BOXES}" in reasons["img/0.png"]
    assert f"more than {MAX_POINTS} points" in reasons["annotation -1"]
    assert "outlines of more than" in reasons["annotation -2"]
    assert f"RLE of more than {MAX_POINTS // 4} runs" in reasons["annotation -3"]
    assert "annotation -4" not in reasons and m["num_samples"] == 2     # one rectangle
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as f:         # 2 GiB, sparse: refused before a byte is read
        f.truncate(2 << 30)
    with pytest.raises(ValueError, match="refused before it is read"):
        convert(src, str(tmp_path / "o2"), sizes=[16], coco=str(huge), progress=False)
    for text, match in (("[1, 2]", "not COCO's"), ("{", "not readable JSON"),
                        ('{"images": [], "annotations": [], "categories": [{"id": 1, '
                         '"name": "a"}, {"id": 2, "name": "a"}]}', "distinct")):
        p = tmp_path / "bad.json"
        p.write_text(text)
        with pytest.raises(ValueError, match=match):
            convert(src, str(tmp_path / "o3"), sizes=[16], coco=str(p), progress=False)
    os.mkfifo(tmp_path / "fifo.json")
    with pytest.raises(ValueError, match="not a regular file"):
        convert(src, str(tmp_path / "o4"), sizes=[16], coco=str(tmp_path / "fifo.json"),
                progress=False)


def test_a_ten_million_point_polygon_is_skipped_in_bounded_memory(tmp_path):
    """10^7 points (a 40 MB file): skipped, the conversion's peak memory under 640 MiB (the
    parsed file is held while it is checked, then dropped)."""
    src, ann = detection_folder(tmp_path / "src", n=1)
    path = tmp_path / "big.json"
    with open(path, "w") as f:
        f.write('{"images": ' + json.dumps(json.load(open(ann))["images"]) +
                ', "categories": [{"id": 1, "name": "thing"}], "annotations": [{"id": 1, '
                '"image_id": 1, "category_id": 1, "bbox": [1, 1, 5, 5], "segmentation": [[' +
                ",".join(["1,2"] * 10_000_000) + "]]}]}")
    script = PEAK_KIB + (f"import json\nfrom fastdata.converters.convert import convert\n"
                         f"m = convert({src!r}, {str(tmp_path / 'out')!r}, sizes=[16], "
                         f"coco={str(path)!r}, progress=False)\n"
                         f"print(json.dumps([m['skipped'], peak_kib()]))")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=300, check=True)
    skipped, peak_kib = json.loads(r.stdout.splitlines()[-1])
    assert any("more than" in s["reason"] for s in skipped if s["path"] == "annotation 1")
    assert peak_kib < 640 * 2 ** 10


def _with_a_crowd_region(src: str, ann: str) -> None:
    """The first image's first box also annotated as a crowd region: its painted pixels as
    compressed RLE."""
    d = json.load(open(ann))
    a = d["annotations"][0]
    im = d["images"][0]
    x0, y0, bw, bh = a["bbox"]
    m = np.zeros((im["height"], im["width"]), np.uint8)
    m[y0:y0 + bh, x0:x0 + bw] = 1
    assert Image.open(os.path.join(src, im["file_name"])).size == (im["width"], im["height"])
    d["annotations"].append({**a, "id": 999, "iscrowd": 1, "segmentation": {
        "counts": _rle_of(m)[0], "size": [im["height"], im["width"]]}})
    with open(ann, "w") as f:
        json.dump(d, f)


def test_a_crowd_region_keeps_its_flag_and_its_pixels(tmp_path):
    src, ann = detection_folder(tmp_path / "src", n=2)
    _with_a_crowd_region(src, ann)
    out = str(tmp_path / "out")
    convert(src, out, sizes=[64], fit="stretch", coco=ann, progress=False)
    t = stored_targets(fastdata.open(out), 64)[0]
    assert t["iscrowd"].tolist()[-1] == 1 and not t["iscrowd"][:-1].any()
    polygon, crowd = t["masks"][0].numpy(), t["masks"][-1].numpy()
    assert torch.equal(t["boxes"][0], t["boxes"][-1])
    assert crowd.sum() > 0 and (polygon == crowd).mean() > 0.99


@pytest.mark.parametrize("fit", ["crop", "pad"])
def test_a_version_3_set_loads_as_todays(tmp_path, fit):
    """A version 3 set (boxes, crowd flags and each size's masks in ``annotations.bin``) gives
    the targets today's set gives through the same crops and flips: its masks resampled from
    the stored squares where today's are drawn at the output size, so theirs within a rim."""
    src, ann = detection_folder(tmp_path / "src", n=6)
    _with_a_crowd_region(src, ann)
    old = earlier_detection_set(src, str(tmp_path / "v3"), ann, sizes=[32, 64], fit=fit)
    assert fastdata.open(old).annotations.has_masks and verify(old) == []
    kw = dict(batch_size=3, crop=48, device="cpu", num_workers=0, seed=3, scale=(0.3, 1.0))
    batches = 0
    for (_, a), (_, b) in zip(fastdata.Loader(old, **kw), fastdata.Loader(old + "-now", **kw),
                              strict=True):
        for x, y in zip(a, b, strict=True):
            assert list(x) == list(y) == ["boxes", "labels", "iscrowd", "masks"]
            for k in ("labels", "iscrowd"):
                assert torch.equal(x[k], y[k])
            assert torch.allclose(x["boxes"], y["boxes"], atol=1e-4)
            assert (x["masks"] == y["masks"]).float().mean() > 0.97
        batches += 1
    assert batches == 2
