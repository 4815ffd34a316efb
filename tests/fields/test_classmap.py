"""Class maps as a field: PNGs named by a labels file or carried in a tar, stored per shard,
resampled through each image's crop and flip on both backends."""
from __future__ import annotations

import io
import json
import os
import tarfile

import numpy as np
import pytest
import torch
from PIL import Image

import fastdata
from fastdata.converters.convert import convert
from fastdata.fields import Column, FieldError, field_of
from fastdata.ops.targets import sample_grid

#: each class's colour in the pictures (class 0 is the white background)
COLOURS = {1: (255, 0, 0), 2: (0, 0, 255)}


def _png(a: np.ndarray, mode: str = "L") -> bytes:
    out = io.BytesIO()
    img = Image.fromarray(a, "L")
    if mode == "P":
        img = img.convert("P")
    img.save(out, "PNG")
    return out.getvalue()


def test_a_map_round_trips_and_bad_ones_are_refused_naming_where():
    kind = field_of("classmap")
    m = np.zeros((5, 7), np.uint8)
    m[1:3, 2:6], m[4] = 3, 255
    for mode in ("L", "P"):
        assert np.array_equal(kind.parse(_png(m, mode), "row 1"), m)
    column = kind.pack([m, m.T.copy()])
    kind.check(column, 2, "shard-00000")
    back = kind.read(column, np.array([1, 0]))
    assert np.array_equal(back[0], m.T) and np.array_equal(back[1], m)
    assert kind.describe(column) == "classmap: 42-122 bytes, mean 82 run-length encoded"
    rgb = io.BytesIO()
    Image.new("RGB", (4, 4)).save(rgb, "PNG")
    jpeg = io.BytesIO()
    Image.new("L", (4, 4)).save(jpeg, "JPEG")
    for cell, match in [(rgb.getvalue(), "mode RGB, not a PNG of one 8-bit value"),
                        (jpeg.getvalue(), "a JPEG of mode L"),
                        (b"\x89PNG\r\n\x1a\n broken", "not a readable PNG"),
                        ("masks/1.png", "not a class map PNG")]:
        with pytest.raises(FieldError, match=f"row 3: .*{match}"):
            kind.parse(cell, "row 3")
    runs = column.values.copy()
    runs[12:16] = np.frombuffer(np.uint32(99).tobytes(), np.uint8)   # a run past its pixels
    with pytest.raises(FieldError, match="runs do not cover its 5x7 pixels"):
        kind.check(Column(runs, column.offsets), 2, "shard-00000")
    huge = np.array([1 << 20, 1 << 20, 1], np.uint32).tobytes() + b"\1\0\0\0\0"
    with pytest.raises(FieldError, match="1048576x1048576 pixels in 1 runs does not fit"):
        kind.from_bytes(huge, "value 0")


def test_a_map_of_the_stored_size_reads_the_pixels_the_image_resize_reads():
    kind = field_of("classmap")
    rng = np.random.default_rng(0)
    m = rng.integers(0, 4, (32, 32), dtype=np.uint8)
    crops = np.array([[0, 0, 32, 32], [3, 5, 20, 11], [10, 0, 7, 30]])
    for crop, flip in zip(crops, [False, True, False]):
        got = kind.move_batch([m], crop[None], [flip], 32, 24)[0]
        r, c = sample_grid(crop, 24)
        assert np.array_equal(got, m[np.ix_(r, c[::-1] if flip else c)])
    # a map at half the stored size lies over the same square
    half = m[::2, ::2]
    got = kind.move_batch([half], np.array([[0, 0, 32, 32]]), [False], 32, 16)[0]
    assert np.array_equal(got, half)
    assert kind.collate([got, got]).shape == (2, 16, 16)


def test_a_map_is_placed_as_the_fit_placed_its_picture():
    kind = field_of("classmap")
    m = np.arange(15, dtype=np.uint8).reshape(3, 5)         # a 5:3 picture's map
    cropped = kind.place(m, (5 / 3, 1.0, -1 / 3, 0.0))     # the square: its middle 3/5 of x
    assert np.array_equal(cropped, m[:, 1:4])
    m = np.arange(48, dtype=np.uint8).reshape(6, 8)         # a 4:3 picture's
    padded = kind.place(m, (1.0, 0.75, 0.0, 0.125))          # the square's middle 3/4 of y
    assert padded.shape == (8, 8) and np.array_equal(padded[1:7], m)
    assert (padded[[0, 7]] == 255).all()


