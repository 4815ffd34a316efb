"""Conversion into an object store: a real S3 server (moto's, started here; Azure's emulator,
Azurite, for ``az://``), the real client; the same shards as a conversion into a folder,
resumed after a SIGKILL."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import fastdata
from fastdata.converters.convert import convert
from tests.helpers import (
    REPO,
    azure_server,
    children,
    detection_folder,
    plain_folder,
    running,
    s3_server,
)

pytest.importorskip("obstore", reason="obstore not installed (pip install "
                                      "'fastdata-shards[remote]')")
BUCKET = "fastdata-out"
OPTIONS = {"sizes": [8, 16], "shard_size": 4, "num_workers": 1, "progress": False}


@pytest.fixture(scope="module")
def s3():
    with s3_server(BUCKET) as client:
        yield client


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return plain_folder(tmp_path_factory.mktemp("bucket") / "src", per_class=8)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTDATA_CACHE", str(tmp_path / "cache"))


def _objects(client, prefix: str) -> dict[str, bytes]:
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/").get("Contents", [])
    return {o["Key"].rsplit("/", 1)[1]: client.get_object(Bucket=BUCKET, Key=o["Key"])[
        "Body"].read() for o in listed}


def test_azure_blob_storage_takes_and_serves_a_set(source, tmp_path):
    """``az://`` through the same client, against Azurite (Azure's emulator): the converted
    objects are the folder conversion's bytes, another node's lock (the store's conditional
    write) refuses a second conversion, and a loader reads what the local set gives."""
    import obstore

    from fastdata.converters import bucket
    from fastdata.outdir import FolderBusyError

    with azure_server("sets"):
        url = "az://sets/plain"
        up = convert(source, url, **OPTIONS)
        local = convert(source, str(tmp_path / "local"), **OPTIONS)
        assert [e["file_sha256"] for e in up["shards"]] == [
            hashlib.sha256((tmp_path / "local" / f["file"]).read_bytes()).hexdigest()
            for f in local["shards"]]
        obstore.put(obstore.store.from_url(url), bucket.LOCK, json.dumps(
            {"host": "another-node", "pid": 1, "token": "x", "beat": time.time()}).encode(),
            mode="create")
        with pytest.raises(FolderBusyError, match="process 1 on another-node"):
            convert(source, url, **OPTIONS, overwrite=True)
        remote_batches, local_batches = (
            [(x.clone(), y.clone()) for x, y in fastdata.Loader(
                p, batch_size=4, device="cpu", seed=2, num_workers=1, dtype="uint8",
                cache_dir=tmp_path / "read")] for p in (url, str(tmp_path / "local")))
        assert len(remote_batches) == 6
        for (a, b), (c, d) in zip(remote_batches, local_batches):
            assert torch.equal(a, c) and torch.equal(b, d)


@pytest.mark.parametrize("container,encoding", [("hdf5", "raw"), ("lmdb", "jpeg")])
def test_a_set_converted_into_a_bucket_is_the_set_converted_into_a_folder(
        s3, source, tmp_path, container, encoding):
    url = f"s3://{BUCKET}/{container}"
    up = convert(source, url, container=container, encoding=encoding, **OPTIONS)
    local = convert(source, str(tmp_path / "local"), container=container, encoding=encoding,
                    **OPTIONS)
    stored = _objects(s3, container)
    assert sorted(stored) == sorted(["manifest.json", "convert-journal.json"] +
                                    [e["file"] for e in local["shards"]])
    for e, f in zip(up["shards"], local["shards"]):
        data = (tmp_path / "local" / f["file"]).read_bytes()
        assert stored[e["file"]] == data        # byte for byte
        assert e == {**f, "file_sha256": hashlib.sha256(data).hexdigest()}
    assert json.loads(stored["manifest.json"]) == up
    assert {k: v for k, v in up.items() if k != "shards"} == \
        {k: v for k, v in local.items() if k != "shards"}
    ds = fastdata.open(url, cache_dir=tmp_path / "read")
    assert [ds[i][1] for i in range(len(ds))] == [fastdata.open(str(tmp_path / "local"))[i][1]
                                                    for i in range(len(ds))]
    # the staging folder went with the shards: nothing left on the disk
    assert os.listdir(tmp_path / "cache" / "uploads") == []


def test_a_detection_set_in_a_bucket_reads_as_from_a_folder(s3, tmp_path):
    """The boxes go up inside the shards; a reader fetches and checks them with the shards."""
    src, ann = detection_folder(tmp_path / "src", n=6)
    url = f"s3://{BUCKET}/detection"
    up = convert(src, url, coco=ann, **OPTIONS)
    local = convert(src, str(tmp_path / "local"), coco=ann, **OPTIONS)
    stored = _objects(s3, "detection")
    assert "annotations.bin" not in stored and up["fields"] == local["fields"]
    for e in local["shards"]:
        assert stored[e["file"]] == (tmp_path / "local" / e["file"]).read_bytes()
    kw = {"batch_size": 3, "crop": 16, "device": "cpu", "num_workers": 0, "seed": 1}
    remote = fastdata.Loader(url, cache_dir=tmp_path / "read", **kw)
    for (_, a), (_, b) in zip(remote, fastdata.Loader(str(tmp_path / "local"), **kw),
                              strict=True):
        assert all(torch.equal(x[k], y[k]) for x, y in zip(a, b) for k in x)


def test_a_large_shard_goes_up_in_parts(s3, tmp_path, monkeypatch):
    """A shard larger than a part (5 MiB here, the least S3 takes) is a multipart upload:
    the object is the file byte for byte, its SHA-256 the manifest's."""
    from fastdata.shards.stores import objectstore

    monkeypatch.setattr(objectstore, "PART", 5 << 20)
    src = plain_folder(tmp_path / "src", per_class=20)
    options = {**OPTIONS, "sizes": [256], "shard_size": 100}
    up = convert(src, f"s3://{BUCKET}/large", **options)
    local = convert(src, str(tmp_path / "local"), **options)
    (entry,) = up["shards"]
    data = (tmp_path / "local" / entry["file"]).read_bytes()
    assert len(data) > 2 * (5 << 20)
    assert _objects(s3, "large")[entry["file"]] == data
    etag = s3.head_object(Bucket=BUCKET, Key=f"large/{entry['file']}")["ETag"]
    assert etag.strip('"').endswith("-3")           # a multipart upload's, of 3 parts
    assert entry == {**local["shards"][0], "file_sha256": hashlib.sha256(data).hexdigest()}


