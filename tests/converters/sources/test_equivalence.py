"""Every source of the same photos (tars, a gzipped tar, WebDataset's own tars, parquet, a
Hugging Face dataset in each of its layouts) converts into the set that their folder and
labels file convert into, sample by sample: images, labels, captions and embeddings; from
disk and from real S3, Google Cloud Storage and Azure servers (moto's, fake-gcs-server,
Azurite, through the real client)."""
from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest

import fastdata
from fastdata.cli import main as cli
from fastdata.converters.convert import convert
from tests.helpers import azure_server, gcs_server, gcs_upload, s3_server, source_forms

FORMS = ["tar", "tar.gz", "tars", "parquet", "hf", "hf-dict", "hub"]
#: where each form keeps the caption (a tar's member is named by its extension)
CAPTION = {"tar": "txt", "tar.gz": "txt", "tars": "txt"}


@pytest.fixture(scope="module")
def forms(tmp_path_factory):
    return source_forms(tmp_path_factory.mktemp("sources"))


@pytest.fixture(scope="module")
def reference(forms, tmp_path_factory):
    src, options = forms["folder"]
    out = str(tmp_path_factory.mktemp("ref") / "set")
    convert(src, out, sizes=[8, 16], progress=False, shard_size=7, **options)
    return contents(out, "caption")


def contents(out: str, caption: str, **kw) -> list[tuple]:
    """Each sample's images at every size, label index, caption and embedding, in order."""
    ds = fastdata.open(out, **kw)
    at = {size: fastdata.open(out, size=size, **kw) for size in ds.sizes}
    rows = []
    for i in range(len(ds)):
        s = ds[i]
        images = tuple(at[size][i]["image"].tobytes() for size in ds.sizes)
        rows.append((images, int(s["label"]), s[caption], np.asarray(s["emb"]).tolist()))
    return rows


@pytest.mark.parametrize("form", FORMS)
def test_each_source_gives_the_folders_samples(forms, reference, form, tmp_path):
    src, options = forms[form]
    out = str(tmp_path / "set")
    m = convert(src, out, sizes=[8, 16], progress=False, shard_size=7, **options)
    assert m["num_samples"] == len(reference) == 24 and m["skipped"] == []
    assert contents(out, CAPTION.get(form, "caption")) == reference
    ds = fastdata.open(out)
    assert ds.fields["emb"].kind == "array" and ds.fields["emb"].shape == (8,)
    assert ds.fields[CAPTION.get(form, "caption")].kind == "text"
    if form in ("parquet", "hf", "hf-dict", "hub"):
        assert ds.classes == ["a", "b", "c"]        # the labels' names, or the ClassLabel's


def test_the_command_line_finds_each_kind_by_its_look(forms, tmp_path, caplog):
    for form, kind in (("tar", "webdataset"), ("tars", "webdataset"), ("parquet", "parquet"),
                       ("hf", "hf"), ("hub", "parquet")):
        src, options = forms[form]
        out = tmp_path / form
        args = ["-q", "convert", src, str(out), "--size", "8"]
        args += [a for n, k in (options.get("fields") or {}).items()
                 for a in ("--field", f"{n}={k}")]
        args += ["--split", options["split"]] if "split" in options else []
        assert cli(args) == 0, caplog.text
        m = json.loads((out / "manifest.json").read_text())
        assert m["source_kind"] == kind and m["num_samples"] == 24
    # a hub folder of two splits, without --split: the splits named
    assert cli(["-q", "convert", forms["hub"][0], str(tmp_path / "x"), "--size", "8"]) == 2
    assert "holds the splits test, train: choose one with --split" in caplog.text
    assert not (tmp_path / "x").exists()


def test_a_resumed_run_reads_the_source_it_was_started_with(forms, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="fastdata")
    src, _ = forms["hf-dict"]
    out = tmp_path / "o"
    assert cli(["-q", "convert", src, str(out), "--size", "8", "--split", "test"]) == 0
    first = (out / "manifest.json").read_bytes()
    assert cli(["convert", src, str(out), "--resume"]) == 0
    assert "--split test" in caplog.text and (out / "manifest.json").read_bytes() == first
    assert json.loads(first)["num_samples"] == 3


@pytest.fixture(scope="module")
def bucket(forms):
    """The tars and parquet files in a real S3 server (moto's)."""
    pytest.importorskip("obstore", reason="obstore not installed")
    with s3_server("fastdata-sources") as client:
        for form, prefix in (("tar", "one"), ("tar.gz", "one"), ("parquet", "pq")):
            path = forms[form][0]
            client.upload_file(path, "fastdata-sources", f"{prefix}/{os.path.basename(path)}")
        folder = os.path.dirname(forms["tars"][0])
        for name in sorted(os.listdir(folder)):
            client.upload_file(os.path.join(folder, name), "fastdata-sources", f"wds/{name}")
        hub = os.path.join(forms["hub"][0], "data")
        for name in sorted(os.listdir(hub)):
            client.upload_file(os.path.join(hub, name), "fastdata-sources", f"hub/{name}")
        yield client


