"""The node cache of remote shards attacked: folders that are not its own, forged stamps,
damaged downloads of a set's own files, and ``verify`` of a URL; a real HTTP server with
faults on demand and the real command line."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

import fastdata
from fastdata.format import ShardFormatError
from fastdata.shards.cache import ShardCache, shard_key
from tests.helpers import detection_folder, earlier_detection_set, shard_files

pytest.importorskip("obstore", reason="obstore not installed (pip install "
                                      "'fastdata-shards[remote]')")


def _cli(*args, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fastdata.cli", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **env})


def test_a_folder_that_is_not_a_cache_is_never_written_nor_cleared(tmp_path):
    other = tmp_path / "other"
    (other / "objects").mkdir(parents=True)
    keyish = other / "objects" / ("f-" + "0" * 64)
    keyish.write_bytes(b"someone else's")
    (other / "notes.txt").write_text("mine")
    r = _cli("cache", str(other), "--clear")
    assert r.returncode == 2 and "is not a fastdata cache" in r.stderr, r.stderr
    assert keyish.read_bytes() == b"someone else's" and sorted(os.listdir(other)) == [
        "notes.txt", "objects"]
    with pytest.raises(OSError, match="is not a fastdata cache"):
        ShardCache(other)
    assert _cli("cache", str(tmp_path / "none")).stdout.strip().endswith("no cache here")
    assert not (tmp_path / "none").exists()
    with pytest.raises(ValueError, match="cache_dir='' is not valid"):
        fastdata.open("file:///nothing", cache_dir="")


def test_links_in_place_of_the_cache_or_its_folders_are_refused(local_set, tmp_path):
    url = "file://" + local_set
    fastdata.open(url, cache_dir=tmp_path / "real")
    os.symlink(tmp_path / "real", tmp_path / "link")
    with pytest.raises(OSError, match="is a link or not a folder: refused"):
        fastdata.open(url, cache_dir=tmp_path / "link")
    sets = tmp_path / "real" / "sets"
    os.rename(sets, tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", sets)
    with pytest.raises(OSError, match="sets is not a folder of its own: refused"):
        fastdata.open(url, cache_dir=tmp_path / "real")


def test_a_forged_stamp_on_a_link_fetches_the_shard_again(http_set, local_set, tmp_path):
    """A link in place of a cached shard, its stamp forged to match what the link names:
    the shard is fetched again, what the link named is left as it was."""
    server, url = http_set
    want = fastdata.open(local_set).read_batch(range(24), size=16)
    fastdata.open(url, cache_dir=tmp_path / "c").read_batch(range(24), size=16)
    key = shard_key(fastdata.open(local_set).manifest["shards"][0], "hdf5")
    outside = tmp_path / "outside"
    outside.write_bytes(open(tmp_path / "c" / "objects" / key, "rb").read())
    os.remove(tmp_path / "c" / "objects" / key)
    os.symlink(outside, tmp_path / "c" / "objects" / key)
    st = os.stat(outside)
    (tmp_path / "c" / "stamps" / key).write_text(f"{st.st_size} {st.st_ino} {st.st_mtime_ns}")
    first = shard_files(local_set)[0]
    gets = server.gets[first]
    assert np.array_equal(fastdata.open(url, cache_dir=tmp_path / "c")
                          .read_batch(range(24), size=16), want)
    assert server.gets[first] == gets + 1 and outside.read_bytes()[:4] == b"\x89HDF"
    assert not os.path.islink(tmp_path / "c" / "objects" / key)


def test_a_damaged_download_of_the_manifest_is_fetched_again(http_set, tmp_path, caplog):
    server, url = http_set
    server.faults["manifest.json"] = ["corrupt"]
    with caplog.at_level(logging.WARNING, "fastdata"):
        assert len(fastdata.open(url, cache_dir=tmp_path)) == 24
    assert server.gets["manifest.json"] == 2 and "fetched again" in caplog.text
    server.faults["manifest.json"] = ["corrupt"] * 2
    with pytest.raises(ShardFormatError, match=f"{url}/manifest.json: .*fetched twice: the "
                                               f"store's copy is damaged; upload the set again"):
        fastdata.open(url, cache_dir=tmp_path)


def test_a_damaged_download_of_the_annotations_is_fetched_again(http_set, tmp_path):
    server, url = http_set
    src, ann = detection_folder(tmp_path / "src", n=4)
    earlier_detection_set(src, str(tmp_path / "det"), ann, sizes=[32])
    server.root = str(tmp_path / "det")
    want = fastdata.open(str(tmp_path / "det")).annotations.boxes
    server.faults["annotations.bin"] = ["corrupt"]
    ds = fastdata.open(url, cache_dir=tmp_path / "c")
    assert np.array_equal(ds.annotations.boxes, want)
    assert server.gets["annotations.bin"] == 2


def test_verify_of_a_url_names_the_damaged_shards_and_the_fix(http_set, local_set, tmp_path):
    server, url = http_set
    second = shard_files(local_set)[1]
    server.faults[second] = ["corrupt"] * 2             # damaged twice: the store's copy
    r = _cli("verify", url, FASTDATA_CACHE=str(tmp_path))
    assert r.returncode == 1, r.stderr
    damaged = [x for x in r.stdout.splitlines() if x.startswith("DAMAGED")]
    assert len(damaged) == 1 and damaged[0].startswith(f"DAMAGED {second}: "), r.stdout
    assert f"the store's copies of {second} are damaged: upload them again" in r.stdout
    assert "Traceback" not in r.stderr and "not a shard set" not in r.stderr + r.stdout
    assert json.loads(open(os.path.join(local_set, "manifest.json")).read())["num_samples"] == 24
