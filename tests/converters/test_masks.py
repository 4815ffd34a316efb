"""Segmentation sets from folders of PNG class maps: what the converter keeps and skips, the
maps (the field ``label``) on their pixels through orientation and fit, a tampered map
refused, and the earlier version's class maps file still read, and checked."""
from __future__ import annotations

import json
import os
import struct
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

import fastdata
from fastdata.cli import main as cli
from fastdata.cli.info import info_dict
from fastdata.converters.convert import convert
from fastdata.fields.classmap import IGNORE
from fastdata.format import ShardFormatError
from fastdata.shards.verify import verify
from tests.helpers import (
    colour_regions,
    detection_folder,
    earlier_segmentation_set,
    stored_maps,
    write_class_maps,
)


@pytest.mark.parametrize("container", ["hdf5", "lmdb"])
@pytest.mark.parametrize("fit", ["crop", "pad", "stretch"])
def test_class_maps_land_on_their_pixels(tmp_path, container, fit):
    src, _ = detection_folder(tmp_path / "src", n=5, maps=True)
    out = str(tmp_path / "out")
    m = convert(src, out, container=container, sizes=[32, 64], fit=fit,
                masks=f"{src}-maps", progress=False)
    assert m["version"] == 4 and m["label_kind"] == "segmentation" and "annotations" not in m
    assert m["classes"] == ["0", "1", "2", "3"][:len(m["classes"])] and len(m["classes"]) >= 2
    assert m["fields"] == [{"name": "label", "kind": "classmap",
                            "params": {"classes": m["classes"]}}]
    ds = fastdata.open(out)
    assert ds.fields == {} and ds.annotations is None
    maps = stored_maps(ds, 64)
    regions = colour_regions(ds.read_batch(np.arange(len(ds))))
    for i in range(len(ds)):
        got = maps[i]
        on_picture = got != IGNORE
        assert ((got[on_picture] - 1) == regions[i][on_picture]).mean() > 0.97
        if fit == "pad":                # no picture is square: its borders are no class
            assert (~on_picture).any()
    assert verify(out) == []


def test_rotated_photo_and_its_map(tmp_path):
    src, _ = detection_folder(tmp_path / "src", n=3, fmt="jpg", orientation=6, maps=True)
    out = str(tmp_path / "out")
    convert(src, out, sizes=[64], fit="stretch", masks=f"{src}-maps", progress=False)
    ds = fastdata.open(out)
    maps, regions = stored_maps(ds, 64), colour_regions(ds.read_batch(np.arange(len(ds))))
    for i in range(len(ds)):
        assert ((maps[i] - 1) == regions[i]).mean() > 0.95


def test_what_has_no_usable_map_is_skipped(tmp_path, capsys):
    src, _ = detection_folder(tmp_path / "src", n=6, maps=True)
    maps = f"{src}-maps"
    os.remove(os.path.join(maps, "img", "0.png"))
    Image.new("RGB", (10, 10)).save(os.path.join(maps, "img", "1.png"))     # not one value
    Image.new("L", (7, 7)).save(os.path.join(maps, "img", "2.png"))         # not its size
    with open(os.path.join(maps, "img", "3.png"), "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n not really")
    os.remove(os.path.join(maps, "img", "4.png"))
    os.mkfifo(os.path.join(maps, "img", "4.png"))
    out = str(tmp_path / "out")
    m = convert(src, out, sizes=[16], masks=maps, progress=False)
    reasons = {s["path"]: s["reason"] for s in m["skipped"]}
    assert "no class map" in reasons["img/0.png"] and "no class map" in reasons["img/4.png"]
    assert "mode RGB" in reasons["img/1.png"]
    assert "size" in reasons["img/2.png"] and "readable PNG" in reasons["img/3.png"]
    assert m["num_samples"] == 4        # the maps that fail are kept as no class at all
    ds = fastdata.open(out)
    assert (stored_maps(ds, 16)[0] == IGNORE).all() and (ds[0][1] == IGNORE).all()
    assert cli(["info", out]) == 0
    assert "segmentation" in capsys.readouterr().out
    with pytest.raises(ValueError, match="exclude each other"):
        convert(src, str(tmp_path / "o2"), sizes=[16], masks=maps, coco=maps, progress=False)


