"""Hugging Face datasets read without the ``datasets`` package (it only makes them here):
splits, class names, a dataset whose files are missing or not its own refused in one line;
the images read in place in the memory-mapped Arrow files."""
from __future__ import annotations

import json
import os

import pytest

import fastdata
from fastdata.converters.convert import convert
from fastdata.converters.sources.hf import HFSource
from tests.helpers import source_forms


@pytest.fixture(scope="module")
def forms(tmp_path_factory):
    return source_forms(tmp_path_factory.mktemp("hf"), per_class=3)


def test_the_images_are_handed_to_the_workers_as_byte_ranges_of_the_arrow_file(forms):
    scan = HFSource(forms["hf"][0]).scan(progress=False)
    spans = list(scan.images.items(0, len(scan.files)))
    arrow_file = os.path.join(forms["hf"][0], "data-00000-of-00001.arrow")
    data = open(arrow_file, "rb").read()
    photos, options = forms["folder"]
    with open(options["labels"], encoding="utf-8") as f:
        paths = [line.split(",")[0] for line in f.read().splitlines()[1:]]
    for span, path in zip(spans, paths):
        assert span.path == arrow_file
        assert data[span.offset:span.offset + span.size] == \
            open(os.path.join(photos, path), "rb").read()


def test_a_split_of_a_dataset_dict_and_its_class_names(forms, tmp_path, caplog):
    src = forms["hf-dict"][0]
    m = convert(src, str(tmp_path / "test"), sizes=[8], split="test", progress=False)
    assert m["num_samples"] == 3 and m["classes"] == ["a", "b", "c"]
    assert m["empty_classes"] == ["b", "c"] and "without a readable image" not in caplog.text
    m = convert(src, str(tmp_path / "train"), sizes=[8], progress=False)    # train, default
    assert m["num_samples"] == 9
    with pytest.raises(ValueError, match=r"is a DatasetDict of the splits train, test: choose "
                                         r"one with --split \('val' is not one\)"):
        convert(src, str(tmp_path / "x"), sizes=[8], split="val", progress=False)
    with pytest.raises(ValueError, match="is one dataset .* not a DatasetDict"):
        convert(forms["hf"][0], str(tmp_path / "x"), sizes=[8], split="test", progress=False)
    assert not (tmp_path / "x").exists()


def test_a_dataset_with_missing_or_foreign_files_is_refused(forms, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(forms["hf"][0], broken)
    os.remove(broken / "data-00000-of-00001.arrow")
    with pytest.raises(FileNotFoundError, match=r"its state.json lists data-00000-of-00001.arrow, "
                                                r"which is missing: save the dataset again"):
        convert(str(broken), str(tmp_path / "o"), sizes=[8], progress=False)
    state = json.loads((broken / "state.json").read_text())
    state["_data_files"] = [{"filename": "../../etc/passwd"}]
    (broken / "state.json").write_text(json.dumps(state))
    with pytest.raises(ValueError, match=r"its _data_files .* are not files of the dataset's "
                                         r"folder"):
        convert(str(broken), str(tmp_path / "o"), sizes=[8], progress=False)
    (broken / "data-00000-of-00001.arrow").write_bytes(b"ARROW1 and no more")
    state["_data_files"] = [{"filename": "data-00000-of-00001.arrow"}]
    (broken / "state.json").write_text(json.dumps(state))
    with pytest.raises(ValueError, match="data-00000-of-00001.arrow is not a readable Arrow"):
        convert(str(broken), str(tmp_path / "o"), sizes=[8], progress=False)
    assert not (tmp_path / "o").exists()


def test_a_null_image_skips_its_row(tmp_path):
    datasets = pytest.importorskip("datasets")
    from tests.helpers import smooth

    smooth(20, 16, 0).save(tmp_path / "a.png")     # save_to_disk embeds a file named by path
    ds = datasets.Dataset.from_dict({"image": [str(tmp_path / "a.png"), None],
                                     "caption": ["x", "y"]},
                                    features=datasets.Features({"image": datasets.Image(),
                                                                "caption": datasets.Value(
                                                                    "string")}))
    ds.save_to_disk(str(tmp_path / "ds"))
    m = convert(str(tmp_path / "ds"), str(tmp_path / "o"), sizes=[8], progress=False)
    assert m["num_samples"] == 1 and m["skipped"] == [
        {"path": "data-00000-of-00001.arrow/1", "kind": "unreadable",
         "reason": "ValueError: its image cell is null"}]
    assert fastdata.open(str(tmp_path / "o"))[0]["caption"] == "x"


def test_a_hub_layout_missing_a_file_of_its_split_is_named(forms, tmp_path):
    import shutil

    hub = tmp_path / "hub"
    shutil.copytree(forms["hub"][0], hub)
    os.remove(hub / "data" / "train-00001-of-00002.parquet")
    with pytest.raises(FileNotFoundError, match=r"data/train-00001-of-00002.parquet is missing "
                                                r"\(1 of the 2 files of its split\): "
                                                r"download the dataset again"):
        convert(str(hub), str(tmp_path / "o"), sizes=[8], split="train", progress=False)
    assert not (tmp_path / "o").exists()
