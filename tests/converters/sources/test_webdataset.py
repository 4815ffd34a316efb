"""WebDataset tars: members grouped by key; what a damaged or hostile tar holds is skipped
with its reason, nothing outside OUT written, and a conversion killed halfway resumes into the
uninterrupted one."""
from __future__ import annotations

import gzip
import io
import tarfile

import pytest

import fastdata
from fastdata.converters.convert import ConversionError, convert
from fastdata.converters.sources.tarfiles import BLOCK
from fastdata.converters.sources.webdataset import outside, split_name
from tests.helpers import killed_then_resumed, smooth, tree_digest


def _jpeg(k: int) -> bytes:
    buf = io.BytesIO()
    smooth(24 + k % 3, 20, k).save(buf, "JPEG", quality=95)
    return buf.getvalue()


def _tar(path, members, fmt=tarfile.USTAR_FORMAT) -> str:
    """A tar of ``members``: (name, bytes) in order."""
    with tarfile.open(path, "w", format=fmt) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return str(path)


def _samples(n: int, start: int = 0) -> list[tuple[str, bytes]]:
    return [m for k in range(start, start + n) for m in (
        (f"{k:04d}.jpg", _jpeg(k)), (f"{k:04d}.cls", str(k % 2).encode()),
        (f"{k:04d}.txt", f"caption {k}".encode()))]


def _reasons(manifest) -> dict[str, str]:
    return {s["path"]: s["reason"] for s in manifest["skipped"]}


def test_keys_and_extensions_as_webdataset_splits_them():
    assert split_name("a/b/000123.seg.png") == ("a/b/000123", "seg.png")
    assert split_name("x.JPG") == ("x", "jpg") and split_name("README") == ("README", "")
    assert outside("../x.jpg") and outside("/etc/x.jpg") and outside("a/../../x.jpg")
    assert not outside("a/x..y.jpg") and not outside("./a.jpg")


def test_long_names_pax_and_gnu_headers_are_read(tmp_path):
    deep = "d" * 120 + "/" + "e" * 90
    for fmt in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT):
        tar = _tar(tmp_path / f"{fmt}.tar", [(f"{deep}/0001.jpg", _jpeg(1)),
                                              (f"{deep}/0001.txt", "ünï".encode())], fmt)
        m = convert(tar, str(tmp_path / f"o{fmt}"), sizes=[8], progress=False)
        ds = fastdata.open(str(tmp_path / f"o{fmt}"))
        assert len(ds) == 1 and ds[0]["txt"] == "ünï" and m["label_kind"] == "none"


def test_damaged_or_hostile_members_are_skipped_with_their_reason(tmp_path):
    members = _samples(2) + [
        ("0002.jpg", _jpeg(2)), ("0002.txt", b"\xff\xfe not utf-8"),     # not UTF-8
        ("../0003.jpg", _jpeg(3)),                                          # outside
        ("/abs/0004.jpg", _jpeg(4)),                                         # absolute
        ("0005.jpg", b"GIF89a but no image"), ("0005.cls", b"1"),           # not an image
        ("0006.cls", b"1"), ("0006.txt", b"no image beside it"),            # no image
        ("0007.jpg", _jpeg(7)), ("0007.cls", b"0"), ("0007.txt", b"caption 7"),
        ("0007.xyz", b"?"),                                     # kept, its .xyz left out
        ("0000.jpg", _jpeg(0)),                                            # the key again
        *_samples(1, 8)]
    tar = _tar(tmp_path / "bad.tar", members)
    before = tree_digest(tmp_path)
    out = tmp_path / "out"
    m = convert(tar, str(out), sizes=[8], progress=False)
    reasons = _reasons(m)
    assert "not UTF-8" in reasons["bad.tar/0002"]
    assert "named outside the archive" in reasons["bad.tar/../0003"]
    assert "named outside the archive" in reasons["bad.tar//abs/0004"]
    assert "not an image" in reasons["bad.tar/0005"]
    assert "no image member" in reasons["bad.tar/0006"]
    assert "the key '0000' again" in reasons["bad.tar/0000"]
    ds = fastdata.open(str(out))
    assert [ds[i]["txt"] for i in range(len(ds))] == [f"caption {k}" for k in (0, 1, 7, 8)]
    assert m["ignored"] == {"tar member with no field's extension (.xyz: name its kind with "
                            "--field xyz=KIND)": 1}
    after = tree_digest(tmp_path)
    assert {k: v for k, v in after.items() if not k.startswith("out")} == before


def _claiming(size: int) -> bytes:
    """A tar header of a member ``0009.jpg`` whose size field says ``size`` bytes (GNU's
    base-256 number), and no data after it."""
    info = tarfile.TarInfo("0009.jpg")
    info.size = size
    return info.tobuf(tarfile.GNU_FORMAT)