def _png_bomb(path, side: int) -> None:
    """A real grey PNG of ``side`` x ``side`` zeros, written row block by row block (never
    whole in memory): a few hundred kB that decode to ``side ** 2`` bytes."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))
    z, rows = zlib.compressobj(1), bytes(side + 1) * 64       # filter byte 0, then the row
    idat = b"".join(z.compress(rows) for _ in range(side // 64)) + z.compress(
        bytes(side + 1) * (side % 64)) + z.flush()
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 0,
                                                                     0, 0, 0))
                + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def test_a_decompression_bomb_class_map_is_a_note_naming_it(tmp_path):
    """A class map claiming more pixels than Pillow decodes (2.1 x its limit) is refused as
    its map is read: the image is kept, of no class, the map named."""
    src, _ = detection_folder(tmp_path / "src", n=3, maps=True)
    maps = f"{src}-maps"
    side = int((2.1 * Image.MAX_IMAGE_PIXELS) ** 0.5)
    _png_bomb(os.path.join(maps, "img", "1.png"), side)
    assert os.path.getsize(os.path.join(maps, "img", "1.png")) < 4 << 20
    m = convert(src, str(tmp_path / "out"), sizes=[16], masks=maps, progress=False)
    reasons = {s["path"]: s["reason"] for s in m["skipped"]}
    assert m["num_samples"] == 3 and "decompression bomb" in reasons["img/1.png"]
    assert os.path.join(maps, "img", "1.png") in reasons["img/1.png"]
    assert (stored_maps(fastdata.open(str(tmp_path / "out")), 16)[1] == IGNORE).all()


def test_a_map_of_a_class_the_set_does_not_have_is_refused(tmp_path):
    """A shard whose stored map holds a value past the set's classes (not 255): ``verify``
    names the shard's field, and a read refuses it, not a loss far from here."""
    src, _ = detection_folder(tmp_path / "src", n=3, maps=True)
    out = str(tmp_path / "out")
    m = convert(src, out, sizes=[16], masks=f"{src}-maps", container="lmdb", progress=False)
    m["classes"] = m["fields"][0]["params"]["classes"] = ["0"]  # the maps hold 1 and up
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(m, f)
    problems = verify(out)
    assert problems and "neither a class below 1" in str(problems[0])
    with pytest.raises(OSError, match="neither a class below 1"):
        stored_maps(fastdata.open(out), 16)


def test_an_earlier_versions_set_loads_as_today(tmp_path):
    """A version 3 set (its maps in ``annotations.bin``) gives the maps today's set gives,
    in a loader too, and ``info`` counts its pixels as today's."""
    src, _ = detection_folder(tmp_path / "src", n=5, maps=True)
    old = earlier_segmentation_set(src, str(tmp_path / "v3"), sizes=[32, 64], fit="pad")
    now = fastdata.open(old + "-now")
    ds = fastdata.open(old)
    assert ds.manifest["version"] == 3 and ds.label_field is None and verify(old) == []
    for size in (32, 64):
        assert np.array_equal(stored_maps(ds, size), stored_maps(now, size))
    kw = dict(batch_size=5, size=64, crop=None, train=False, shuffle=False, device="cpu")
    (x_old, y_old), = fastdata.Loader(old, **kw)
    (x_now, y_now), = fastdata.Loader(old + "-now", **kw)
    assert torch.equal(x_old, x_now) and torch.equal(y_old, y_now)
    assert y_now.dtype == torch.int64 and y_now.shape == (5, 64, 64)
    assert info_dict(old)["classes"] == info_dict(old + "-now")["classes"]


def test_an_inconsistent_class_maps_file_is_refused(tmp_path):
    src, _ = detection_folder(tmp_path / "src", n=2, maps=True)
    out = earlier_segmentation_set(src, str(tmp_path / "out"), sizes=[8])
    with open(os.path.join(out, "manifest.json")) as f:
        m = json.load(f)
    for maps, why in (([(np.array([64], np.uint32), np.array([9], np.uint8))] * 2,
                       "neither a class"),
                      ([(np.array([60], np.uint32), np.array([0], np.uint8))] * 2,
                       "do not cover")):
        entry = write_class_maps(os.path.join(out, "annotations.bin"), {8: maps})
        with open(os.path.join(out, "manifest.json"), "w") as f:
            json.dump({**m, "annotations": entry}, f)
        with pytest.raises(ShardFormatError, match=why):
            _ = fastdata.open(out).annotations


@pytest.mark.parametrize("fit", ["crop", "stretch"])
def test_a_map_larger_than_a_class_maps_limit_is_resampled_to_it(tmp_path, fit):
    """A photo of more than 4096 x 4096 pixels with its map: the map is stored at the most of
    its shape the ``classmap`` kind holds, and still lies on its pixels."""
    src, maps = tmp_path / "src", tmp_path / "maps"
    for d in (src, maps):
        (d / "img").mkdir(parents=True)
    w, h = 4104, 4097
    picture = np.zeros((h, w, 3), np.uint8)
    picture[:, w // 2:] = 255                      # white on the right half
    Image.fromarray(picture).save(src / "img" / "big.png", compress_level=1)
    m = np.zeros((h, w), np.uint8)
    m[:, w // 2:] = 1
    Image.fromarray(m).save(maps / "img" / "big.png", compress_level=1)
    out = str(tmp_path / "out")
    convert(str(src), out, sizes=[32], masks=str(maps), fit=fit, progress=False)
    ds = fastdata.open(out)
    stored = ds[0][1]
    assert stored.size <= 1 << 24 and verify(out) == []
    got, image = stored_maps(ds, 32)[0], ds.read_batch([0])[0].mean(-1)
    assert ((got == 1) == (image > 127)).mean() > 0.95 and (got == 1).any() and (got == 0).any()


@pytest.mark.parametrize("option", ["masks", "coco"])
def test_an_unreadable_image_with_labels_is_one_skipped_entry(tmp_path, option):
    """Its labels cannot be placed (its size is unknown) and its pixels cannot be read: one
    entry, unreadable, not a note on its labels as well."""
    src, ann = detection_folder(tmp_path / "src", n=3, maps=True)
    with open(os.path.join(src, "img", "1.png"), "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n not really")
    given = ann if option == "coco" else f"{src}-maps"
    m = convert(src, str(tmp_path / "out"), sizes=[16], progress=False, **{option: given})
    entries = [s for s in m["skipped"] if s["path"] == "img/1.png"]
    assert [s["kind"] for s in entries] == ["unreadable"] and m["num_samples"] == 2
