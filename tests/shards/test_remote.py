"""Shard sets in an object store: a real S3 server (moto's, started here), real GCS and Azure
servers (fake-gcs-server, Azurite) and a real HTTP server with faults on demand, read with the
real client (obstore) through the node-local cache."""
from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch
from PIL import Image

import fastdata
from fastdata.converters.convert import convert
from fastdata.format import ShardFormatError
from fastdata.shards.cache import ShardCache, shard_key
from fastdata.shards.stores import objectstore, redact
from tests.helpers import (
    AZURE_ACCOUNT,
    AZURE_KEY,
    REPO,
    FileServer,
    azure_server,
    children,
    fault_proxy,
    free_port,
    gcs_server,
    gcs_upload,
    ids_of,
    in_private_mounts,
    plain_folder,
    plain_loader,
    s3_server,
    seen,
    shard_files,
)

pytest.importorskip("obstore", reason="obstore not installed (pip install "
                                      "'fastdata-shards[remote]')")


# ---------------------------------------------------------------- a real S3 server
@pytest.fixture(scope="module")
def s3(local_set):
    """moto's S3 server, the set uploaded under s3://fastdata-test/sets/a."""
    with s3_server("fastdata-test") as client:
        for f in os.listdir(local_set):
            client.upload_file(os.path.join(local_set, f), "fastdata-test", f"sets/a/{f}")
        yield "s3://fastdata-test/sets/a"


def test_a_set_in_s3_reads_as_the_local_set_does(s3, local_set, tmp_path):
    ds = fastdata.open(s3, cache_dir=tmp_path)
    assert repr(ds).startswith("ShardSet('s3://fastdata-test/sets/a', 24 samples")
    remote_batches, local_batches = (
        [(x.clone(), y.clone()) for x, y in plain_loader(p, seed=3, num_workers=2)]
        for p in (ds, local_set))
    assert len(remote_batches) == 6
    for (a, b), (c, d) in zip(remote_batches, local_batches):
        assert torch.equal(a, c) and torch.equal(b, d)
    assert len(os.listdir(tmp_path / "objects")) == len(shard_files(local_set))


def test_the_command_line_takes_a_url(s3, tmp_path, monkeypatch, capsys):
    from fastdata.cli import main

    monkeypatch.setenv("FASTDATA_CACHE", str(tmp_path))
    assert main(["info", s3]) == 0
    assert "24" in capsys.readouterr().out
    assert main(["verify", s3]) == 0
    assert main(["train", s3, "--model", "tiny", "--epochs", "1", "--batch-size", "4",
                 "--device", "cpu", "--workers", "0", "--shuffle-window", "2",
                 "--shard-split", "1", "--log-every", "0"]) == 0


def test_info_of_a_url_reads_the_manifest_only_and_names_the_url(s3, local_set, tmp_path,
                                                                   monkeypatch, capsys):
    """No shard is downloaded (a TB set would be a TB): the classes' counts come from the
    manifest; an older set's manifest without them gives the class names alone."""
    import json

    from fastdata.cli import main

    monkeypatch.setenv("FASTDATA_CACHE", str(tmp_path))
    assert main(["info", s3]) == 0
    out = capsys.readouterr().out
    assert out.startswith("s3://fastdata-test/sets/a  (from ") and str(tmp_path) not in out
    assert "in the store" in out and "page cache" not in out
    assert [line.split() for line in out.splitlines() if line.startswith("    ")] == [
        ["a", "8"], ["b", "8"], ["c", "8"]]
    with open(os.path.join(local_set, "manifest.json")) as f:
        older = json.load(f)
    del older["class_counts"]
    client = __import__("boto3").client("s3")
    for f in os.listdir(local_set):
        body = json.dumps(older).encode() if f == "manifest.json" else \
            open(os.path.join(local_set, f), "rb").read()
        client.put_object(Bucket="fastdata-test", Key=f"sets/older/{f}", Body=body)
    assert main(["info", "s3://fastdata-test/sets/older"]) == 0
    out = capsys.readouterr().out
    assert "does not count them" in out
    assert [line.split() for line in out.splitlines() if line.startswith("    ")] == [
        ["a"], ["b"], ["c"]]
    assert os.listdir(tmp_path / "objects") == []


def test_store_errors_say_what_to_set(s3, tmp_path, monkeypatch, caplog):
    """A bucket that does not exist, an endpoint without a scheme (a panic of the client's)
    and no credentials: each one line naming the URL, what is wrong and what to set."""
    from fastdata.cli import main

    monkeypatch.setenv("FASTDATA_CACHE", str(tmp_path / "cache"))
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    missing = (r"s3://nobucket/set: the bucket 'nobucket' does not exist at "
               + endpoint.replace(".", r"\.") + r" \(AWS_ENDPOINT_URL\): make it")
    with pytest.raises(FileNotFoundError, match=missing):
        fastdata.open("s3://nobucket/set")
    src = plain_folder(tmp_path / "src", per_class=2)
    assert main(["-q", "convert", src, "s3://nobucket/set", "--size", "16"]) == 2
    assert "s3://nobucket/set: the bucket 'nobucket' does not exist" in caplog.text
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint.removeprefix("http://"))
    with pytest.raises(ValueError, match=r"AWS_ENDPOINT_URL='127.0.0.1:\d+' is not a URL: give "
                                         r"its scheme and host, e.g. AWS_ENDPOINT_URL=http://"):
        fastdata.open(s3)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    # the metadata service a cloud machine has, here a port nothing listens on
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    start = time.monotonic()
    with pytest.raises(OSError, match=r"s3://fastdata-test/sets/a/manifest.json: reading "
                                      r"failed: no credentials are configured.*set "
                                      r"AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"):
        fastdata.open(s3)
    assert time.monotonic() - start < 60


