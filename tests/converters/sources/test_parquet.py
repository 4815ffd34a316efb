"""Parquet sources: the image column found by its type or name (or named), paths beside the
files, splits; null and oversized cells skipped with their reason, a file without an image
column or of other columns refused in one line, a killed conversion resumed."""
from __future__ import annotations

import io
import os

import pytest

import fastdata
from fastdata.cli import main as cli
from fastdata.converters.convert import ConversionError, convert
from fastdata.converters.sources import arrow, parquet
from tests.helpers import killed_then_resumed, smooth

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _png(k: int) -> bytes:
    buf = io.BytesIO()
    smooth(20 + k, 16, k).save(buf, "PNG")
    return buf.getvalue()


def _write(path, columns: dict, **kw) -> str:
    pq.write_table(pa.table(columns), path, **kw)
    return str(path)


def test_the_image_is_found_by_type_name_or_option(tmp_path):
    images = [_png(k) for k in range(4)]
    pics = _write(tmp_path / "a.parquet", {"pic": images, "score": [0.5, 1.0, 1.5, 2.0],
                                           "note": ["x", "y", "z", "w"]})
    m = convert(pics, str(tmp_path / "a"), sizes=[8], progress=False)   # the only bytes
    assert m["num_samples"] == 4 and {f["name"] for f in m["fields"]} == {"score", "note"}
    both = _write(tmp_path / "b.parquet", {"thumb": images, "full": images, "n": [1, 2, 3, 4]})
    with pytest.raises(ValueError, match=r"b.parquet: no image column .* its columns: thumb "
                                         r"\(binary\), full \(binary\), n \(int64\): name the "
                                         r"image's with --image-column NAME"):
        convert(both, str(tmp_path / "b"), sizes=[8], progress=False)
    assert not (tmp_path / "b").exists()
    m = convert(both, str(tmp_path / "b"), sizes=[8], progress=False, image_column="full")
    assert m["num_samples"] == 4 and m["label_kind"] == "regression"   # numbers alone
    with pytest.raises(ValueError, match="--image-column 'n' is not a column of image bytes"):
        convert(both, str(tmp_path / "c"), sizes=[8], progress=False, image_column="n")


def test_null_and_oversized_cells_skip_their_rows(tmp_path, monkeypatch):
    images = [_png(k) for k in range(6)]
    images[1] = None
    images[4] = b"\x89PNG\r\n\x1a\n" + bytes(3 << 20)      # 3 MiB, over the limit set below
    src = _write(tmp_path / "n.parquet", {"image": pa.array(images, pa.binary()),
                                          "caption": [f"c{k}" for k in range(6)]},
                 row_group_size=2, compression="zstd")
    monkeypatch.setattr(arrow.decode, "MAX_FILE_BYTES", 2 << 20)
    m = convert(src, str(tmp_path / "o"), sizes=[8], progress=False)
    reasons = {s["path"]: s["reason"] for s in m["skipped"]}
    assert reasons == {"n.parquet/1": "ValueError: its image cell is null",
                       "n.parquet/4": "ValueError: its image cell holds 3,145,736 bytes, more "
                                      "than an image may (2,097,152)"}
    ds = fastdata.open(str(tmp_path / "o"))
    assert [ds[i]["caption"] for i in range(len(ds))] == ["c0", "c2", "c3", "c5"]


def test_a_row_group_of_a_compressed_bomb_is_refused_unread(tmp_path, monkeypatch):
    """A few kB that inflate to more than its rows' images may hold: its rows skipped before
    a byte of it is decompressed."""
    src = _write(tmp_path / "z.parquet", {"image": [bytes(4 << 20), _png(1)]},
                 compression="zstd")
    assert os.path.getsize(src) < 64 << 10
    monkeypatch.setattr(parquet, "MAX_GROUP_BYTES", 1 << 20)
    with pytest.raises(ConversionError, match=r"could be read \(2 skipped, e.g. z.parquet/0: "
                                              r"ValueError: row group 0 of z.parquet holds "
                                              r"4,19[0-9],[0-9]+ bytes of images, more than the "
                                              r"1,048,576 read"):
        convert(src, str(tmp_path / "o"), sizes=[8], progress=False)


def test_a_path_column_reads_the_files_beside_it(tmp_path):
    folder = tmp_path / "src"
    (folder / "img").mkdir(parents=True)
    for k in range(3):
        (folder / "img" / f"{k}.png").write_bytes(_png(k))
    src = _write(folder / "meta.parquet", {"file_name": ["img/0.png", "../x.png", "img/2.png",
                                                         "img/1.png", "img/2.png"],
                                           "label": ["cat", "dog", "dog", "cat", "cat"]})
    m = convert(src, str(tmp_path / "o"), sizes=[8], progress=False)
    assert m["num_samples"] == 3 and m["classes"] == ["cat", "dog"]
    reasons = sorted(s["reason"] for s in m["skipped"])
    assert "'../x.png' is not a path inside the source folder" in reasons[0]
    assert "'img/2.png' is listed again" in reasons[1]
    assert fastdata.open(str(tmp_path / "o")).labels_of([0, 1, 2]).tolist() == [0, 1, 0]


def test_files_of_other_columns_and_a_shuffle_are_refused(tmp_path):
    folder = tmp_path / "two"
    folder.mkdir()
    _write(folder / "a.parquet", {"image": [_png(0)], "caption": ["x"]})
    _write(folder / "b.parquet", {"image": [_png(1)], "text": ["y"]})
    with pytest.raises(ValueError, match=r"b.parquet: its columns \(image, text\) are not those "
                                         r"of a.parquet \(image, caption\): convert them apart"):
        convert(str(folder), str(tmp_path / "o"), sizes=[8], progress=False)
    with pytest.raises(ValueError, match="--shuffle writes the samples in a drawn order"):
        convert(str(folder / "a.parquet"), str(tmp_path / "o"), sizes=[8], progress=False,
                shuffle=True)
    assert not (tmp_path / "o").exists()


def test_a_file_that_is_not_parquet_is_named(tmp_path, caplog):
    (tmp_path / "x.parquet").write_bytes(b"PAR1 but nothing else")
    assert cli(["-q", "convert", str(tmp_path / "x.parquet"), str(tmp_path / "o")]) == 2
    assert "x.parquet is not a readable parquet file" in caplog.text


def test_a_killed_parquet_conversion_resumes_into_the_uninterrupted_one(tmp_path):
    src = _write(tmp_path / "p.parquet", {"image": [_png(k) for k in range(24)],
                                          "caption": [f"c{k}" for k in range(24)]},
                 row_group_size=5)
    killed_then_resumed(src, tmp_path)


def test_cells_reach_the_workers_through_shared_memory_or_the_pipe_alike(tmp_path, monkeypatch):
    """The parent's bytes go to the decode workers through the Inbox, those that do not fit
    their batch's region through the pipe: the same shards either way."""
    from fastdata.converters import pool

    src = _write(tmp_path / "p.parquet", {"image": [_png(k) for k in range(40)]},
                 row_group_size=7)
    sizes = [len(_png(k)) for k in range(40)]
    runs = {}
    for name, region in (("inbox", pool.INBOX_BATCH_BYTES), ("some by pipe", max(sizes) * 3),
                         ("pipe", 1)):
        monkeypatch.setattr(pool, "INBOX_BATCH_BYTES", region)
        m = convert(src, str(tmp_path / name), sizes=[8, 16], progress=False, num_workers=2)
        runs[name] = [(e["sha256"], (tmp_path / name / e["file"]).read_bytes())
                      for e in m["shards"]]
    assert runs["inbox"] == runs["some by pipe"] == runs["pipe"]
