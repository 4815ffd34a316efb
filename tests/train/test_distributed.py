"""Beyond one process: several nodes (two torchrun agents on this host stand in for two
machines), many ranks per node sharing the page cache, and sets read from a read-only mount."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import textwrap

import pytest

import fastdata
from fastdata.converters.convert import convert
from tests.helpers import in_private_mounts, plain_folder

# each rank: the samples of two training epochs and of one evaluation, by global rank
RANK_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import fastdata
    from fastdata.train import distributed
    info = distributed.setup(device="cpu")
    seen = {"rank": info.rank, "world": info.world_size, "local_rank": info.local_rank,
            "node_local_ranks": int(os.environ["LOCAL_WORLD_SIZE"]), "device": str(info.device)}
    train = fastdata.Loader(sys.argv[1], batch_size=2, device="cpu", num_workers=0, seed=5)
    for epoch in (0, 1):
        train.set_epoch(epoch)
        seen[f"train{epoch}"] = [y.tolist() for _, y in train]
    val = fastdata.Loader(sys.argv[1], batch_size=3, train=False, device="cpu", num_workers=0)
    seen["eval"] = [y.tolist() for _, y in val]
    with open(os.path.join(sys.argv[2], f"rank{info.rank}.json"), "w") as f:
        json.dump(seen, f)
    distributed.teardown()
    """)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(args, **kw):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def _on_nodes(nodes: int, *command) -> str:
    """``command`` under torchrun as ``nodes`` agents of ``4 // nodes`` ranks each, on this
    host (a static rendezvous on 127.0.0.1); returns the agents' output."""
    port = _free_port()
    procs = [_torchrun(["--nnodes", str(nodes), "--nproc-per-node", str(4 // nodes),
                        "--node-rank", str(k), "--master-addr", "127.0.0.1",
                        "--master-port", str(port), *map(str, command)])
             for k in range(nodes)]
    texts = [p.communicate(timeout=240)[0] for p in procs]
    for p, text in zip(procs, texts):
        assert p.returncode == 0, text[-3000:]
    return "".join(texts)


def _layout(script, shards, out, nodes: int) -> dict[int, dict]:
    """Every rank's samples, run as ``nodes`` torchrun agents of ``4 // nodes`` ranks each."""
    os.makedirs(out)
    _on_nodes(nodes, script, shards, out)
    return {r: json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(4)}


def test_two_nodes_of_two_ranks_read_what_one_node_of_four_does(tmp_path):
    # one image per class: a label names its sample
    src = plain_folder(tmp_path / "src", classes=tuple(f"c{i:02d}" for i in range(19)),
                       per_class=1)
    shards = str(tmp_path / "shards")
    convert(src, shards, sizes=[8], shard_size=5, num_workers=1, progress=False)
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    one = _layout(script, shards, str(tmp_path / "one"), nodes=1)
    two = _layout(script, shards, str(tmp_path / "two"), nodes=2)
    for r in range(4):
        assert one[r]["world"] == two[r]["world"] == 4
        assert two[r]["local_rank"] == r % 2 and two[r]["node_local_ranks"] == 2
        for key in ("train0", "train1", "eval"):
            assert one[r][key] == two[r][key], (r, key)
    for epoch in ("train0", "train1"):        # disjoint, equal, the remainder dropped
        got = [x for r in range(4) for batch in two[r][epoch] for x in batch]
        assert len(got) == len(set(got)) == 16
    evaluated = sorted(x for r in range(4) for batch in two[r]["eval"] for x in batch)
    assert evaluated == list(range(19))       # every sample exactly once


def test_fastdata_train_checkpoints_once_and_resumes_on_another_layout(tmp_path):
    """An epoch on two nodes of 2 ranks saves what an epoch on one node of 4 does (global rank
    0 writes it, into one folder), and one node of 4 resumes from it."""
    import torch

    src = plain_folder(tmp_path / "src", classes=tuple(f"c{i:02d}" for i in range(16)),
                       per_class=1)
    shards = str(tmp_path / "shards")
    convert(src, shards, sizes=[8], num_workers=1, progress=False)

    def train(nodes, ck, epochs):
        return _on_nodes(nodes, "-m", "fastdata.cli", "train", shards, "--model", "tiny",
                         "--epochs", epochs, "--batch-size", 2, "--device", "cpu",
                         "--workers", 0, "--checkpoint", ck, "--log-every", 0,
                         "--schedule", "none")     # a schedule's length names the epochs
    train(2, tmp_path / "two", 1)
    train(1, tmp_path / "one", 1)
    two, one = (torch.load(tmp_path / d / "last.pt", weights_only=True) for d in ("two", "one"))
    assert two["loader"] == one["loader"] and two["step"]["steps"] == one["step"]["steps"]
    assert all(torch.equal(two["model"][k], one["model"][k]) for k in one["model"])
    assert sorted(os.listdir(tmp_path / "two")) == ["last.pt"] + [
        f"log-rank{r}.jsonl" for r in range(4)]
    assert "resumed from" in train(1, tmp_path / "two", 2)
    epochs = [json.loads(line)["epoch"] for line in
              (tmp_path / "two" / "log-rank3.jsonl").read_text().splitlines()]
    assert epochs == [0, 1]


def _shard_pss(paths, conn) -> None:
    """Read the whole set once at random; once every reader has, send the PSS of its shard
    files' maps (kB)."""
    import fastdata

    loader = fastdata.Loader(paths["set"], batch_size=16, device="cpu", num_workers=0,
                             augment=False, seed=os.getpid())
    for _ in loader:
        pass
    conn.send("read")
    conn.recv()
    real = {os.path.realpath(s.path) for s in loader.dataset.shards}
    pss, current = 0, None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
                current = head[5] if len(head) > 5 else None
            elif head[0] == "Pss:" and current in real:
                pss += int(head[1])
    conn.send(pss)
    conn.recv()                 # stay alive, maps and all, until every reader has measured


def _readers(path, n: int) -> list[int]:
    ctx = mp.get_context("fork")
    pipes = [ctx.Pipe() for _ in range(n)]
    procs = [ctx.Process(target=_shard_pss, args=({"set": path}, there)) for _, there in pipes]
    for p in procs:
        p.start()
    for here, _ in pipes:       # all have read the set before any measures
        assert here.recv() == "read"
    for here, _ in pipes:
        here.send("measure")
    sizes = [here.recv() for here, _ in pipes]
    for here, _ in pipes:
        here.send("done")
    for p in procs:
        p.join(60)
    return sizes


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="PSS is Linux's")
@pytest.mark.parametrize("container", ["hdf5", "lmdb"])
def test_ranks_on_one_node_share_the_page_cache(tmp_path, container):
    """4 readers of one raw set hold it once between them: their PSS of the shard files adds
    up to what one reader's alone is, within 10% of the set's size."""
    src = plain_folder(tmp_path / "src", per_class=40)
    out = str(tmp_path / "set")
    convert(src, out, container=container, sizes=[64], shard_size=30, num_workers=1,
            progress=False)
    set_kb = sum(s["bytes"] for s in fastdata.open(out).manifest["shards"]) / 1024
    alone = _readers(out, 1)[0]
    four = _readers(out, 4)
    assert alone > 0.5 * set_kb, (alone, set_kb)        # it did read the set through the maps
    assert sum(four) - alone < 0.1 * set_kb, (four, alone, set_kb)


READ_ONLY = """
set -e
mount --bind "$SET" "$RO" && mount -o remount,bind,ro "$RO" || exit 99
touch "$RO/x" 2>/dev/null && { echo "the mount is writable"; exit 98; }
$CLI info "$RO" > /dev/null
$CLI verify "$RO"
$PY -c 'import sys, fastdata
n = sum(len(y) for _, y in fastdata.Loader(sys.argv[1], batch_size=4, device="cpu",
                                           train=False))
print("read", n)' "$RO"
"""


@pytest.mark.parametrize("container", ["hdf5", "lmdb"])
def test_a_set_on_a_read_only_mount_is_read_whole(tmp_path, folder, container):
    """Nothing in the read path writes, locks or creates a file (a private read-only bind
    mount, in a user and mount namespace of its own)."""
    out, ro = tmp_path / "set", tmp_path / "ro"
    convert(folder, str(out), container=container, sizes=[8], shard_size=5, progress=False)
    ro.mkdir()
    before = sorted(os.listdir(out))
    r = in_private_mounts(READ_ONLY, {"SET": str(out), "RO": str(ro)}, "read-only mount")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OK" in r.stdout and "read 21" in r.stdout
    assert sorted(os.listdir(out)) == before