def test_a_missing_set_and_credentials_in_messages(s3, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"s3://fastdata-test/nothing/manifest.json: "
                                                r"not found"):
        fastdata.open("s3://fastdata-test/nothing", cache_dir=tmp_path)
    with pytest.raises(OSError) as e:
        fastdata.open("https://user:hunter2@127.0.0.1:1/set?X-Amz-Signature=s3cr3t",
                      cache_dir=tmp_path)
    text = str(e.value)
    assert "https://127.0.0.1:1/set/manifest.json" in text
    assert "hunter2" not in text and "s3cr3t" not in text and "user" not in text


def test_a_set_in_google_cloud_storage_reads_as_the_local_set_does(local_set, tmp_path,
                                                                    monkeypatch):
    """``gs://`` through the same client, against fake-gcs-server (GCS's API): the loader's
    batches, ``verify`` on the command line, a missing object named."""
    from fastdata.cli import main

    with gcs_server("fastdata-gcs") as endpoint:
        gcs_upload(endpoint, "fastdata-gcs", local_set, "sets/a")
        url = "gs://fastdata-gcs/sets/a"
        remote_batches, local_batches = (
            [(x.clone(), y.clone()) for x, y in plain_loader(p, seed=5, num_workers=2,
                                                             cache_dir=tmp_path / "c")]
            for p in (url, local_set))
        assert len(remote_batches) == 6
        for (a, b), (c, d) in zip(remote_batches, local_batches):
            assert torch.equal(a, c) and torch.equal(b, d)
        monkeypatch.setenv("FASTDATA_CACHE", str(tmp_path / "cli"))
        assert main(["verify", url]) == 0
        with pytest.raises(FileNotFoundError, match=r"gs://fastdata-gcs/nothing/manifest.json: "
                                                    r"not found"):
            fastdata.open("gs://fastdata-gcs/nothing", cache_dir=tmp_path / "c")


def test_an_azure_account_at_a_plain_http_endpoint_is_read(local_set, tmp_path):
    """``az://`` at an endpoint named by ``AZURE_STORAGE_ENDPOINT`` with the account's name and
    key (an on-premise server, not the emulator's switch), against Azurite: plain HTTP is
    allowed where that endpoint says ``http://``, and the set reads as the local one."""
    import obstore

    # the settings undone inside the server's, which undoes its own
    with azure_server("sets") as endpoint, pytest.MonkeyPatch.context() as mp:
        store = obstore.store.from_url("az://sets/a")
        for f in os.listdir(local_set):
            with open(os.path.join(local_set, f), "rb") as src:
                obstore.put(store, f, src.read())
        mp.delenv("AZURE_STORAGE_USE_EMULATOR")
        mp.setenv("AZURE_STORAGE_ACCOUNT_NAME", AZURE_ACCOUNT)
        mp.setenv("AZURE_STORAGE_ACCOUNT_KEY", AZURE_KEY)
        mp.setenv("AZURE_STORAGE_ENDPOINT", f"{endpoint}/{AZURE_ACCOUNT}")
        remote_batches, local_batches = (
            [(x.clone(), y.clone()) for x, y in plain_loader(p, seed=7, cache_dir=tmp_path)]
            for p in ("az://sets/a", local_set))
        assert len(remote_batches) == 6
        for (a, b), (c, d) in zip(remote_batches, local_batches):
            assert torch.equal(a, c) and torch.equal(b, d)


@pytest.fixture
def quick(monkeypatch):
    """Short timeouts and retries: a failure is named in seconds."""
    monkeypatch.setattr(objectstore, "TIMEOUT", 1)
    monkeypatch.setattr(objectstore, "CONNECT_TIMEOUT", 1)
    monkeypatch.setattr(objectstore, "RETRY_SECONDS", 4)


def _read_all(url, cache_dir, **kw) -> list[int]:
    loader = plain_loader(url, train=False, num_workers=0, cache_dir=cache_dir, **kw)
    return [y for _, labels in loader for y in labels.tolist()]


def _read_in_process(url, cache_dir, conn) -> None:
    loader = plain_loader(url, backend=fastdata.TorchBackend(num_workers=2, workers="process"),
                          cache_dir=cache_dir,
                          seed=os.getpid())
    conn.send(sum(x.shape[0] for x, _ in loader))