@pytest.mark.parametrize("url,form", [
    ("s3://fastdata-sources/one/data.tar", "tar"),
    ("s3://fastdata-sources/one/data.tar.gz", "tar.gz"),
    ("s3://fastdata-sources/wds/shard-{000000..000002}.tar", "tars"),
    ("s3://fastdata-sources/wds", "tars"),
    ("s3://fastdata-sources/pq/data.parquet", "parquet"),
    ("s3://fastdata-sources/hub", "hub"),
])
def test_a_source_in_a_bucket_converts_as_on_disk(forms, reference, bucket, url, form,
                                                  tmp_path):
    options = forms[form][1]
    out = str(tmp_path / "set")
    m = convert(url, out, sizes=[8, 16], progress=False, shard_size=7,
                cache_dir=tmp_path / "cache", **options)
    assert m["source"] == url and m["skipped"] == []
    assert contents(out, CAPTION.get(form, "caption")) == reference
    # read where it lies, never copied to the disk
    assert not [n for _, _, names in os.walk(tmp_path) for n in names
                if n.endswith((".tar", ".gz", ".parquet"))]


def test_a_bucket_source_into_a_bucket(forms, reference, bucket, tmp_path):
    url = "s3://fastdata-sources/wds/shard-{000000..000002}.tar"
    m = convert(url, "s3://fastdata-sources/sets/from-tars", sizes=[8, 16], progress=False,
                shard_size=7, cache_dir=tmp_path / "cache", fields={"emb": "array"})
    assert m["num_samples"] == 24
    local = convert(forms["tars"][0], str(tmp_path / "local"), sizes=[8, 16], progress=False,
                    shard_size=7, fields={"emb": "array"})
    # the same samples in the same shards (each shard also records its job, which names
    # where the source is)
    assert [(e["file"], e["count"], e["sha256"]) for e in m["shards"]] == \
        [(e["file"], e["count"], e["sha256"]) for e in local["shards"]]
    assert contents("s3://fastdata-sources/sets/from-tars", "txt",
                    cache_dir=str(tmp_path / "read")) == reference


@pytest.mark.parametrize("name,form", [("shard-{000000..000002}.tar", "tars"),
                                       ("data.parquet", "parquet"), ("data.tar", "tar")])
def test_a_source_on_a_plain_http_server_is_read_by_range(forms, reference, name, form,
                                                          tmp_path):
    """A server that cannot list: each file by its URL or a brace pattern's, its size from a
    HEAD, its bytes by range."""
    import shutil
    import threading

    from tests.helpers import FileServer

    pytest.importorskip("obstore", reason="obstore not installed")
    served = tmp_path / "served"
    served.mkdir()
    for path in (forms["tar"][0], forms["parquet"][0]):
        shutil.copy(path, served)
    wds = os.path.dirname(forms["tars"][0])
    for n in os.listdir(wds):
        shutil.copy(os.path.join(wds, n), served)
    server = FileServer(str(served), ranges=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/data/{name}"
        out = str(tmp_path / "set")
        m = convert(url, out, sizes=[8, 16], progress=False, shard_size=7, **forms[form][1])
        assert m["skipped"] == [] and contents(out, CAPTION.get(form, "caption")) == reference
        with pytest.raises(ValueError, match="a plain HTTP server cannot list a folder"):
            convert(url.rsplit("/", 1)[0], str(tmp_path / "x"), progress=False,
                    source="webdataset")
    finally:
        server.shutdown()


@pytest.mark.parametrize("scheme", ["gs", "az"])
def test_a_source_in_google_cloud_storage_or_azure_converts_as_on_disk(forms, reference, scheme,
                                                                      tmp_path):
    """Tars by their folder (listed) and a parquet file, through the same client as S3's."""
    import shutil

    obstore = pytest.importorskip("obstore", reason="obstore not installed")
    pq = tmp_path / "pq"
    pq.mkdir()
    shutil.copy(forms["parquet"][0], pq)
    folders = {"wds": os.path.dirname(forms["tars"][0]), "pq": str(pq)}
    server = gcs_server("sources") if scheme == "gs" else azure_server("sources")
    with server as endpoint:
        for prefix, folder in folders.items():
            if scheme == "gs":
                gcs_upload(endpoint, "sources", folder, prefix)
            else:
                store = obstore.store.from_url(f"az://sources/{prefix}")
                for name in sorted(os.listdir(folder)):
                    with open(os.path.join(folder, name), "rb") as f:
                        obstore.put(store, name, f.read())
        for url, form in ((f"{scheme}://sources/wds", "tars"),
                          (f"{scheme}://sources/pq/data.parquet", "parquet")):
            out = str(tmp_path / form)
            m = convert(url, out, sizes=[8, 16], progress=False, shard_size=7,
                        cache_dir=tmp_path / "cache", **forms[form][1])
            assert m["source"] == url and m["skipped"] == []
            assert contents(out, CAPTION.get(form, "caption")) == reference
