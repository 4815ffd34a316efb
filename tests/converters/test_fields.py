"""A labels file's other columns become fields: CSV, JSON Lines and parquet give the same set;
kinds inferred or given; a bad value skips its row naming file, line and column; nothing of a
refused file is written."""
from __future__ import annotations

import csv
import json
import os

import numpy as np
import pytest

import fastdata
from fastdata.cli import main as cli
from fastdata.converters.convert import convert
from tests.helpers import caption_of, captioned_folder


@pytest.fixture(scope="module")
def captioned(tmp_path_factory):
    return captioned_folder(tmp_path_factory.mktemp("fields"), per_class=4)


def _rows(labels):
    with open(labels, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def _contents(out) -> list:
    ds = fastdata.open(out)
    return [(s["image"].tobytes(), s.get("label"), s["caption"], s["emb"].tolist())
            for s in (ds[i] for i in range(len(ds)))]


def test_csv_jsonl_and_parquet_give_the_same_set(captioned, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    src, labels = captioned
    rows = _rows(labels)
    jsonl = tmp_path / "labels.jsonl"           # Hugging Face's column name for the path
    jsonl.write_text("\n".join(json.dumps({"file_name": r["path"], "label": r["label"],
                                           "caption": r["caption"],
                                           "emb": json.loads(r["emb"])}) for r in rows),
                     encoding="utf-8")
    parquet = tmp_path / "labels.parquet"
    pq.write_table(pa.table({"caption": [r["caption"] for r in rows],
                             "path": [r["path"] for r in rows],
                             "emb": [json.loads(r["emb"]) for r in rows],
                             "label": [r["label"] for r in rows]}), parquet)
    sets = {}
    for name, file in (("csv", labels), ("jsonl", jsonl), ("parquet", parquet)):
        out = str(tmp_path / name)
        m = convert(src, out, sizes=[16], labels=str(file), progress=False)
        assert m["label_kind"] == "class" and m["classes"] == ["a", "b", "c"]
        assert {f["name"]: f["kind"] for f in m["fields"]} == {"caption": "text",
                                                               "emb": "array"}
        sets[name] = _contents(out)
    assert sets["csv"] == sets["jsonl"] == sets["parquet"]
    assert [c for _, _, c, _ in sets["csv"]] == [caption_of(k) for k in range(12)]


def test_a_caption_only_file_is_a_set_without_labels(captioned, tmp_path):
    """The file a new user tries first: `path,caption` (it failed with "not numbers")."""
    src, labels = captioned
    file = tmp_path / "captions.csv"
    with open(file, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["path", "caption"])
        w.writerows([r["path"], r["caption"]] for r in _rows(labels))
    out = str(tmp_path / "o")
    m = convert(src, out, sizes=[16], labels=str(file), progress=False)
    assert m["label_kind"] == "none" and m["classes"] == [] and m["num_samples"] == 12
    ds = fastdata.open(out)
    assert set(ds[1]) == {"image", "caption"} and ds[1]["caption"] == caption_of(1)
    with pytest.raises(ValueError, match="has no labels, only fields .caption.*fields="):
        fastdata.Loader(out, batch_size=4, device="cpu")
    batch = next(iter(fastdata.Loader(out, batch_size=4, device="cpu", train=False,
                                      fields=["image", "caption"])))
    assert batch["caption"] == [caption_of(k) for k in range(4)]


def test_a_kind_given_on_the_command_line_wins_over_the_inferred_one(captioned, tmp_path,
                                                                     capsys):
    src, labels = captioned
    file = tmp_path / "scores.csv"
    with open(file, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "score", "tags"])
        w.writerows([r["path"], str(k), "x|y" if k % 2 else "y"]
                    for k, r in enumerate(_rows(labels)))
    out = str(tmp_path / "o")
    assert cli(["-q", "convert", src, out, "--size", "16", "--labels", str(file),
                "--field", "score=text", "--field", "tags=multilabel"]) == 0
    ds = fastdata.open(out)
    assert ds.fields["score"].kind == "text" and ds[3]["score"] == "3"
    assert ds.fields["tags"].classes == ["x", "y"] and ds[3]["tags"].tolist() == [1, 1]
    assert cli(["info", out]) == 0
    shown = capsys.readouterr().out
    assert "score: text: 1-2 bytes" in shown and "tags: multilabel" in shown
    assert "no labels" in shown
    with pytest.raises(SystemExit):
        cli(["convert", src, str(tmp_path / "x"), "--labels", str(file), "--field",
             "score=words"])
    assert ("kind 'words' is not valid; choose one of array, boxes, class, classmap, float, json, "
            "keypoints, multilabel, text, tokens") in capsys.readouterr().err
    with pytest.raises(ValueError, match="has no column 'scor'.*its columns: score, tags"):
        convert(src, str(tmp_path / "y"), labels=str(file), fields={"scor": "text"},
                progress=False)
    assert not os.path.exists(tmp_path / "y")


def test_a_value_not_of_its_kind_skips_its_row_naming_file_line_and_column(captioned,
                                                                           tmp_path):
    src, labels = captioned
    rows = _rows(labels)
    rows[2]["emb"] = "[1, 2]"                           # not the column's 8 numbers
    rows[5]["caption"] = "x" * (17 << 20)              # more than a value may hold
    file = tmp_path / "bad.csv"
    with open(file, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, ["path", "label", "caption", "emb"])
        w.writeheader()
        w.writerows(rows)
    m = convert(src, str(tmp_path / "o"), sizes=[16], labels=str(file), progress=False)
    reasons = {s["path"]: s["reason"] for s in m["skipped"]}
    assert m["num_samples"] == 10
    assert "labels file bad.csv line 4, column emb: an array of shape (2,), not (8,)" in \
        reasons[rows[2]["path"].replace("/", os.sep)]
    assert "line 7, column caption: a value of 17,825,792 bytes" in \
        reasons[rows[5]["path"].replace("/", os.sep)]


@pytest.mark.parametrize("header, match", [
    (["path", "image"], "column name 'image' is taken"),
    (["path", "a b"], "column name 'a b' is not valid"),
    (["path", "x", "x"], "each named once"),
    (["name", "caption"], "one image path column"),
])
def test_a_file_whose_columns_cannot_be_fields_is_refused_in_one_line(captioned, tmp_path,
                                                                      header, match):
    src, _ = captioned
    file = tmp_path / "cols.csv"
    file.write_text(",".join(header) + "\n" + ",".join(["a/img_000.png"] +
                                                      ["v"] * (len(header) - 1)) + "\n")
    with pytest.raises(ValueError, match=match):
        convert(src, str(tmp_path / "o"), labels=str(file), progress=False)
    assert not os.path.exists(tmp_path / "o")


def test_text_that_is_not_utf8_is_refused_naming_the_file(captioned, tmp_path):
    src, _ = captioned
    file = tmp_path / "latin1.csv"
    file.write_bytes("path,caption\na/img_000.png,caf\xe9\n".encode("latin-1"))
    with pytest.raises(ValueError, match="latin1.csv is not a readable CSV"):
        convert(src, str(tmp_path / "o"), labels=str(file), progress=False)
    jsonl = tmp_path / "x.jsonl"        # a lone surrogate: a str, but no UTF-8 for it
    jsonl.write_text('{"path": "a/img_000.png", "caption": "\\ud800"}\n'
                     '{"path": "a/img_001.jpg", "caption": "fine"}\n')
    m = convert(src, str(tmp_path / "j"), sizes=[16], labels=str(jsonl), progress=False)
    reasons = {s["path"]: s["reason"] for s in m["skipped"]}
    assert "x.jsonl line 1, column caption: text with a lone surrogate is not UTF-8" in \
        reasons[os.path.join("a", "img_000.png")]
    assert fastdata.open(str(tmp_path / "j"))[0]["caption"] == "fine"


def test_a_resumed_conversion_of_fields_is_the_uninterrupted_one(captioned, tmp_path):
    src, labels = captioned
    whole = convert(src, str(tmp_path / "whole"), sizes=[16], labels=labels, shard_size=5,
                    progress=False)
    part = tmp_path / "part"
    convert(src, str(part), sizes=[16], labels=labels, shard_size=5, progress=False)
    os.remove(part / "manifest.json")
    os.remove(part / whole["shards"][-1]["file"])
    assert cli(["-q", "convert", src, str(part), "--resume"]) == 0     # options recorded
    again = json.loads((part / "manifest.json").read_text())
    assert again["shards"] == whole["shards"] and again["fields"] == whole["fields"]
    for s in whole["shards"]:
        assert (part / s["file"]).read_bytes() == (tmp_path / "whole" / s["file"]).read_bytes()
    np.testing.assert_array_equal(fastdata.open(str(part)).field_values("emb", range(12)),
                                  [[k] * 8 for k in range(12)])


def test_a_set_without_fields_is_written_as_before(captioned, tmp_path):
    """Version 2, no fields entry, the shard checksum of labels and CRCs alone: what every
    earlier reader reads."""
    from fastdata.format import shard_checksum

    src, _ = captioned
    m = convert(src, str(tmp_path / "o"), sizes=[16], progress=False)
    assert m["version"] == 2 and "fields" not in m and "field_kinds" not in m
    ds = fastdata.open(str(tmp_path / "o"))
    assert ds.fields == {} and isinstance(ds[0], tuple)
    reader = ds.shards[0]
    assert shard_checksum(reader.labels(), [reader.crcs(16)]) == m["shards"][0]["sha256"]


@pytest.mark.parametrize("fit, cut", [("crop", 1), ("pad", 0), ("stretch", 0)])
def test_boxes_the_fit_cuts_away_are_noted(tmp_path, fit, cut):
    """A 2:1 picture with a box in its left fifth (outside the centre square that --fit crop
    keeps) and one in its middle: the crop's note names the box it dropped; pad and stretch
    keep both."""
    from PIL import Image

    src = tmp_path / "src"
    src.mkdir()
    Image.new("RGB", (64, 32), (200, 30, 30)).save(src / "wide.png")
    labels = tmp_path / "labels.jsonl"
    labels.write_text(json.dumps({"path": "wide.png", "objects": [
        {"box": [0.02, 0.2, 0.15, 0.8], "label": "a"},
        {"box": [0.4, 0.2, 0.6, 0.8], "label": "b"}]}) + "\n")
    m = convert(str(src), str(tmp_path / "set"), sizes=[16], labels=str(labels),
                fields={"objects": "boxes"}, fit=fit, progress=False)
    notes = [s for s in m["skipped"] if s["kind"] == "note"]
    assert len(fastdata.open(str(tmp_path / "set")).field_values("objects", [0])[0]) == 2 - cut
    if cut:
        assert notes == [{"path": "wide.png", "kind": "note", "reason": "field objects: 1 of its "
                          "2 boxes lie outside the square --fit crop keeps of the picture, so "
                          "are not stored (--fit pad keeps every box)"}]
    else:
        assert notes == []