def test_a_shards_labels_are_fetched_once(http_set, tmp_path):
    """A remote set's labels, asked again after the cache has let their shard go, come from
    memory: the shard is not downloaded again for them."""
    server, url = http_set
    ds = fastdata.open(url, cache_dir=tmp_path)
    first = ds.labels_of([0, 1, 7])
    shard0 = shard_files(server.root)[0]
    assert server.gets[shard0] == 1
    for reader in ds.shards:
        reader.close()
    assert ShardCache(tmp_path).clear()[0] >= 1
    assert ds.labels_of([1, 0]).tolist() == first[[1, 0]].tolist()
    assert server.gets[shard0] == 1


def test_one_download_per_shard_for_every_process_of_a_node(http_set, local_set, tmp_path):
    """Two loaders of two worker processes each, one cache: each shard fetched once."""
    server, url = http_set
    ctx = mp.get_context("fork")
    pipes = [ctx.Pipe() for _ in range(2)]
    procs = [ctx.Process(target=_read_in_process, args=(url, str(tmp_path), there))
             for _, there in pipes]
    for p in procs:
        p.start()
    try:                        # a hang fails here, and its processes are not left behind
        assert [here.poll(120) and here.recv() for here, _ in pipes] == [24, 24]
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                for child in children(p.pid):
                    os.kill(child, 9)
                p.kill()
                p.join()
    assert {k: v for k, v in server.gets.items() if k.startswith("shard-")} == \
        {f: 1 for f in shard_files(local_set)}


def test_the_cache_stays_under_its_limit_and_keeps_shards_in_use(http_set, local_set,
                                                                 tmp_path):
    server, url = http_set
    sizes = [os.path.getsize(os.path.join(local_set, f)) for f in shard_files(local_set)]
    limit = 2 * max(sizes)
    ds = fastdata.open(url, cache_dir=tmp_path, cache_limit=limit)
    cache = ShardCache(tmp_path, limit)
    peak = 0
    for start in range(0, 24, 4):
        ds.read_batch(range(start, start + 4), size=16)
        ds.close()                  # a shard read and closed may be evicted
        peak = max(peak, cache.used())
    assert 0 < peak <= limit
    held = fastdata.open(url, cache_dir=tmp_path)
    held.read_batch([0], size=16)                   # shard 0 open in this reader
    for start in range(5, 24, 5):                   # every other shard, through the limit
        ds.read_batch(range(start, min(start + 5, 24)), size=16)
        ds.close()
    assert os.path.exists(held.shards[0].path)      # never evicted while held
    assert cache.used() <= limit
    with pytest.raises(OSError, match=f"does not fit cache_limit={max(sizes) - 1}"):
        fastdata.open(url, cache_dir=tmp_path / "small", cache_limit=max(sizes) - 1) \
            .read_batch(range(24), size=16)


def test_server_errors_are_retried_and_a_missing_shard_is_named(http_set, local_set,
                                                                tmp_path, quick):
    server, url = http_set
    first = shard_files(local_set)[0]
    server.faults[first] = [500, 500]
    assert sorted(_read_all(url, tmp_path / "a")) == sorted(
        fastdata.open(local_set).labels.tolist())
    assert server.gets[first] == 3
    server.faults[first] = [404] * 5
    with pytest.raises(FileNotFoundError, match=f"{url}/{first}: not found"):
        _read_all(url, tmp_path / "b")


@pytest.mark.parametrize("fault", [500, 403, "truncate", "slow", "oversize"])
def test_a_shard_that_keeps_failing_is_one_line_naming_it(http_set, local_set, tmp_path,
                                                          quick, fault):
    server, url = http_set
    first = shard_files(local_set)[0]
    server.faults[first] = [fault] * 200     # each try may take 2 (a resumed request)
    t = time.monotonic()
    with pytest.raises(OSError) as e:
        _read_all(url, tmp_path)
    assert time.monotonic() - t < 30                          # bounded: no hang
    assert f"{url}/{first}" in str(e.value) and "\n" not in str(e.value)
    key = shard_key(fastdata.open(local_set).manifest["shards"][0], "hdf5")
    assert key not in os.listdir(tmp_path / "objects")        # nothing wrong kept
    deadline = time.monotonic() + 20        # a fetch-ahead of it may still be failing
    while [n for n in os.listdir(tmp_path / "tmp") if n.startswith(key)]:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_damaged_bytes_are_fetched_again_then_refused(http_set, local_set, tmp_path):
    server, url = http_set
    first = shard_files(local_set)[0]
    server.faults[first] = ["corrupt"]                         # once: fetched again
    want = fastdata.open(local_set).read_batch(range(24), size=16)
    assert np.array_equal(fastdata.open(url, cache_dir=tmp_path / "a")
                          .read_batch(range(24), size=16), want)
    assert server.gets[first] == 2
    server.faults[first] = ["corrupt"] * 2                     # twice: refused
    with pytest.raises(OSError, match=f"{url}/{first}: .*twice: refused"):
        fastdata.open(url, cache_dir=tmp_path / "b").read_batch(range(24), size=16)
    assert not os.listdir(tmp_path / "b" / "objects")


