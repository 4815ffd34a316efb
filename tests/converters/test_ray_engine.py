"""Conversion on a Ray cluster: a real local cluster (``ray start --head``), the CLI as a user
runs it, and the same shards as the local converter."""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

import fastdata
from fastdata.converters.convert import convert
from fastdata.shards.verify import verify
from tests.helpers import (
    captioned_folder,
    detection_folder,
    plain_folder,
    s3_server,
    source_forms,
)

pytest.importorskip("ray", reason="needs Ray (pip install 'fastdata-shards[ray]')")
RAY = os.path.join(os.path.dirname(sys.executable), "ray")
SHARD = 3           # positions [9, 12) are the broken files below: a range with none readable
# the cluster's token, for it and its clients (Ray asks for one on local clusters too)
ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
       "RAY_AUTH_TOKEN": secrets.token_hex(16)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cluster(port: int, cpus: int, temp_dir: str) -> subprocess.Popen:
    """A local Ray cluster (``ray start --head --block``) in a process group of its own, up
    once its port answers; ``os.killpg`` on it stops that cluster and nothing else. Its files
    (``ray_current_cluster`` among them, which a kill leaves behind) go under ``temp_dir``."""
    proc = subprocess.Popen([RAY, "start", "--head", "--block", f"--port={port}",
                             f"--num-cpus={cpus}", "--include-dashboard=false",
                             "--disable-usage-stats", "--node-ip-address=127.0.0.1"],
                            env={**ENV, "RAY_TMPDIR": temp_dir}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError(f"the Ray cluster did not start (exit status {proc.poll()})")


@pytest.fixture(scope="module")
def s3():
    """An S3 server (moto's), whose settings the cluster's workers have too."""
    pytest.importorskip("obstore", reason="obstore not installed")
    with s3_server("fastdata-ray") as client:
        yield client


@pytest.fixture(scope="module")
def cluster(s3):
    """The address of a local Ray cluster of 2 CPUs, stopped afterwards."""
    port = _free_port()
    ENV.update({k: v for k, v in os.environ.items() if k.startswith("AWS_")})
    ray_tmp = tempfile.mkdtemp(prefix="r", dir="/tmp")     # short: Ray's socket paths
    proc = start_cluster(port, 2, ray_tmp)
    try:
        yield f"127.0.0.1:{port}"
    finally:       # at once: nothing of it is kept (a graceful stop takes ~30 s)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=120)
        shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """21 images over 3 classes; 3 unreadable ones fill the range [9, 12), a fourth is alone
    in its range."""
    src = plain_folder(tmp_path_factory.mktemp("ray") / "src", per_class=7)
    files = sorted(os.path.join(c, n) for c in "abc" for n in os.listdir(os.path.join(src, c)))
    for k in (9, 10, 11, 16):
        with open(os.path.join(src, files[k]), "r+b") as f:     # a JPEG or PNG cut short
            f.truncate(60)
    return src


def _ray_convert(src, out, address, *extra):
    return subprocess.run([sys.executable, "-m", "fastdata.cli", "-q", "convert", src, str(out),
                           "--engine", "ray", "--address", address, "--size", "8,16",
                           "--shard-size", str(SHARD), *extra],
                          capture_output=True, text=True, timeout=240, env=ENV)


def _same_shards(a: dict, b: dict) -> None:
    """The same shards (names, starts, counts, content checksums, sizes) and records."""
    assert a == b


@pytest.mark.parametrize("container", ["hdf5", "lmdb"])
def test_ray_writes_the_shards_the_local_converter_writes(cluster, source, tmp_path, container):
    local = convert(source, str(tmp_path / "local"), container=container, sizes=[8, 16],
                    shard_size=SHARD, num_workers=1, progress=False)
    r = _ray_convert(source, tmp_path / "ray", cluster, "--container", container)
    assert r.returncode == 0, r.stderr
    with open(tmp_path / "ray" / "manifest.json") as f:
        on_ray = json.load(f)
    _same_shards(local, on_ray)
    assert len(on_ray["skipped"]) == 4 and on_ray["num_samples"] == 17
    # a shard per range of 3 source files; the unreadable range [9, 12) adds to the next
    assert [s["count"] for s in local["shards"]] == [3, 3, 3, 3, 2, 3]
    assert fastdata.open(str(tmp_path / "local")).shards[3].meta().sources == (9, 15)
    # the empty range's skips went into the next shard, as the local converter puts them
    a, b = fastdata.open(str(tmp_path / "local")), fastdata.open(str(tmp_path / "ray"))
    assert [r.meta() for r in a.shards] == [r.meta() for r in b.shards]
    assert verify(str(tmp_path / "ray")) == []
    assert sorted(os.listdir(tmp_path / "ray")) == sorted(os.listdir(tmp_path / "local"))
    for s in local["shards"]:       # byte for byte: a whole-file checksum is an address
        assert (tmp_path / "ray" / s["file"]).read_bytes() == \
            (tmp_path / "local" / s["file"]).read_bytes(), s["file"]


def test_a_set_of_fields_on_ray_is_the_local_one(cluster, tmp_path):
    """Captions, embeddings, keypoints and boxes go to the tasks with their files, the
    keypoints and boxes placed there as each picture's crop placed it: the same bytes, and the
    same notes on the boxes the crop cut away."""
    import csv

    src, plain = captioned_folder(tmp_path, per_class=3)
    labels = str(tmp_path / "pose.csv")
    corner = json.dumps([[0, 0, 0.04, 0.04], [0.4, 0.4, 0.6, 0.6]])
    with open(plain, newline="") as f, open(labels, "w", newline="") as g:
        rows = list(csv.reader(f))
        w = csv.writer(g)
        w.writerow([*rows[0], "pose", "objects"])
        for k, row in enumerate(rows[1:]):
            w.writerow([*row, json.dumps([{"nose": [k / 10, 0.5], "tail": [0.9, k / 10]}]),
                        corner])
    local = convert(src, str(tmp_path / "local"), sizes=[8, 16], shard_size=SHARD,
                    labels=labels, fields={"pose": "keypoints", "objects": "boxes"},
                    num_workers=1, progress=False)
    pose = fastdata.open(str(tmp_path / "local")).field_values("pose", [0, 3])
    assert pose[0][0, 0, 2] == 0 and pose[1][0, 0, 2] == 2     # the crop cut the first away
    assert any("objects: 1 of its 2 boxes" in s["reason"] for s in local["skipped"])
    r = _ray_convert(src, tmp_path / "ray", cluster, "--labels", labels, "--field",
                     "pose=keypoints", "--field", "objects=boxes")
    assert r.returncode == 0, r.stderr
    with open(tmp_path / "ray" / "manifest.json") as f:
        on_ray = json.load(f)
    assert on_ray["fields"] == local["fields"] and on_ray["shards"] == local["shards"]
    assert on_ray["skipped"] == local["skipped"]
    for s in local["shards"]:
        assert (tmp_path / "ray" / s["file"]).read_bytes() == \
            (tmp_path / "local" / s["file"]).read_bytes(), s["file"]


@pytest.mark.parametrize("kind", ["coco", "masks"])
def test_a_detection_or_segmentation_set_on_ray_is_the_local_one(cluster, tmp_path, kind):
    """The shards on the cluster, with a detection set's boxes or a segmentation set's class
    maps: byte for byte the local conversion's."""
    src, ann = detection_folder(tmp_path / "src", n=7, maps=kind == "masks")
    given = ann if kind == "coco" else f"{src}-maps"
    local = convert(src, str(tmp_path / "local"), sizes=[8, 16], shard_size=SHARD,
                    num_workers=1, progress=False, **{kind: given})
    r = _ray_convert(src, tmp_path / "ray", cluster, f"--{kind}", given)
    assert r.returncode == 0, r.stderr
    with open(tmp_path / "ray" / "manifest.json") as f:
        assert json.load(f) == local
    assert local["fields"][0]["name"] == "label"
    for name in [s["file"] for s in local["shards"]]:
        assert (tmp_path / "ray" / name).read_bytes() == (tmp_path / "local" / name).read_bytes()


@pytest.fixture(scope="module")
def forms(tmp_path_factory):
    """The same photos as tars, a gzipped tar, parquet and Hugging Face datasets."""
    return source_forms(tmp_path_factory.mktemp("forms"), per_class=3)


def _options(options: dict) -> list[str]:
    """A source's options as the command line gives them."""
    return [a for n, k in (options.get("fields") or {}).items() for a in ("--field", f"{n}={k}")] \
        + (["--split", options["split"]] if "split" in options else [])


def _local_and_ray_alike(src: str, options: dict, cluster: str, tmp_path) -> None:
    """``src`` converted by the local engine and on the cluster: the same manifest and the
    same shards, byte for byte."""
    local = convert(src, str(tmp_path / "local"), sizes=[8, 16], shard_size=SHARD,
                    num_workers=1, progress=False, **options)
    r = _ray_convert(src, tmp_path / "ray", cluster, *_options(options))
    assert r.returncode == 0, r.stderr
    with open(tmp_path / "ray" / "manifest.json") as f:
        assert json.load(f) == local
    for s in local["shards"]:
        assert (tmp_path / "ray" / s["file"]).read_bytes() == \
            (tmp_path / "local" / s["file"]).read_bytes(), s["file"]


@pytest.mark.parametrize("form", ["tars", "tar.gz", "parquet", "hf", "hub"])
def test_a_source_on_ray_is_the_local_conversion_byte_for_byte(cluster, forms, form, tmp_path):
    """Each task reads its range's part of the source's files (a tar's byte range, a
    parquet file's row groups, an Arrow file's cells): the local engine's shards."""
    _local_and_ray_alike(*forms[form], cluster, tmp_path)


def test_tars_in_a_bucket_on_ray_are_the_local_conversion(cluster, s3, forms, tmp_path):
    """The tasks read their ranges of the tars from the bucket, by byte range."""
    src, options = forms["tars"]
    folder = os.path.dirname(src)
    for name in sorted(os.listdir(folder)):
        s3.upload_file(os.path.join(folder, name), "fastdata-ray", f"tars/{name}")
    _local_and_ray_alike("s3://fastdata-ray/tars/" + os.path.basename(src), options, cluster,
                         tmp_path)


def test_ray_tasks_upload_the_shards_the_local_converter_writes(cluster, s3, source, tmp_path,
                                                                 monkeypatch):
    monkeypatch.setitem(ENV, "FASTDATA_CACHE", str(tmp_path / "cache"))
    local = convert(source, str(tmp_path / "local"), sizes=[8, 16], shard_size=SHARD, num_workers=1,
                    progress=False)
    r = _ray_convert(source, "s3://fastdata-ray/set", cluster)
    assert r.returncode == 0, r.stderr
    up = json.loads(s3.get_object(Bucket="fastdata-ray", Key="set/manifest.json")["Body"].read())
    for e, f in zip(up["shards"], local["shards"]):
        data = (tmp_path / "local" / f["file"]).read_bytes()
        assert e == {**f, "file_sha256": hashlib.sha256(data).hexdigest()}
        assert s3.get_object(Bucket="fastdata-ray", Key=f"set/{e['file']}")["Body"].read() == data
    assert len(up["shards"]) == len(local["shards"]) and up["skipped"] == local["skipped"]
    assert os.listdir(tmp_path / "cache" / "uploads") == []     # each went once it was up


def test_ray_resumes_what_a_killed_run_left(cluster, source, tmp_path):
    """A driver killed after some shards were placed leaves them, no manifest, and the
    temporary files of tasks in flight: ``--resume`` keeps the shards, clears the rest and
    finishes, on either engine, with the shards of an uninterrupted run."""
    whole = convert(source, str(tmp_path / "whole"), sizes=[8, 16], shard_size=SHARD,
                    num_workers=1, progress=False)
    for engine, out in (("ray", tmp_path / "r"), ("local", tmp_path / "l")):
        r = _ray_convert(source, out, cluster)
        assert r.returncode == 0, r.stderr
        os.remove(out / "manifest.json")
        names = sorted(n for n in os.listdir(out) if n.startswith("shard-"))
        for n in names[3:]:
            os.remove(out / n)
        shutil.copy(out / names[0], out / (names[-1] + ".tmp-a1b2c3d4"))  # a task's, cut off
        if engine == "ray":
            r = _ray_convert(source, out, cluster, "--resume")
            assert r.returncode == 0, r.stderr
            with open(out / "manifest.json") as f:
                resumed = json.load(f)
        else:
            resumed = convert(source, str(out), sizes=[8, 16], shard_size=SHARD, num_workers=1,
                              resume=True, progress=False)
        _same_shards(whole, resumed)
        assert not [n for n in os.listdir(out) if ".tmp" in n], os.listdir(out)
        assert verify(str(out)) == []


def test_a_killed_driver_is_resumed_with_the_shards_it_placed(cluster, tmp_path):
    """SIGKILL to the driver once it has placed a shard; ``--resume`` on the Ray engine then
    finishes with the shards of an uninterrupted local run."""
    src = plain_folder(tmp_path / "src", per_class=40, size=(400, 300))
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "fastdata.cli", "-q", "convert", src, str(out), "--engine",
           "ray", "--address", cluster, "--size", "8,128", "--shard-size", "4"]
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and not (out / "shard-00001.h5").exists():
        time.sleep(0.01)
    if proc.poll() is not None:
        pytest.skip("the conversion finished before its driver could be killed")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert not (out / "manifest.json").exists()
    r = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=240, env=ENV)
    assert r.returncode == 0, r.stderr
    with open(out / "manifest.json") as f:
        resumed = json.load(f)
    whole = convert(src, str(tmp_path / "whole"), sizes=[8, 128], shard_size=4, num_workers=1,
                    progress=False)
    _same_shards(whole, resumed)
    assert not [n for n in os.listdir(out) if ".tmp" in n], os.listdir(out)