def test_a_file_url_is_a_folder(source, tmp_path):
    out = tmp_path / "a set"
    convert(source, "file://" + str(out).replace(" ", "%20"), **OPTIONS)
    assert fastdata.open(str(out)).labels.tolist() == \
        fastdata.open(f"file://{out}", cache_dir=tmp_path / "read").labels.tolist()
    from fastdata.cli import main
    assert main(["-q", "convert", source, f"file://{out}", "--resume"]) == 0  # its options
    assert not (tmp_path / "cache" / "uploads").exists()        # no staging: a folder


def test_resume_overwrite_and_what_is_not_fastdatas(s3, source, tmp_path, caplog):
    url = f"s3://{BUCKET}/rules"
    done = convert(source, url, **OPTIONS)
    s3.put_object(Bucket=BUCKET, Key="rules/notes.txt", Body=b"mine")
    with pytest.raises(FileExistsError, match=f"output {url} is not empty; pass --overwrite"):
        convert(source, url, **OPTIONS)
    assert convert(source, url, resume=True, **OPTIONS) == done     # finished: nothing redone
    with pytest.raises(ValueError, match="holds a finished conversion with other options"):
        convert(source, url, resume=True, **{**OPTIONS, "sizes": [8]})
    # a finished set that lost a shard: redone from there
    s3.delete_object(Bucket=BUCKET, Key="rules/shard-00004.h5")
    assert convert(source, url, resume=True, **OPTIONS) == done
    assert convert(source, url, overwrite=True, **{**OPTIONS, "sizes": [8]})["sizes"] == [8]
    stored = _objects(s3, "rules")
    assert stored["notes.txt"] == b"mine"       # not fastdata's: left alone
    assert "that fastdata did not write (e.g. notes.txt)" in caplog.text