def test_threads_filling_a_full_cache_never_find_a_shard_gone_under_them(tmp_path):
    """Six threads fetching six shards into a cache of two, at random: every fetch returns,
    none finds the shard it just placed evicted before it was stamped (a shard without its
    stamp would be the first to go), and the cache ends within its limit."""
    size, errors = 4096, []
    cache = ShardCache(tmp_path, 2 * size)

    def fetch(fd):
        os.write(fd, b"x" * size)

    def worker(seed):
        rng = random.Random(seed)
        for _ in range(300):
            key = f"shard-{rng.randrange(6):04d}"
            try:
                cache.get(key, size, fetch, lambda path: None, key)
            except Exception as e:      # noqa: BLE001 - any failure is the test's finding
                errors.append(f"{type(e).__name__}: {e}")
    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert cache.used() <= 2 * size


def test_a_cached_shard_altered_on_disk_is_fetched_again(http_set, local_set, tmp_path):
    server, url = http_set
    first = shard_files(local_set)[0]
    want = fastdata.open(local_set).read_batch(range(24), size=16)
    fastdata.open(url, cache_dir=tmp_path).read_batch(range(24), size=16)
    (cached,) = [p for p in (tmp_path / "objects").iterdir()
                 if hashlib.sha256(p.read_bytes()).digest() ==
                 hashlib.sha256(open(os.path.join(local_set, first), "rb").read()).digest()]
    data = bytearray(cached.read_bytes())
    data[len(data) // 2] ^= 0xFF
    cached.write_bytes(bytes(data))
    got = fastdata.open(url, cache_dir=tmp_path).read_batch(range(24), size=16)
    assert np.array_equal(got, want) and server.gets[first] == 2


def test_a_server_that_is_down_is_named_in_seconds(tmp_path, quick):
    url = f"http://127.0.0.1:{free_port()}/set"
    t = time.monotonic()
    with pytest.raises(OSError, match=f"{url}/manifest.json: reading failed"):
        fastdata.open(url, cache_dir=tmp_path)
    assert time.monotonic() - t < 30


def test_a_file_url_and_a_folder_that_is_not_the_caches_own(local_set, tmp_path):
    ds = fastdata.open("file://" + local_set, cache_dir=tmp_path / "c")
    assert np.array_equal(ds.read_batch(range(24), size=16),
                          fastdata.open(local_set).read_batch(range(24), size=16))
    shutil.rmtree(tmp_path / "c" / "objects")
    os.symlink(tmp_path, tmp_path / "c" / "objects")
    with pytest.raises(OSError, match="is not a folder of its own: refused"):
        fastdata.open("file://" + local_set, cache_dir=tmp_path / "c")
    with pytest.raises(ValueError, match="cache_limit=-1 is not valid"):
        fastdata.open("file://" + local_set, cache_dir=tmp_path / "d", cache_limit=-1)


def test_a_shuffle_over_windows_opens_one_window_for_the_first_batch(http_set, tmp_path):
    _, url = http_set
    ds = fastdata.open(url, cache_dir=tmp_path)
    loader = plain_loader(ds, num_workers=0, shuffle_window=1)
    images, labels = next(iter(loader))
    assert sum(r._h is not None for r in ds.shards) == 1      # one shard, not the set
    whole = plain_loader(ds, num_workers=0, shuffle_window=2)
    assert sorted(y for _, b in whole for y in b.tolist()) == sorted(
        np.asarray(ds.labels)[np.concatenate([b for b in whole.order.batches()])].tolist())
    with pytest.raises(ValueError, match="shuffle_window=0 is not valid"):
        plain_loader(ds, shuffle_window=0)
    with pytest.raises(ValueError, match="shard_split=0 is not valid"):
        plain_loader(ds, shard_split=0)
    with pytest.warns(UserWarning, match="shard_split=4 is not a multiple of world_size=3"):
        split = [plain_loader(ds, shard_split=4, world_size=3, rank=r, train=False)
                 for r in range(3)]
    assert sorted(i for o in split for b in o.order.batches() for i in b.tolist()) == \
        list(range(len(ds)))
    state = split[0].state_dict()
    with pytest.raises(ValueError, match="shuffle_window and shard_split"):
        plain_loader(ds, shard_split=6, world_size=3, train=False).load_state_dict(state)


@pytest.mark.parametrize("workers", ["thread", "process"])
def test_a_set_larger_than_the_cache_is_read_window_by_window(tmp_path, workers):
    """12 shards, a cache of 6 and a window of 2: every epoch reads every sample once, the
    cache never holds more than its limit, and each shard comes about once an epoch: the
    finished windows' shards make room, the fetch-ahead runs no further ahead than the cache
    holds."""
    out = str(tmp_path / "set")
    convert(plain_folder(tmp_path / "src", per_class=20), out, sizes=[16], shard_size=5,
            num_workers=1, shuffle=True, progress=False)
    shard = max(os.path.getsize(os.path.join(out, f)) for f in shard_files(out))
    server = FileServer(out)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/set"
    limit, peak, done = 6 * shard, [0], threading.Event()
    cache, ids = ShardCache(tmp_path / "cache", limit), ids_of(fastdata.open(out))

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], cache.used())
            time.sleep(0.002)
    threading.Thread(target=watch, daemon=True).start()
    try:
        loader = plain_loader(url, backend=fastdata.TorchBackend(num_workers=2, workers=workers),
                              shuffle_window=2,
                              cache_dir=tmp_path / "cache", cache_limit=limit)
        for epoch in range(3):
            loader.set_epoch(epoch)
            before = sum(server.gets.get(f, 0) for f in shard_files(out))
            assert sorted(i for batch in seen(loader, ids) for i in batch) == list(range(60))
            fetched = sum(server.gets.get(f, 0) for f in shard_files(out)) - before
            # 12 at best; a few twice, by the timing of the readers: no thrashing (which
            # fetches each shard twice or more)
            assert fetched <= 18, fetched
        loader.close()
    finally:
        done.set()
        server.shutdown()
        server.server_close()
    assert 0 < peak[0] <= limit


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_bounded_cache_fetches_shards_ahead_of_the_window_being_read(tmp_path, monkeypatch,
                                                                       ranks):
    """Windows of 2 read slowly through a cache of 6 shards a rank: half of a rank's share is
    its fetch-ahead's, so 3 shards are fetched ahead of those the pass has begun to read, in the
    middle of a window too (where counting the window's shards against that half left room
    for one). With ``shard_split`` and 2 ranks on the node (``LOCAL_WORLD_SIZE``), which read
    other shards into the same cache of 12, each plans on its half: 3 ahead, not 6."""
    out = str(tmp_path / "set")
    convert(plain_folder(tmp_path / "src", per_class=20 * ranks), out, sizes=[16],
            shard_size=5, num_workers=1, shuffle=True, progress=False)
    shard = max(os.path.getsize(os.path.join(out, f)) for f in shard_files(out))
    server = FileServer(out)
    server.delay = 0.05
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/set"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(ranks))
    try:
        loader = plain_loader(url, num_workers=0, shuffle_window=2, batch_size=5,
                              world_size=ranks, rank=0, shard_split=ranks,
                              cache_dir=tmp_path / "cache", cache_limit=6 * ranks * shard)
        shard_of = loader.dataset.locate(np.concatenate(loader.order.batches()))[0]
        ahead = []
        for k, _ in enumerate(loader):      # the 12 shards this rank reads, 5 samples a batch
            time.sleep(0.4)     # the fetch-ahead does all it may meanwhile
            begun = len(set(shard_of[:5 * (k + 1)].tolist()))
            ahead.append(sum(n for f, n in server.gets.items() if f.startswith("shard-"))
                         - begun)
        loader.close()
    finally:
        server.shutdown()
        server.server_close()
    # 8 batches in 4 windows, before the last 4 shards: 3 ahead all along
    assert ahead[:8] == [3] * 8, ahead
    assert ShardCache(tmp_path / "cache", 6 * ranks * shard).used() <= 6 * ranks * shard


