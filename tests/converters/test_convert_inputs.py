"""Every input oddity of an ImageFolder tree, through the real converter and reader."""
from __future__ import annotations

import io
import json
import os
import re
import struct
import time

import numpy as np
import pytest
from PIL import Image

import fastdata
import fastdata.converters.pool as pool_mod
from fastdata.cli import main as cli
from fastdata.converters import decode
from fastdata.converters.convert import ConversionError, convert
from fastdata.converters.scan import Files, scan_folder
from tests.helpers import garbage_left_for_forks, odd_folder, plain_folder, smooth, tree_digest

# every input format and mode goes through PIL: CI runs these against stock Pillow too
pytestmark = pytest.mark.pil


@pytest.fixture
def odd(tmp_path):
    src = tmp_path / "src"
    expect = odd_folder(src, tmp_path / "outside")
    before = tree_digest(src)
    m = convert(str(src), str(tmp_path / "out"), sizes=[8, 16], fit="stretch", num_workers=2,
                shard_size=5, progress=False)
    return src, tmp_path / "out", m, expect, before


def test_classes_counts_and_ignored(odd):
    src, out, m, expect, _ = odd
    assert m["classes"] == ["broken", "good", "modes", "zz_empty"]   # sorted, empty kept
    assert m["empty_classes"] == ["zz_empty"]
    assert m["ignored"] == expect["ignored"]
    ds = fastdata.open(out)
    counts = np.bincount(ds.labels, minlength=4)
    assert counts.tolist() == [1, expect["good"], len(expect["expect_pixel"]), 0]


def test_corrupt_inputs_skipped_with_reasons(odd):
    _, _, m, expect, _ = odd
    skipped = {s["path"]: s["reason"] for s in m["skipped"]}
    assert set(skipped) == expect["corrupt"]
    assert all(reason.strip() for reason in skipped.values())
    assert skipped["broken/zero.jpg"] == "ValueError: empty file (0 bytes)"
    # reasons are the same on every run: no object addresses (PIL names its BytesIO)
    assert not any(" at 0x" in reason for reason in skipped.values()), skipped


def test_modes_orientation_alpha_bitdepth(odd):
    src, out, m, expect, _ = odd
    ds = fastdata.open(out, size=16)
    files = sorted(
        os.path.relpath(os.path.join(dp, f), src).replace(os.sep, "/")
        for dp, _, fs in os.walk(src, followlinks=True) for f in fs)
    accepted = [p for p in sorted(files, key=lambda p: (p.split("/")[0], p))
                if p not in expect["corrupt"] and not os.path.basename(p).startswith(".")
                and "/.hidden_dir/" not in p and p.split("/")[0] != "zz_empty" and "/" in p
                and os.path.splitext(p)[1].lower() in decode_exts()]
    for name, rgb in expect["expect_pixel"].items():
        img, _ = ds[accepted.index(name)]
        assert np.abs(img[1, 1].astype(int) - rgb).max() <= 12, (name, img[1, 1])
    rot, _ = ds[accepted.index("modes/exif_rot.jpg")]
    assert np.abs(rot[14, 1].astype(int) - (0, 0, 255)).max() <= 12   # bottom is blue
    assert np.abs(rot[1, 14].astype(int) - (255, 0, 0)).max() <= 12   # top right still red


def decode_exts():
    from fastdata.format import IMAGE_EXTENSIONS
    return IMAGE_EXTENSIONS