CHILD = """
import sys, time
from fastdata.converters import decode
from fastdata.converters.convert import convert
real = decode.prepare
decode.prepare = lambda p, o, *a: (time.sleep(0.05), real(p, o, *a))[1]
convert(sys.argv[1], sys.argv[2], sizes=[8, 16], shard_size=4, num_workers=1, progress=False)
"""


def _journaled(client, prefix: str) -> int:
    try:
        body = client.get_object(Bucket=BUCKET, Key=f"{prefix}/convert-journal.json")["Body"]
    except client.exceptions.NoSuchKey:
        return 0
    return len(json.loads(body.read())["shards"])


def test_a_conversion_killed_midway_resumes_into_the_uninterrupted_set(s3, source, tmp_path):
    url = f"s3://{BUCKET}/killed"
    with open(tmp_path / "stderr", "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", CHILD, source, url], cwd=REPO,
                                env={**os.environ, "PYTHONPATH": REPO}, stderr=err)
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None and _journaled(s3, "killed") < 2:
        time.sleep(0.05)
    assert proc.poll() is None, (tmp_path / "stderr").read_text()
    workers = children(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    deadline = time.time() + 20             # orphaned decode workers leave too
    while time.time() < deadline and any(map(running, workers)):
        time.sleep(0.05)
    before = _objects(s3, "killed")
    assert "manifest.json" not in before and 2 <= _journaled(s3, "killed") < 6
    with pytest.raises(OSError, match="manifest.json: not found"):
        fastdata.open(url, cache_dir=tmp_path / "read")

    from fastdata.cli import main
    assert main(["-q", "convert", source, url, "--resume"]) == 0   # the options: the journal's
    convert(source, f"s3://{BUCKET}/clean", **OPTIONS)
    resumed, whole = _objects(s3, "killed"), _objects(s3, "clean")
    assert json.loads(resumed.pop("manifest.json")) == json.loads(whole.pop("manifest.json"))
    assert resumed == whole         # every shard, and the journal, byte for byte
    assert main(["verify", url]) == 0


def test_two_nodes_converting_into_one_url_are_refused(s3, source, tmp_path, monkeypatch,
                                                       caplog):
    """A conversion on another node (its own cache, so its own staging lock) is refused while
    one is writing; once that one is killed, its lock is taken over (its process is gone)."""
    from fastdata.converters import bucket
    from fastdata.outdir import FolderBusyError

    url = f"s3://{BUCKET}/busy"
    with open(tmp_path / "stderr", "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", CHILD, source, url], cwd=REPO,
                                env={**os.environ, "PYTHONPATH": REPO}, stderr=err)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and proc.poll() is None and _journaled(s3, "busy") < 1:
            time.sleep(0.05)
        assert proc.poll() is None, (tmp_path / "stderr").read_text()
        monkeypatch.setenv("FASTDATA_CACHE", str(tmp_path / "other-node"))
        with pytest.raises(FolderBusyError, match=f"another conversion is writing there "
                                                  f"\\(process {proc.pid} on "):
            convert(source, url, **OPTIONS, resume=True)
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert bucket.LOCK in _objects(s3, "busy")          # left by the killed run
    convert(source, url, **OPTIONS, resume=True)
    assert "taking over the lock of a conversion that stopped" in caplog.text
    assert bucket.LOCK not in _objects(s3, "busy")
    s3.put_object(Bucket=BUCKET, Key=f"busy/{bucket.LOCK}", Body=json.dumps(
        {"host": "another-node", "pid": 1, "token": "x", "beat": time.time()}).encode())
    with pytest.raises(FolderBusyError, match="process 1 on another-node, last active"):
        convert(source, url, **OPTIONS, overwrite=True)
    s3.put_object(Bucket=BUCKET, Key=f"busy/{bucket.LOCK}", Body=json.dumps(
        {"host": "another-node", "pid": 1, "token": "x",
         "beat": time.time() - bucket.STALE_SECONDS - 1}).encode())
    convert(source, url, **OPTIONS, overwrite=True)     # a stale lock: taken over
    assert sorted(_objects(s3, "busy")) == sorted(
        ["manifest.json", bucket.JOURNAL] + [f"shard-{k:05d}.h5" for k in range(6)])