def _rank(url, cache_dir, rank, barrier, conn, ids, split) -> None:
    """One rank of 4: its samples of two epochs, in step with the others (``barrier``)."""
    loader = plain_loader(url, world_size=4, rank=rank, shuffle_window=2, cache_dir=cache_dir,
                          num_workers=2, batch_size=5, shard_split=split)  # 3 batches a rank
    epochs = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        epochs.append([i for batch in seen(loader, ids) for i in batch])
        barrier.wait()          # the epoch is over on every rank: counted
        barrier.wait()
    conn.send(epochs)


@pytest.mark.parametrize("split", [None, 4])
def test_two_nodes_of_two_ranks_fetch_what_their_ranks_read_once(tmp_path, split):
    """Two nodes (a cache each, a server each to count what each fetches) of two rank
    processes: each node downloads the shards its ranks read once, and every sample is read
    exactly once per epoch over the four ranks. A full window shuffle has every rank read
    every shard (each node downloads the set in the first epoch, nothing in the second);
    ``shard_split=4`` gives each rank its own shards, so each node downloads half the set in
    an epoch, the other half's shards never."""
    out = str(tmp_path / "set")
    convert(plain_folder(tmp_path / "src", per_class=20), out, sizes=[16], shard_size=5,
            num_workers=1, shuffle=True, progress=False)
    ds = fastdata.open(out)
    ids, files = ids_of(ds), [s["file"] for s in ds.manifest["shards"]]
    servers = [FileServer(out) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(5)
    ranks = []
    for r in range(4):
        node = r // 2
        url = f"http://127.0.0.1:{servers[node].server_address[1]}/set"
        here, there = ctx.Pipe()
        p = ctx.Process(target=_rank, args=(url, tmp_path / f"node{node}", r, barrier, there,
                                            ids, split))
        p.start()
        ranks.append((p, here))
    try:
        fetched = []
        for _ in range(2):
            barrier.wait(timeout=120)
            fetched.append([dict(server.gets) for server in servers])
            barrier.wait(timeout=120)
        epochs = [conn.recv() for _, conn in ranks]
    finally:
        for p, _ in ranks:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
        for server in servers:
            server.shutdown()
            server.server_close()
    for epoch in range(2):
        assert sorted(i for rank in epochs for i in rank[epoch]) == list(range(60))
    for node in range(2):
        read = set()
        for epoch in range(2):      # the counts so far: each shard its ranks read, once
            read |= {files[i // 5] for rank in epochs[2 * node:2 * node + 2]
                     for i in rank[epoch]}
            shards = {f: n for f, n in fetched[epoch][node].items() if f in files}
            assert shards == dict.fromkeys(read, 1)
            if epoch == 0:          # split: runs of 15 samples, 3 whole shards a rank
                assert len(shards) == (6 if split else len(files))
    if split:
        first = [{f for f in fetched[0][node] if f in files} for node in range(2)]
        assert not first[0] & first[1]


_SMALL_AND_READ_ONLY = r"""
READ='import sys, fastdata
try:
    print("read", sum(len(y) for _, y in fastdata.Loader(
        sys.argv[1], batch_size=4, device="cpu", train=False, cache_dir=sys.argv[2])))
except OSError as e:
    print("error", e)'
mount -t tmpfs -o size=40k tmpfs "$DISK" || exit 99
$PY -c "$READ" "$URL" "$DISK/cache"
n() { ls "$DISK/cache/$1" | grep -c c-; }
echo "left: $(n tmp) $(n objects) $(n stamps)"
mkdir -p "$RO/cache"
mount --bind "$RO" "$RO" && mount -o remount,bind,ro "$RO" || exit 99
$PY -c "$READ" "$URL" "$RO/cache"
$PY -c "$READ" "$URL" "$RO/new"
"""


def test_a_full_or_read_only_cache_disk_is_one_line_naming_it(http_set, tmp_path):
    """A cache on a 40 KiB disk and on a read-only mount (private mounts): an OSError in one
    line naming the cache folder and what it could not hold; no partial file left."""
    _, url = http_set
    (tmp_path / "disk").mkdir()
    (tmp_path / "ro").mkdir()
    r = in_private_mounts(_SMALL_AND_READ_ONLY, {"DISK": str(tmp_path / "disk"), "URL": url,
                                                 "RO": str(tmp_path / "ro"), "PYTHONPATH": REPO},
                          "mount")
    lines = r.stdout.splitlines()
    assert len(lines) == 4 and all(line.startswith("error ") for line in lines[::3]), r
    full, _, ro, ro_new = lines
    # refused before it is reserved where the disk is too small for it, else as it fills up
    assert re.search(rf"cache folder {tmp_path / 'disk' / 'cache'}: No space left on device"
                     rf"( for a shard of \d+ bytes \(\d+ free\))?: cannot hold {url}/shard-",
                     full)
    assert "make room there" in full
    _, partial, shards, stamps = lines[1].split()
    assert partial == "0" and shards == stamps      # no partial download, no unchecked shard
    for folder, line in (("cache", ro), ("new", ro_new)):
        assert f"cache folder {tmp_path / 'ro' / folder}: Read-only file system: cannot " \
               f"hold" in line and "(give a cache_dir this process may write)" in line


def test_a_download_left_by_a_killed_process_is_swept(http_set, local_set, tmp_path):
    _, url = http_set
    ShardCache(tmp_path)                                    # its folders
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = tmp_path / "tmp" / f"c-{'0' * 64}.{dead.pid}.0123abcd"
    left.write_bytes(bytes(1 << 20))
    fastdata.open(url, cache_dir=tmp_path).read_batch([0], size=16)
    assert not left.exists()


# ---------------------------------------------------------------- hostile stores
@pytest.fixture
def proxied(s3, monkeypatch):
    """The S3 server behind a fault proxy (``AWS_ENDPOINT_URL`` points at the proxy)."""
    with fault_proxy(os.environ["AWS_ENDPOINT_URL"]) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        yield proxy, s3


def _batches(loader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x, y) for x, y in loader]


@pytest.fixture(scope="module")
def converted(s3, tmp_path_factory) -> str:
    """``local_set``'s images converted straight into the bucket (each shard's whole-file
    checksum in its manifest)."""
    url = "s3://fastdata-test/sets/converted"
    convert(plain_folder(tmp_path_factory.mktemp("converted") / "src", per_class=8), url,
            sizes=[16], shard_size=5, num_workers=1, progress=False)
    return url


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_process_workers_fetch_the_shards_they_read(converted, local_set, tmp_path,
                                                    monkeypatch, context):
    """Every shard fetched by the worker process that reads it (nothing fetched ahead): forked
    workers through the helper process, its download checksummed from the file; spawned ones
    with their own client, after the loader's process fetched one itself."""
    monkeypatch.setattr(fastdata.ShardSet, "fetch_ahead", lambda self, *a, **k: None)
    ds = fastdata.open(converted, cache_dir=tmp_path)
    assert all("file_sha256" in s for s in ds.manifest["shards"])
    ds.labels_of([0])                       # one shard fetched here first
    got = _batches(plain_loader(ds, train=False, backend=fastdata.TorchBackend(num_workers=2,
                                                                               workers="process",
                                                                               mp_context=context)))
    want = _batches(plain_loader(local_set, train=False, num_workers=0))
    assert len(got) == len(want) == 6
    for (a, b), (c, d) in zip(got, want):
        assert torch.equal(a, c) and torch.equal(b, d)
    assert len(os.listdir(tmp_path / "objects")) == 5


def _tampered(client, local_set, prefix: str, edit) -> str:
    """The set uploaded under ``prefix`` with its manifest edited by ``edit``; its URL."""
    import json

    for f in os.listdir(local_set):
        client.upload_file(os.path.join(local_set, f), "fastdata-test", f"{prefix}/{f}")
    with open(os.path.join(local_set, "manifest.json")) as f:
        m = json.load(f)
    edit(m)
    m.pop("class_counts", None)         # a hostile manifest leaves out what would not add up
    client.put_object(Bucket="fastdata-test", Key=f"{prefix}/manifest.json",
                      Body=json.dumps(m).encode())
    return f"s3://fastdata-test/{prefix}"


def _count(m, k: int, n: int, nbytes: int | None = None) -> None:
    m["num_samples"] += n - m["shards"][k]["count"]
    m["shards"][k]["count"] = n
    for s in m["shards"][k + 1:]:
        s["start"] += n - m["shards"][k]["count"]
    if nbytes is not None:
        m["shards"][k]["bytes"] = nbytes


def test_a_remote_manifest_at_odds_with_its_shards_is_refused_at_open(s3, local_set, tmp_path):
    """Counts and sizes against the store's listing, before any order is built; two entries
    of one whole-file checksum (one shard read twice, another never)."""
    import boto3

    client = boto3.client("s3")
    last = len(shard_files(local_set)) - 1
    many = _tampered(client, local_set, "t/many", lambda m: _count(m, last, 10**9))
    with pytest.raises(ShardFormatError, match=f"{many}/manifest.json: shard-0000{last}.h5 "
                                               f"cannot hold the 1000000000 samples"):
        fastdata.open(many, cache_dir=tmp_path)
    huge = _tampered(client, local_set, "t/huge", lambda m: _count(m, last, 10**9, 10**15))
    with pytest.raises(ShardFormatError, match=rf"{huge}/shard-0000{last}.h5 is \d+ bytes in "
                                               rf"the store, its manifest says 10{{15}}"):
        fastdata.open(huge, cache_dir=tmp_path)
    with open(os.path.join(local_set, shard_files(local_set)[0]), "rb") as f:
        whole = hashlib.sha256(f.read()).hexdigest()
    twice = _tampered(client, local_set, "t/twice", lambda m: [
        s.update(file_sha256=whole) for s in m["shards"][:2]])
    with pytest.raises(ShardFormatError, match=r"shards\[1\].file_sha256"):
        fastdata.open(twice, cache_dir=tmp_path)


def test_counts_a_plain_http_server_cannot_list_are_bounded(http_set, local_set, tmp_path):
    """Without a listing, a count too large for memory is refused as the loader is made, and
    a shard larger than the disk as it is fetched; neither allocates it."""
    import json

    server, url = http_set
    root = tmp_path / "served"
    shutil.copytree(local_set, root)
    with open(root / "manifest.json") as f:
        m = json.load(f)
    _count(m, len(m["shards"]) - 1, 10**11, 10**15)
    m.pop("class_counts")
    (root / "manifest.json").write_text(json.dumps(m))
    server.root = str(root)
    ds = fastdata.open(url, cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match=r"an epoch of 1000000000\d\d samples needs .* GiB of "
                                         r"memory, more than the .* available"):
        plain_loader(ds)
    with pytest.raises(OSError, match=r"No space left on device for a shard of 10{15} bytes"):
        ds.read_batch([len(ds) - 1])


@pytest.fixture
def small_chunks(monkeypatch):
    """Downloads written 256 bytes at a time: a small shard's body cut off mid-way leaves
    some of it written (a shard of the real size leaves megabytes)."""
    monkeypatch.setattr(objectstore, "CHUNK", 256)


def test_a_body_cut_off_resumes_where_it_stopped(proxied, local_set, tmp_path, quick,
                                                 small_chunks):
    proxy, url = proxied
    first = shard_files(local_set)[0]
    proxy.faults[first], proxy.stall_s = ["stall"], 3
    want = fastdata.open(local_set).read_batch(range(24), size=16)
    assert np.array_equal(fastdata.open(url, cache_dir=tmp_path).read_batch(range(24), size=16),
                          want)
    asked = [r for name, r in proxy.ranges if name == first]
    assert asked[0] is None and len(asked) == 2 and asked[1].startswith("bytes=")
    assert int(asked[1][6:].split("-")[0]) > 0          # from the byte where it stopped


def test_a_slow_steady_link_brings_a_shard_longer_than_one_try(proxied, local_set, tmp_path,
                                                               quick, small_chunks):
    """Each try ends at the request's timeout (1 s here), each brings more: the shard arrives
    (each once started again from byte 0)."""
    proxy, url = proxied
    first = shard_files(local_set)[0]
    size = os.path.getsize(os.path.join(local_set, first))
    proxy.rates[first] = size / 3.5                 # 3.5 s for the shard
    want = fastdata.open(local_set).read_batch(range(5), size=16)
    assert np.array_equal(fastdata.open(url, cache_dir=tmp_path).read_batch(range(5), size=16),
                          want)
    asked = [r for name, r in proxy.ranges if name == first]
    assert len(asked) >= 3 and all(r.startswith("bytes=") for r in asked[1:])


def test_a_server_that_stops_answering_is_named_within_the_retry_bound(proxied, local_set,
                                                                       tmp_path, quick):
    proxy, url = proxied
    first = shard_files(local_set)[0]
    proxy.faults[first] = ["hang"] * 20
    ds = fastdata.open(url, cache_dir=tmp_path)
    t = time.monotonic()
    with pytest.raises(OSError) as e:
        ds.read_batch(range(5))
    # RETRY_SECONDS (4 s here) after the last byte, and one request's TIMEOUT at most
    assert time.monotonic() - t < objectstore.RETRY_SECONDS + 2 * objectstore.TIMEOUT + 2
    text = str(e.value)
    assert f"{url}/{first}: download failed after 0 bytes" in text and "timed out" in text
    assert "\n" not in text


def test_a_servers_text_reaches_no_terminal_raw_and_keeps_no_secret(proxied, monkeypatch,
                                                                    tmp_path):
    proxy, url = proxied
    monkeypatch.setenv("AWS_SESSION_TOKEN", "temporary-token-never-shown")
    secret = os.environ["AWS_SECRET_ACCESS_KEY"]
    proxy.faults["manifest.json"] = [("error", f"<Error>\x1b]0;owned\x07 {secret} "
                                               f"temporary-token-never-shown</Error>")] * 10
    with pytest.raises(OSError) as e:
        fastdata.open(url, cache_dir=tmp_path)
    text = str(e.value)
    assert "\x1b" not in text and "\\x1b]0;owned\\x07" in text, text
    assert secret not in text and "temporary-token-never-shown" not in text and "***" in text
    proxy.faults["manifest.json"] = [("error", "\x1b[2J")] * 10
    r = subprocess.run([sys.executable, "-m", "fastdata.cli", "info",
                        "s3://fastdata-test/\x1b]0;x\x07set"], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "FASTDATA_CACHE": str(tmp_path / "c")})
    assert r.returncode == 2 and "\x1b" not in r.stderr and "\x07" not in r.stderr
    assert "s3://fastdata-test/\\x1b]0;x\\x07set/manifest.json" in r.stderr, r.stderr
    assert redact("s3://BUCKET/Set?X-Amz-Signature=1") == "s3://BUCKET/Set"