def test_source_untouched_unicode_symlink(odd, capsys):
    src, out, m, _, before = odd
    assert tree_digest(src) == before
    names = {os.path.basename(p) for p in os.listdir(os.path.join(src, "good"))}
    assert "çà_日本 ✓.png" in names and "link.png" in names
    assert set(os.listdir(out)) == {"manifest.json"} | {s["file"] for s in m["shards"]}
    # names that are not UTF-8 (the fixture's latin1_\xe9.png on Linux) read back the same;
    # the manifest's write failed on them, after the whole conversion
    assert fastdata.format.read_manifest(out) == m
    assert cli(["info", "--json", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["skipped"] == m["skipped"]


def test_the_packed_file_list_reads_back_what_was_added_across_its_blocks():
    """The scan's list is packed on the disk and read back a block at a time (so that the
    conversion's memory does not grow with the number of files)."""
    files = Files()
    names = [f"a/{k:06d}.jpg" for k in range((1 << 16) + 3)]
    files.extend(names, 0)
    files.extend(["b/çà_日本 ✓.png", "b/\udcff.jpg"], 7)     # non-UTF-8 names survive too
    files.freeze()
    expect = [(n, 0) for n in names] + [("b/çà_日本 ✓.png", 7), ("b/\udcff.jpg", 7)]
    assert list(files) == expect and len(files) == len(expect)
    assert files[1 << 16] == expect[1 << 16] and files[-1] == expect[-1]
    assert files[(1 << 16) - 1:(1 << 16) + 1] == expect[(1 << 16) - 1:(1 << 16) + 1]
    assert list(files.iter_from(40000)) == expect[40000:] and files[5:5] == []


def test_scan_follows_linked_folders_once_and_counts_broken_links(tmp_path):
    src, elsewhere = tmp_path / "src", tmp_path / "elsewhere"
    for d in (src / "a" / "sub", src / "b", elsewhere):
        d.mkdir(parents=True)
    for p in (src / "a" / "x.png", src / "b" / "z.png", elsewhere / "y.png"):
        Image.new("RGB", (4, 4)).save(p)
    os.symlink(elsewhere, src / "a" / "linked")           # a linked folder: followed
    os.symlink(elsewhere, src / "b" / "linked_too")       # ...into each class that links it
    os.symlink(src / "a", src / "a" / "sub" / "loop")     # back to its class: not walked again
    os.symlink(tmp_path / "gone.png", src / "a" / "dead.png")
    (src / "a" / "notes.txt").write_text("x")
    scan = scan_folder(str(src))
    assert list(scan.files) == [("a/linked/y.png", 0), ("a/x.png", 0), ("b/linked_too/y.png", 1),
                          ("b/z.png", 1)]
    assert scan.ignored == {"broken link": 1, "not an image extension": 1}


def test_a_link_to_the_source_or_another_class_brings_no_other_class_in(tmp_path):
    """A link back to the source folder inside a class made that class also hold every
    other class's images (5 images became 7 samples), silently."""
    src = tmp_path / "src"
    for d in (src / "a" / "deep", src / "b", src / "c"):
        d.mkdir(parents=True)
    for p in (src / "a" / "x.png", src / "b" / "y.png", src / "b" / "z.png", src / "c" / "w.png",
              src / "c" / "v.png"):
        Image.new("RGB", (4, 4)).save(p)
    os.symlink(src, src / "a" / "deep" / "root")          # the whole source, from class a
    os.symlink(src / "c", src / "b" / "to_c")             # class c, from class b
    scan = scan_folder(str(src))
    assert list(scan.files) == [("a/x.png", 0), ("b/y.png", 1), ("b/z.png", 1),
                                ("c/v.png", 2), ("c/w.png", 2)]
    assert scan.ignored == {"link to a folder of another class": 2}


def test_on_error_raise_names_the_file(tmp_path):
    src = tmp_path / "src"
    odd_folder(src, tmp_path / "outside")
    with pytest.raises(ConversionError, match="broken/"):
        convert(str(src), str(tmp_path / "out"), sizes=[8], on_error="raise", num_workers=1,
                progress=False)


def test_nothing_readable_is_one_clear_error(tmp_path, caplog):
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "x.jpg").write_text("not a jpeg")
    for on_error, match in (("skip", "none of the 1 images .* e.g. a/x.jpg: "
                                     "ValueError: not an image"),
                            ("raise", "cannot read 'a/x.jpg'")):
        caplog.clear()
        out = str(tmp_path / f"out-{on_error}")
        assert cli(["-q", "convert", str(src), out, "--on-error", on_error]) == 1  # no traceback
        assert re.search(match, caplog.text), caplog.text


def test_a_class_left_without_images_is_named_empty(tmp_path, caplog):
    """All of a class's images unreadable, or a class of AppleDouble files (``__MACOSX`` from a
    zip made on a Mac): the class keeps its index, and the manifest, `info` and a warning say
    that it has no image (a model built from len(classes) gets an output for it)."""
    src = tmp_path / "src"
    for d in ("a", "b", "__MACOSX/a"):
        (src / d).mkdir(parents=True)
    Image.new("RGB", (20, 20)).save(src / "a" / "x.png")
    (src / "b" / "y.jpg").write_text("not a jpeg")
    (src / "__MACOSX" / "a" / "._x.png").write_bytes(b"\0\5\26\7")
    m = convert(str(src), str(tmp_path / "out"), sizes=[8], num_workers=1, progress=False)
    assert m["classes"] == ["__MACOSX", "a", "b"] and m["empty_classes"] == ["__MACOSX", "b"]
    assert "2 classes without a readable image, kept so that labels match the folder names: " \
        "__MACOSX, b" in caplog.text


def test_forked_decoders_never_collect_the_callers_garbage(tmp_path):
    """A conversion called where earlier work left CUDA tensors in garbage cycles (a notebook
    after training): a worker that collected one would die (see the loader's test)."""
    src, log = plain_folder(tmp_path / "src", per_class=2), tmp_path / "freed"
    with garbage_left_for_forks(log):
        convert(src, str(tmp_path / "out"), sizes=[8], num_workers=2, progress=False)
    assert log.read_text().split() == [str(os.getpid())]      # freed here, and only here


def _die_on(name, real=decode.prepare):
    def prepare(path, opts, *args):
        if os.path.basename(path) == name:
            os._exit(3) if name.startswith("die") else time.sleep(3600)
        return real(path, opts, *args)
    return prepare


# the pool is made anew while a shard is open (its file handles are inherited by the workers)
@pytest.mark.parametrize("culprit,container", [("die.png", "hdf5"), ("hang.png", "hdf5"),
                                               ("die.png", "lmdb")])
def test_dead_or_hung_worker_is_detected_and_skipped(tmp_path, monkeypatch, culprit, container):
    src = plain_folder(tmp_path / "src", per_class=6)
    os.rename(os.path.join(src, "b", "img_000.png"), os.path.join(src, "b", culprit))
    convert(src, str(tmp_path / "clean"), sizes=[8], num_workers=2, progress=False)
    monkeypatch.setattr(decode, "prepare", _die_on(culprit))       # inherited by forked workers
    monkeypatch.setattr(pool_mod, "ITEM_TIMEOUT_S", 1.0)
    m = convert(src, str(tmp_path / "out"), container=container, sizes=[8], num_workers=2,
                progress=False)
    assert m["num_samples"] == 17
    assert [s["path"] for s in m["skipped"]] == [f"b/{culprit}"]
    assert ("died" if culprit.startswith("die") else "hung") in m["skipped"][0]["reason"]
    # the images retried one by one after the failure still land in the right samples
    gone = 6 + sorted(os.listdir(os.path.join(src, "b"))).index(culprit)
    clean = fastdata.open(tmp_path / "clean").read_batch([i for i in range(18) if i != gone])
    assert np.array_equal(fastdata.open(tmp_path / "out").read_batch(range(17)), clean)


def test_results_that_come_back_out_of_order_are_written_in_order(tmp_path, monkeypatch):
    """One worker held up by its first image while the other finishes later batches: the
    shards are those of a single worker, in input order."""
    src, log = plain_folder(tmp_path / "src", per_class=8), str(tmp_path / "log")
    convert(src, str(tmp_path / "one"), sizes=[8], num_workers=1, shard_size=7, progress=False)

    def prepare(path, opts, *args, real=decode.prepare):
        if path.endswith("img_000.png") and os.sep + "a" + os.sep in path:
            time.sleep(1.0)
        with open(log, "a") as f:       # the order images finished in, across workers
            f.write(os.path.relpath(path, src) + "\n")
        return real(path, opts, *args)
    monkeypatch.setattr(decode, "prepare", prepare)     # inherited by forked workers
    m = convert(src, str(tmp_path / "two"), sizes=[8], num_workers=2, shard_size=7, progress=False)
    finished = open(log).read().split()
    assert finished.index(os.path.join("a", "img_000.png")) >= 8      # a later batch was first
    assert [s["sha256"] for s in m["shards"]] == [
        s["sha256"] for s in json.load(open(tmp_path / "one" / "manifest.json"))["shards"]]
    assert np.array_equal(fastdata.open(tmp_path / "two").read_batch(range(24)),
                          fastdata.open(tmp_path / "one").read_batch(range(24)))


@pytest.mark.parametrize("encoding", ["raw", "jpeg"])
def test_spawned_decoders_give_the_same_shards(tmp_path, monkeypatch, encoding):
    """Where fork is missing (macOS, Windows) workers are spawned and send raw pixels back
    through their pipes, not the shared ring: the same shard set. The first shard holds more
    samples than the ring has slots (32 for one worker), so forked pixels must be written
    before their slots are reused."""
    src = plain_folder(tmp_path / "src", per_class=14)
    (tmp_path / "src" / "b" / "bad.jpg").write_text("not a jpeg")
    kw = dict(sizes=[8, 16], encoding=encoding, num_workers=1, shard_size=40, progress=False)
    forked = convert(src, str(tmp_path / "fork"), **kw)
    monkeypatch.setattr(pool_mod.mp, "get_all_start_methods", lambda: ["spawn"])
    spawned = convert(src, str(tmp_path / "spawn"), **kw)
    assert [s["sha256"] for s in spawned["shards"]] == [s["sha256"] for s in forked["shards"]]
    assert spawned["skipped"] == forked["skipped"] and len(forked["skipped"]) == 1
    for size in (8, 16):
        assert np.array_equal(fastdata.open(tmp_path / "spawn").read_batch(range(42), size=size),
                              fastdata.open(tmp_path / "fork").read_batch(range(42), size=size))


@pytest.mark.parametrize("sizes", [(8,), (8, 32), (128,)])  # DCT-scaled, shrunk, enlarged
@pytest.mark.parametrize("fit", ["crop", "pad", "stretch"])
def test_fast_jpeg_decode_agrees_with_pil(tmp_path, monkeypatch, sizes, fit):
    exif = Image.Exif()
    exif[0x0112] = 6
    path = str(tmp_path / "x.jpg")
    smooth(97, 61, 3).save(path, quality=90, exif=exif.tobytes())
    opts = decode.DecodeOptions(sizes=sizes, fit=fit)
    fast = decode.prepare(path, opts)
    monkeypatch.setattr(decode, "_decode_jpeg", lambda *a: None)     # PIL decodes instead
    pil = decode.prepare(path, opts)
    if sizes == (128,):     # not shrunk: the same decoder settings, the same pixels
        assert pil == fast
    for a, b, s in zip(pil, fast, sizes):     # shrunk: fast chroma upsampling, close to PIL
        diff = np.abs(np.frombuffer(a, np.uint8).astype(int) - np.frombuffer(b, np.uint8))
        assert len(a) == len(b) == 3 * s * s and diff.mean() < 0.5 and diff.max() <= 8


@pytest.mark.parametrize("fit", ["crop", "pad", "stretch"])
def test_one_decode_buffer_for_every_image_gives_what_fresh_ones_give(tmp_path, fit):
    """A worker decodes every image into the same buffer: big, then small (a view of the
    buffer's start), rotated (Exif), DCT-scaled, then big again, and a PNG in between."""
    paths = []
    for k, (w, h, orientation) in enumerate([(97, 61, 1), (40, 33, 1), (61, 97, 6), (300, 200, 1),
                                             (97, 61, 8)]):
        exif = Image.Exif()
        exif[0x0112] = orientation
        paths.append(str(tmp_path / f"{k}.jpg"))
        smooth(w, h, k).save(paths[-1], quality=90, exif=exif.tobytes())
    paths.insert(2, str(tmp_path / "p.png"))
    smooth(50, 70, 9).save(paths[2])
    opts = decode.DecodeOptions(sizes=(16, 32), fit=fit)
    scratch = decode.Scratch()
    shared = [decode.prepare(p, opts, scratch=scratch) for p in paths]
    assert shared == [decode.prepare(p, opts) for p in paths]
    assert len({tuple(s) for s in shared}) == len(paths)     # and the images differ
    assert scratch.take(0).base.size > 0                      # the JPEGs went through it


def _jpeg_with_app1(payload: bytes) -> bytes:
    """A small JPEG with ``payload`` as an APP1 segment right after SOI."""
    buf = io.BytesIO()
    smooth(24, 16, 5).save(buf, "JPEG", quality=90)
    data = buf.getvalue()
    return data[:2] + b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload + data[2:]


def _tiff(order: str, entries) -> bytes:
    """A TIFF block with one IFD of ``(tag, type, count, value)`` entries (value: 4 bytes)."""
    head = (b"II" if order == "<" else b"MM") + struct.pack(order + "HI", 42, 8)
    body = struct.pack(order + "H", len(entries)) + b"".join(
        struct.pack(order + "HHI", t, k, c) + v for t, k, c, v in entries)
    return head + body + struct.pack(order + "I", 0)


@pytest.mark.parametrize("order", ["<", ">"])
def test_exif_orientation_read_as_pil_reads_it(order):
    """The fast JPEG path reads the orientation itself; where it cannot, PIL decides."""
    def short(v):
        return struct.pack(order + "HH", v, 0)
    cases = [_jpeg_with_app1(b"Exif\0\0" + _tiff(order, [(0x010F, 2, 4, b"abc\0"),
                                                          (0x0112, 3, 1, short(v))]))
             for v in range(1, 9)]
    cases += [_jpeg_with_app1(b"Exif\0\0" + _tiff(order, [(0x010F, 2, 4, b"abc\0")])),
              _jpeg_with_app1(b"http://ns.adobe.com/xap/1.0/\0<x/>")]    # no Exif: upright
    for data in cases:
        with Image.open(io.BytesIO(data)) as im:
            assert decode._exif_orientation(data) == im.getexif().get(0x0112, 1)
    odd = [_jpeg_with_app1(b"Exif\0\0" + _tiff(order, [(0x0112, 4, 1, struct.pack(
               order + "I", 6))])),                                        # a LONG
           _jpeg_with_app1(b"Exif\0\0" + _tiff(order, [(0x0112, 3, 1, short(6))])[:14]),
           _jpeg_with_app1(b"Exif\0\0XX*\0\0\0\0\x08")]                     # no byte order
    assert [decode._exif_orientation(d) for d in odd] == [None] * 3
    for data in odd:        # and then PIL's decoder is used, as for any JPEG it cannot take
        assert decode._decode_jpeg(data, decode.DecodeOptions(sizes=(8,))) is None


def test_no_class_dirs_and_missing_source(tmp_path):
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "x.jpg").write_bytes(b"")
    with pytest.raises(ValueError, match="no class directories .*; it holds 1 image directly: "
                                         "move them into class folders, or give their labels "
                                         "with --labels FILE.csv"):
        convert(str(tmp_path / "flat"), str(tmp_path / "o1"), progress=False)
    with pytest.raises(FileNotFoundError, match="nope' does not exist$"):
        convert(str(tmp_path / "nope"), str(tmp_path / "o2"), progress=False)
    (tmp_path / "x.bin").write_bytes(b"")
    with pytest.raises(NotADirectoryError, match=r"x.bin' is a file, not a folder"):
        convert(str(tmp_path / "x.bin"), str(tmp_path / "o3"), progress=False)
    (tmp_path / "x.tar").write_bytes(b"")       # a tar source, of no member
    with pytest.raises(ConversionError, match=r"no sample with an image in .*x.tar \(it holds "
                                              r"no member\)"):
        convert(str(tmp_path / "x.tar"), str(tmp_path / "o4"), progress=False)
    assert not (tmp_path / "o4").exists()
    with pytest.raises(fastdata.format.ShardFormatError, match="nothere' does not exist"):
        fastdata.open(tmp_path / "nothere")


