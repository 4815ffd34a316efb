"""Segmentation sets from folders of PNG class maps: what the converter keeps and skips, the
maps on their pixels through orientation and fit, and the class maps file's checks."""
from __future__ import annotations

import json
import os
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

import fastdata
from fastdata.cli import main as cli
from fastdata.converters.convert import convert
from fastdata.format import ShardFormatError
from fastdata.shards.annotations import IGNORE, write_class_maps
from fastdata.shards.verify import verify
from tests.helpers import colour_regions, detection_folder


@pytest.mark.parametrize("container", ["hdf5", "lmdb"])
@pytest.mark.parametrize("fit", ["crop", "pad", "stretch"])
def test_class_maps_land_on_their_pixels(tmp_path, container, fit):
    src, _ = detection_folder(tmp_path / "src", n=5, maps=True)
    out = str(tmp_path / "out")
    m = convert(src, out, container=container, sizes=[32, 64], fit=fit,
                masks=f"{src}-maps", progress=False)
    assert m["version"] == 3 and m["label_kind"] == "segmentation"
    assert m["classes"] == ["0", "1", "2", "3"][:len(m["classes"])] and len(m["classes"]) >= 2
    ds = fastdata.open(out)
    maps = ds.annotations
    regions = colour_regions(ds.read_batch(np.arange(len(ds))))
    for i in range(len(ds)):
        got = maps.class_map(i, 64).astype(np.int64)
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
    regions = colour_regions(ds.read_batch(np.arange(len(ds))))
    for i in range(len(ds)):
        assert ((ds.annotations.class_map(i, 64).astype(np.int64) - 1) == regions[i]).mean() \
            > 0.95


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
    assert (ds.annotations.class_map(0, 16) == IGNORE).all()
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
    assert (fastdata.open(str(tmp_path / "out")).annotations.class_map(1, 16) == IGNORE).all()


def test_an_inconsistent_class_maps_file_is_refused(tmp_path):
    src, _ = detection_folder(tmp_path / "src", n=2, maps=True)
    out = str(tmp_path / "out")
    m = convert(src, out, sizes=[8], masks=f"{src}-maps", progress=False)
    for maps, why in (([(np.array([64], np.uint32), np.array([9], np.uint8))] * 2,
                       "neither a class"),
                      ([(np.array([60], np.uint32), np.array([0], np.uint8))] * 2,
                       "do not cover")):
        entry = write_class_maps(os.path.join(out, "annotations.bin"), {8: maps})
        with open(os.path.join(out, "manifest.json"), "w") as f:
            json.dump({**m, "annotations": entry}, f)
        with pytest.raises(ShardFormatError, match=why):
            _ = fastdata.open(out).annotations