def _running_tasks() -> list[int]:
    """Ray workers running a conversion task (Ray names the process after the task)."""
    found = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if f.read().startswith(b"ray::convert_range"):
                    found.append(int(d))
        except OSError:
            pass
    return found


def test_a_task_whose_worker_dies_is_retried(cluster, tmp_path):
    src = plain_folder(tmp_path / "src", per_class=40, size=(400, 300))
    out = tmp_path / "retried"
    cmd = [sys.executable, "-m", "fastdata.cli", "-q", "convert", src, str(out), "--engine",
           "ray", "--address", cluster, "--size", "8,128", "--shard-size", "4"]
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    deadline, killed = time.time() + 120, []
    while time.time() < deadline and proc.poll() is None and not killed:
        for pid in _running_tasks():
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        time.sleep(0.005)
    if not killed:
        pytest.skip("the conversion finished before a task's worker could be killed")
    assert proc.wait(timeout=240) == 0, proc.stderr.read()
    with open(out / "manifest.json") as f:
        retried = json.load(f)
    whole = convert(src, str(tmp_path / "whole"), sizes=[8, 128], shard_size=4, num_workers=1,
                    progress=False)
    _same_shards(whole, retried)
    assert verify(str(out)) == []
    assert not [n for n in os.listdir(out) if ".tmp" in n], os.listdir(out)  # the dead task's