def _painted(root, n: int = 6, seed: int = 0):
    """``root/img/<i>.png``: white pictures, wider than high, with a red and a blue
    rectangle; ``root/maps/<i>.png``, their class maps (1 red, 2 blue, 0 elsewhere; each
    other one at half the picture's resolution); the labels file and a tar of both."""
    rng = np.random.default_rng(seed)
    for d in ("img", "maps"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    rows, members = [], []
    for i in range(n):
        w, h = 120, 90
        a = np.full((h, w, 3), 255, np.uint8)
        m = np.zeros((h, w), np.uint8)
        for cls, colour in COLOURS.items():
            x, y = int(rng.integers(0, 70)), int(rng.integers(0, 50))
            a[y:y + 40, x:x + 50], m[y:y + 40, x:x + 50] = colour, cls
        if i % 2:
            m = m[::2, ::2]
        Image.fromarray(a).save(os.path.join(root, "img", f"{i}.png"))
        png = _png(m)
        with open(os.path.join(root, "maps", f"{i}.png"), "wb") as f:
            f.write(png)
        rows.append({"path": f"img/{i}.png", "seg": f"maps/{i}.png"})
        members += [(f"{i:04d}.png", open(os.path.join(root, "img", f"{i}.png"), "rb").read()),
                    (f"{i:04d}.seg.png", png)]
    with open(os.path.join(root, "labels.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    with tarfile.open(os.path.join(root, "data.tar"), "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(root)


@pytest.fixture(scope="module", params=["crop", "pad", "stretch"])
def map_set(tmp_path_factory, request):
    src = _painted(tmp_path_factory.mktemp("maps") / "src")
    out = os.path.join(src, "..", "set")
    convert(src, out, sizes=[64], labels=os.path.join(src, "labels.jsonl"),
            fields={"seg": "classmap"}, fit=request.param, progress=False)
    return src, out, request.param


def test_a_tar_of_maps_makes_the_labels_files_set(map_set, tmp_path):
    src, out, fit = map_set
    tars = str(tmp_path / "tars")
    convert(os.path.join(src, "data.tar"), tars, sizes=[64], fields={"seg.png": "classmap"},
            fit=fit, progress=False)
    a, b = fastdata.open(out), fastdata.open(tars)
    assert len(a) == len(b) == 6
    # each map at its own density: the picture's 120x90 (or half of it), as the fit placed it
    shape = {"crop": (90, 90), "pad": (120, 120), "stretch": (90, 120)}[fit]
    for k, (x, y) in enumerate(zip(a.field_values("seg", range(6)),
                                   b.field_values("seg.png", range(6)))):
        assert np.array_equal(x, y) and x.shape == tuple(v // (1 + k % 2) for v in shape)


@pytest.mark.parametrize("backend", ["torch", "dali"])
def test_maps_stay_on_their_pixels_through_crop_and_flip(map_set, backend):
    if backend == "dali":
        pytest.importorskip("nvidia.dali", reason="needs DALI")
    loader = fastdata.Loader(map_set[1], batch_size=6, crop=48, device="cpu", mean=(0, 0, 0),
                             std=(1, 1, 1), scale=(0.5, 1.0), seed=2, backend=backend,
                             fields=["image", "seg"])
    agree = total = padded = 0
    for epoch in range(3):
        loader.set_epoch(epoch)
        batch = next(iter(loader))
        maps = batch["seg"].numpy()
        assert batch["seg"].dtype == torch.uint8 and maps.shape == (6, 48, 48)
        images = batch["image"].permute(0, 2, 3, 1).numpy()
        padded += int((maps == 255).sum())      # the pad's borders (white too): no class
        for cls, colour in [(0, (255, 255, 255)), *COLOURS.items()]:
            near = np.abs(images - np.asarray(colour) / 255).max(-1) < 0.2
            agree += int((near & np.isin(maps, (cls, 255) if cls == 0 else cls)).sum())
            total += int(near.sum())
    assert total > 0.8 * 3 * 6 * 48 * 48 and agree >= 0.97 * total
    assert (padded > 0) == (map_set[2] == "pad")


@pytest.mark.parametrize("form", ["save_to_disk", "parquet"])
def test_a_datasets_second_image_column_is_a_class_map(map_set, form, tmp_path):
    """A Hugging Face dataset of an image and its ``annotation`` (an ``Image`` too, as scene
    parsing sets hold them): with ``--field annotation=classmap``, the labels file's maps."""
    datasets = pytest.importorskip("datasets")
    src, out, fit = map_set
    def cells(folder):      # the files' bytes, as the hub's parquet files hold them
        return [{"bytes": open(os.path.join(src, folder, f"{i}.png"), "rb").read(),
                 "path": None} for i in range(6)]

    ds = datasets.Dataset.from_dict(
        {"image": cells("img"), "annotation": cells("maps")},
        features=datasets.Features({"image": datasets.Image(), "annotation": datasets.Image()}))
    where = str(tmp_path / "ds")
    if form == "parquet":
        os.makedirs(where)
        ds.to_parquet(os.path.join(where, "train.parquet"))
    else:
        ds.save_to_disk(where)
    convert(where, str(tmp_path / "o"), sizes=[64], fit=fit, image_column="image",
            fields={"annotation": "classmap"}, progress=False)
    a, b = fastdata.open(out), fastdata.open(str(tmp_path / "o"))
    assert len(b) == 6 and list(b.fields) == ["annotation"]
    for x, y in zip(a.field_values("seg", range(6)), b.field_values("annotation", range(6))):
        assert np.array_equal(x, y)


def test_info_describes_the_maps_and_verify_checks_them(map_set, capsys):
    from fastdata.cli import main as cli
    from fastdata.shards.verify import verify

    assert fastdata.open(map_set[1]).manifest["skipped"] == []    # the maps are no images

    assert cli(["info", map_set[1]]) == 0
    assert "seg: classmap: " in capsys.readouterr().out
    assert verify(map_set[1]) == []
    assert fastdata.open(map_set[1])[1]["seg"].dtype == np.uint8


def test_a_map_outside_the_folder_or_missing_skips_its_image(tmp_path):
    src = _painted(tmp_path / "src", n=3)
    with open(tmp_path / "outside.png", "wb") as f:
        f.write(_png(np.zeros((9, 12), np.uint8)))
    os.symlink(tmp_path / "outside.png", os.path.join(src, "maps", "link.png"))
    with open(os.path.join(src, "labels.jsonl"), "w") as f:
        for path, seg in [("img/0.png", "maps/0.png"), ("img/1.png", "../outside.png"),
                          ("img/2.png", "maps/link.png")]:
            f.write(json.dumps({"path": path, "seg": seg}) + "\n")
    out = str(tmp_path / "set")
    convert(src, out, sizes=[32], labels=os.path.join(src, "labels.jsonl"),
            fields={"seg": "classmap"}, fit="stretch", progress=False)
    ds = fastdata.open(out)
    assert len(ds) == 1
    reasons = {s["path"]: s["reason"] for s in ds.manifest["skipped"]}
    assert "is not a file's path inside" in reasons["img/1.png"]
    assert "is not a file's path inside" in reasons["img/2.png"]


def test_a_class_map_with_classes_refuses_a_value_past_them():
    """With ``classes`` (a segmentation set's label), a value is one of their indices or 255;
    its parameters round-trip through the manifest's form."""
    kind = field_of("classmap", classes=["sky", "road"])
    assert kind.params() == {"classes": ["sky", "road"]} and kind == field_of("classmap",
                                                                             **kind.params())
    assert field_of("classmap").params() == {}
    ok = np.array([[0, 1], [255, 1]], np.uint8)
    assert np.array_equal(kind.from_bytes(kind.to_bytes(ok), "v"), ok)
    with pytest.raises(FieldError, match="neither a class below 2 nor 255"):
        kind.from_bytes(kind.to_bytes(np.array([[0, 2]], np.uint8)), "shard 0, value 3")
    with pytest.raises(FieldError, match="row 4.*neither a class below 2"):
        kind.parse(_png(np.array([[7]], np.uint8)), "row 4")
    with pytest.raises(ValueError, match="at most 255 classes"):
        field_of("classmap", classes=[str(k) for k in range(256)])


def test_the_c_kernel_samples_what_numpy_samples(monkeypatch):
    """Maps sampled straight from their stored runs (the C kernel) equal the NumPy path's
    (decoded, then gathered) through whole squares, crops and flips, at densities above and
    below the square's; a value whose runs lie is refused on that path too."""
    from fastdata.kernels import cpu

    if not cpu.available():
        pytest.skip("fastdata.kernels._native not built")
    kind = field_of("classmap")
    rng = np.random.default_rng(5)
    maps = []
    for shape in [(40, 40), (17, 63), (90, 31), (1, 1), (5, 200)]:
        m = np.full(shape, 255, np.uint8)
        for _ in range(6):      # rectangles: runs of every length, across rows
            y, x = rng.integers(0, shape[0]), rng.integers(0, shape[1])
            m[y:y + int(rng.integers(1, 20)), x:x + int(rng.integers(1, 40))] = rng.integers(9)
        maps.append(m)
    column = kind.pack(maps)
    local = np.array([4, 0, 2, 1, 3, 0])
    for crops in (np.tile([0, 0, 40, 40], (6, 1)),
                  np.array([[5, 9, 20, 13], [0, 0, 1, 1], [30, 2, 7, 38], [12, 12, 3, 28],
                            [39, 39, 1, 1], [0, 17, 40, 23]])):
        for out in (32, 57):
            flips = rng.random(6) < 0.5
            native = kind.read_moved(column, local, crops, flips, 40, out)
            with monkeypatch.context() as m:
                m.setattr(cpu, "available", lambda: False)
                numpy = kind.read_moved(column, local, crops, flips, 40, out)
            assert all(np.array_equal(a, b) for a, b in zip(native, numpy, strict=True))
            assert native[0].shape == (out, out)
    runs = column.values.copy()
    runs[12:16] = np.frombuffer(np.uint32(99).tobytes(), np.uint8)
    with pytest.raises(FieldError, match="runs do not cover"):
        kind.read_moved(Column(runs, column.offsets), local, crops, flips, 40, 32)
