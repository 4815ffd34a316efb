"""Fields in shards: every kind's column written by the real writers and read back by the
readers of both containers; a damaged or hostile column refused, naming the field."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import fastdata
from fastdata.converters.convert import convert
from fastdata.converters.writers import WRITERS
from fastdata.fields import field_of
from fastdata.format import ShardFormatError, ShardMeta, shard_checksum
from fastdata.shards import READERS
from fastdata.shards.verify import verify
from tests.helpers import caption_of, captioned_folder

N = 5
KINDS = {
    "caption": (field_of("text"), ["", "ünïcödé ✓", "x" * 100_000, "\n\t", "日本語"]),
    "tokens16": (field_of("tokens", dtype="uint16"), [np.arange(k, dtype=np.uint16)
                                                      for k in range(N)]),
    "tokens64": (field_of("tokens", dtype="int64"), [np.array([-(2 ** 40), k]) for k in
                                                     range(N)]),
    "half": (field_of("array", shape=[2, 3], dtype="float16"),
             [np.full((2, 3), k / 3, np.float16) for k in range(N)]),
    "small": (field_of("array", shape=[4], dtype="int8"),
              [np.array([-128, k, 0, 127], np.int8) for k in range(N)]),
    "flag": (field_of("array", shape=[1], dtype="bool"), [np.array([k % 2 == 0])
                                                          for k in range(N)]),
    "score": (field_of("float"), [k / 7 for k in range(N)]),
    "klass": (field_of("class", classes=["x", "y"]), [k % 2 for k in range(N)]),
    "tags": (field_of("multilabel", classes=["a", "b", "c"]),
             [np.eye(3, dtype=np.float32)[k % 3] for k in range(N)]),
    "meta": (field_of("json"), [{"k": k, "name": "ö"} for k in range(N)]),
}


def _write(path, container, kinds, values):
    w = WRITERS[container](str(path), sizes=(8,), encoding="raw", capacity=N, fields=kinds)
    for k in range(N):
        w.add(k, [np.full((8, 8, 3), k, np.uint8)], [0], tuple(v[k] for v in values))
    meta = ShardMeta(index=0, start=0, count=N, sha256=w.checksum(), config="", sources=(0, N))
    w.finish(meta)
    return meta


@pytest.mark.parametrize("container", ["hdf5", "lmdb"])
def test_every_kind_round_trips_through_a_shard(tmp_path, container):
    kinds = {name: kind for name, (kind, _) in KINDS.items()}
    values = [v for _, v in KINDS.values()]
    path = tmp_path / f"shard{'.h5' if container == 'hdf5' else '.lmdb'}"
    meta = _write(path, container, kinds, values)
    reader = READERS[container](str(path), sizes=(8,), encoding="raw", count=N, fields=kinds)
    for (name, kind), want in zip(kinds.items(), values):
        got = reader.field_values(name, np.array([4, 0, 2]))
        for g, w in zip(got, [want[4], want[0], want[2]]):
            if isinstance(w, np.ndarray) or kind.fixed:
                assert np.array_equal(np.asarray(g), np.asarray(w, kind.dtype)), name
                assert np.asarray(g).dtype == (kind.dtype if kind.fixed else kind.token_dtype)
            else:
                assert g == w, name
    columns = [reader.column(n) for n in kinds]
    assert shard_checksum([0, 1, 2, 3, 4], [np.zeros(N, np.uint32)], columns) == meta.sha256
    reader.close()


@pytest.mark.parametrize("container", ["hdf5", "lmdb"])
def test_a_set_of_fields_verifies_and_a_damaged_caption_is_found(tmp_path, container):
    src, labels = captioned_folder(tmp_path)
    out = str(tmp_path / "set")
    m = convert(src, out, container=container, sizes=[16], labels=labels, shard_size=10,
                progress=False)
    assert m["version"] == 4 and [f["name"] for f in m["fields"]] == ["caption", "emb"]
    assert verify(out) == []
    ds = fastdata.open(out)
    assert ds.field_values("caption", [7])[0] == caption_of(7)
    assert ds[7]["caption"] == caption_of(7) and ds[7]["emb"].tolist() == [7.0] * 8
    path = ds.shards[0].path
    data = bytearray(open(path, "rb").read())
    at = data.find(caption_of(3).encode())
    assert at > 0
    data[at + 6:at + 8] = b"\xff\xfe"            # no longer UTF-8, nor the checksummed bytes
    open(path, "wb").write(bytes(data))
    problems = [str(p) for p in verify(out)]
    assert any("field caption" in p and "not UTF-8" in p for p in problems), problems
    assert any("checksum mismatch" in p for p in problems), problems
    for batch in ([3], [1, 2, 3, 4]):
        with pytest.raises(OSError, match="field caption: value 3: not UTF-8"):
            fastdata.open(out).field_values("caption", batch)


def test_hostile_offsets_are_refused_as_the_shard_opens(tmp_path):
    import h5py

    kinds = {"caption": field_of("text")}
    path = tmp_path / "shard.h5"
    _write(path, "hdf5", kinds, [KINDS["caption"][1]])
    with h5py.File(path, "r+") as f:
        o = f["fields/caption/offsets"]
        o[2] = 10 ** 12                         # a value far past the payload's end
    reader = READERS["hdf5"](str(path), sizes=(8,), encoding="raw", count=N, fields=kinds)
    with pytest.raises(OSError, match="offsets do not cut"):
        reader.column("caption")


@pytest.mark.parametrize("change, match", [
    (lambda m: m["fields"][0].update(kind="nope"), "fields\\[0\\].*not readable.*nope"),
    (lambda m: m["fields"][0].update(name="image"), "fields\\[0\\]"),
    (lambda m: m["fields"][1].update(name="caption"), "fields\\[1\\]"),
    (lambda m: m["fields"][1].update(params={"shape": [-1]}), "not readable.*shape"),
    (lambda m: m.update(version=2), "version"),
    (lambda m: m.update(fields=[]), "fields"),
])
def test_a_manifest_whose_fields_do_not_check_out_is_refused(tmp_path, change, match):
    src, labels = captioned_folder(tmp_path, per_class=2)
    out = tmp_path / "set"
    convert(src, str(out), sizes=[16], labels=labels, progress=False)
    m = json.loads((out / "manifest.json").read_text())
    change(m)
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ShardFormatError, match=match):
        fastdata.open(str(out))


def test_a_shard_without_a_column_its_manifest_lists_names_it(tmp_path):
    kinds = {"caption": field_of("text")}
    path = tmp_path / "shard.h5"
    _write(path, "hdf5", {}, [])
    reader = READERS["hdf5"](str(path), sizes=(8,), encoding="raw", count=N, fields=kinds)
    with pytest.raises(OSError, match="fields/caption/values is missing"):
        reader.column("caption")
    assert os.path.exists(path)