def test_labels_held_in_a_field_come_with_each_shard_fetched(tmp_path):
    """A multi-label set's rows and a segmentation set's maps are the shards' field ``label``:
    a remote set reads a sample's label from its shard alone (no other file, no other shard),
    as the local set gives it."""
    src = plain_folder(tmp_path / "src", per_class=4)
    names = sorted(os.path.relpath(os.path.join(d, f), src)
                   for d, _, fs in os.walk(src) for f in fs)
    maps = tmp_path / "maps"
    rows = ["path,cat,dog"]
    for k, name in enumerate(names):
        rows.append(f"{name},{k % 2},{(k // 2) % 2}")
        with Image.open(os.path.join(src, name)) as img:
            m = np.full(img.size[::-1], 255, np.uint8)
        m[: 5 + k] = k % 3
        os.makedirs(maps / os.path.dirname(name), exist_ok=True)
        Image.fromarray(m).save(maps / (os.path.splitext(name)[0] + ".png"))
    (tmp_path / "m.csv").write_text("\n".join(rows) + "\n")
    sets = {"multi": convert(src, str(tmp_path / "multi"), sizes=[16], shard_size=4,
                             labels=str(tmp_path / "m.csv"), progress=False),
            "seg": convert(src, str(tmp_path / "seg"), sizes=[16], shard_size=4,
                           masks=str(maps), progress=False)}
    for name, m in sets.items():
        assert m["fields"][0]["name"] == "label" and len(m["shards"]) == 3
        server = FileServer(str(tmp_path / name))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}/"
            local, remote = fastdata.open(str(tmp_path / name)), fastdata.open(
                url, cache_dir=tmp_path / f"cache-{name}")
            got = remote[9][1]
            assert np.array_equal(got, local[9][1]) and got.dtype == local[9][1].dtype
            assert sorted(server.gets) == ["manifest.json", m["shards"][2]["file"]]
            if name == "multi":
                assert np.array_equal(remote.labels_of([0, 9]), local.labels[[0, 9]])
        finally:
            server.shutdown()
            server.server_close()