def test_a_task_that_raises_fails_the_conversion_naming_the_file(cluster, source, tmp_path):
    r = _ray_convert(source, tmp_path / "raise", cluster, "--on-error", "raise")
    assert r.returncode == 1
    errors = [line for line in r.stderr.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 1 and "cannot read 'b/img_002.jpg'" in errors[0], r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "--resume" not in r.stderr
    assert not (tmp_path / "raise" / "manifest.json").exists()


def test_engine_arguments_are_checked(source, tmp_path):
    with pytest.raises(ValueError, match="engine='spark' is not valid; choose one of local, ray"):
        convert(source, str(tmp_path / "x"), engine="spark")
    with pytest.raises(ValueError, match="address='h:1' is for engine='ray'"):
        convert(source, str(tmp_path / "x"), address="h:1")


def test_an_address_where_no_cluster_listens_fails_in_one_line(source, tmp_path):
    """Ray retried such an address for nine minutes and more."""
    port = _free_port()         # nothing listens there
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "fastdata.cli", "-q", "convert", source,
                        str(tmp_path / "o"), "--size", "16", "--engine", "ray", "--address",
                        f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=120)
    assert time.monotonic() - t < 60
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert f"no Ray cluster answers at 127.0.0.1:{port}" in lines[0]


def test_a_file_naming_a_cluster_that_is_gone_is_not_joined(source, tmp_path):
    """A ``ray_current_cluster`` left by a cluster killed without ``ray stop``: without
    ``--address`` the conversion starts a cluster of its own (Ray joined the dead one and
    waited without end); ``--address auto`` names the file and the address in one line."""
    ray_tmp = tempfile.mkdtemp(prefix="r", dir="/tmp")     # short: Ray's socket paths
    try:
        os.makedirs(os.path.join(ray_tmp, "ray"))
        stale = os.path.join(ray_tmp, "ray", "ray_current_cluster")
        with open(stale, "w") as f:
            f.write(f"127.0.0.1:{_free_port()}")
        env = {k: v for k, v in ENV.items() if k != "RAY_ADDRESS"}
        env.update(RAY_TMPDIR=ray_tmp)
        cmd = [sys.executable, "-m", "fastdata.cli", "-q", "convert", source]
        t = time.monotonic()
        r = subprocess.run([*cmd, str(tmp_path / "own"), "--size", "16", "--engine", "ray"],
                           capture_output=True, text=True, timeout=240, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        assert fastdata.open(str(tmp_path / "own")).manifest["num_samples"] == 17
        r = subprocess.run([*cmd, str(tmp_path / "auto"), "--size", "16", "--engine", "ray",
                            "--address", "auto"], capture_output=True, text=True, timeout=120,
                           env=env)
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert r.returncode == 1 and len(lines) == 1, r.stderr
        assert f"{stale} (the latest cluster's address, for --address auto) names" in lines[0]
        assert time.monotonic() - t < 200
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