@pytest.mark.parametrize("how", ["cut", "100 GB member", "damaged header"])
def test_a_damaged_tar_keeps_the_samples_before_the_damage(tmp_path, how):
    good = _tar(tmp_path / "good.tar", _samples(3))
    with tarfile.open(good) as tf:      # its members, without the end blocks and padding
        members = tf.getmembers()
    body = open(good, "rb").read()[:members[-1].offset_data + BLOCK]
    if how == "cut":
        data = body[:members[-3].offset_data + 100]     # inside the last image's data
    elif how == "100 GB member":
        data = body + _claiming(100 << 30)
    else:
        data = body + b"\x01" * BLOCK
    (tmp_path / "d.tar").write_bytes(data)
    m = convert(str(tmp_path / "d.tar"), str(tmp_path / "o"), sizes=[8], progress=False)
    why = _reasons(m)["d.tar"]
    expected = {"cut": "a member of 926 bytes runs past the archive's end", "100 GB member":
                "a member of 107,374,182,400 bytes runs past the archive's end",
                "damaged header": "its header is damaged"}[how]
    assert expected in why and "the members after it are left out" in why
    assert m["num_samples"] == (2 if how == "cut" else 3)      # the whole samples before it


def test_a_damaged_gzip_stream_keeps_what_came_before(tmp_path):
    raw = open(_tar(tmp_path / "t.tar", _samples(40)), "rb").read()
    packed = bytearray(gzip.compress(raw, compresslevel=1))
    for k in range(len(packed) * 2 // 3, len(packed) * 2 // 3 + 64):
        packed[k] ^= 0x5A
    (tmp_path / "t.tar.gz").write_bytes(bytes(packed))
    m = convert(str(tmp_path / "t.tar.gz"), str(tmp_path / "o"), sizes=[8], progress=False)
    why = _reasons(m)["t.tar.gz"]
    assert "gzip data is damaged" in why or "header is damaged" in why, why
    assert 0 < m["num_samples"] < 40
    (tmp_path / "cut.tar.gz").write_bytes(gzip.compress(raw)[:-100])
    m = convert(str(tmp_path / "cut.tar.gz"), str(tmp_path / "o2"), sizes=[8], progress=False)
    assert "gzip stream ends early" in _reasons(m)["cut.tar.gz"]


def test_a_tar_of_no_image_is_one_line_naming_why(tmp_path):
    tar = _tar(tmp_path / "n.tar", [("0001.txt", b"x"), ("0001.npy", b"y")])
    with pytest.raises(ConversionError, match=r"no sample with an image in .*n.tar \(1 left "
                                              r"out, e.g. n.tar/0001: no image member"):
        convert(tar, str(tmp_path / "o"), sizes=[8], progress=False)
    assert not (tmp_path / "o").exists()


def test_a_missing_tar_of_a_pattern_is_named(tmp_path):
    _tar(tmp_path / "s-000.tar", _samples(1))
    with pytest.raises(FileNotFoundError, match=r"s-001.tar: not found \(1 of the 2 files"):
        convert(str(tmp_path / "s-{000..001}.tar"), str(tmp_path / "o"), progress=False)


def test_a_killed_tar_conversion_resumes_into_the_uninterrupted_one(tmp_path):
    killed_then_resumed(_tar(tmp_path / "t.tar", _samples(24)), tmp_path)


def test_a_shuffled_conversion_reads_a_tar_on_disk_in_its_drawn_order(tmp_path):
    """A tar on disk is read where each image lies, in any order; a compressed one only in
    its own (refused with --shuffle, naming why)."""
    tar = _tar(tmp_path / "t.tar", _samples(12))
    m = convert(tar, str(tmp_path / "s"), sizes=[8], progress=False, shuffle=True)
    convert(tar, str(tmp_path / "p"), sizes=[8], progress=False)
    plain, drawn = fastdata.open(str(tmp_path / "p")), fastdata.open(str(tmp_path / "s"))
    by_caption = {plain[i]["txt"]: plain[i]["image"].tobytes() for i in range(len(plain))}
    order = [drawn[i]["txt"] for i in range(len(drawn))]
    assert m["shuffle"] and sorted(order) == sorted(by_caption) and order != sorted(order)
    assert all(drawn[i]["image"].tobytes() == by_caption[order[i]] for i in range(len(drawn)))
    (tmp_path / "t.tar.gz").write_bytes(gzip.compress(open(tar, "rb").read()))
    with pytest.raises(ValueError, match="a compressed tar or one in a store from its start"):
        convert(str(tmp_path / "t.tar.gz"), str(tmp_path / "g"), sizes=[8], progress=False,
                shuffle=True)