def test_a_source_without_images_says_what_it_holds_and_leaves_no_folder(tmp_path, caplog):
    src = tmp_path / "src"
    for c in ("cats", "dogs"):
        (src / c).mkdir(parents=True)
        (src / c / "notes.txt").write_text("x")
    (src / "dogs" / ".hidden.jpg").write_text("x")
    out = tmp_path / "new" / "out"
    assert cli(["-q", "convert", str(src), str(out)]) == 1
    assert f"no image files in '{src}': 2 class folders (cats, dogs) and no file with an image " \
           f"extension (.jpg," in caplog.text
    assert "ignored: 2 not an image extension, 1 hidden" in caplog.text
    assert not out.exists()
    (src / "cats" / "notes.txt").unlink()
    (src / "dogs" / "notes.txt").unlink()
    (src / "dogs" / ".hidden.jpg").unlink()
    caplog.clear()
    assert cli(["-q", "convert", str(src), str(out)]) == 1 and "they are empty" in caplog.text
    (src / "cats" / "x.jpg").write_text("not a jpeg")       # a run that made OUT and failed
    assert cli(["-q", "convert", str(src), str(out)]) == 1 and not out.exists()


def test_quality_is_for_jpeg_and_every_argument_has_help(tmp_path, folder, caplog, capsys):
    assert cli(["-q", "convert", folder, str(tmp_path / "o"), "--quality", "50"]) == 2
    assert "--quality 50 applies to --encoding jpeg only" in caplog.text
    assert cli(["-q", "convert", folder, str(tmp_path / "o"), "--quality", "50",
                "--encoding", "jpeg", "--size", "8"]) == 0
    for command in ("info", "verify", "convert", "bench", "train", "demo"):
        with pytest.raises(SystemExit):
            cli([command, "--help"])
        text = capsys.readouterr().out
        flat = " ".join(text.split())
        assert "spread) (default" not in flat and not re.search(r"\(default [^)]*\) \(default",
                                                                 flat), text
        for line in text.partition("positional arguments:")[2].split("options:")[0].splitlines():
            if line.startswith("  ") and line.split()[0] in ("out", "src"):
                assert len(line.split()) > 1, f"{command}: {line!r} has no help"


@pytest.mark.pil
def test_a_webp_image_where_pil_lacks_webp_is_named_as_such(monkeypatch):
    import io

    from PIL import Image, features

    from fastdata.converters import decode

    if not features.check("webp"):
        pytest.skip("this PIL cannot write the WebP file the test reads")
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(buf, "WEBP")
    data = buf.getvalue()
    assert decode.unknown_format(data) == "not an image format PIL can read"
    monkeypatch.setattr(decode.PIL_features, "check", lambda name: name != "webp")
    assert "WebP image" in decode.unknown_format(data)
    assert "libwebp" in decode.unknown_format(data)
    assert decode.unknown_format(b"GIF89a" + bytes(6)) == "not an image format PIL can read"
