"""Runs that resume on another number of ranks: a 4-rank run stopped mid-epoch, resumed on 2
ranks, stopped again, finished on 3 (gloo on the CPU), against an uninterrupted run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from fastdata.converters.convert import convert
from tests.helpers import REPO, plain_folder

# one rank of `fit` over the set argv[1] with checkpoints in argv[2]; argv[3]: batch size,
# argv[4]: accumulation, argv[5]: max_steps (0: none). Every sample is its own class, so the
# per-epoch label counts in the logs say which samples each rank read. No BatchNorm and no
# random augmentation: what each optimizer step computes then depends only on its samples.
RANK_SCRIPT = textwrap.dedent("""
    import sys, torch
    from torch import nn
    import fastdata
    from fastdata.train import TrainStep, distributed, fit, make_scheduler
    info = distributed.setup(device="cpu")
    path, ck, batch, accum, stop = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    loader = fastdata.Loader(path, batch_size=batch, device="cpu", num_workers=0, seed=4,
                             augment=False, size=8)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                          nn.Linear(32, len(loader.dataset.classes)))
    model = distributed.wrap(model, info, channels_last=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    sched = make_scheduler(opt, "cosine", total_steps=2 * len(loader) // accum,
                           warmup_steps=1)
    step = TrainStep(model, opt, precision="fp32", accum_steps=accum, scheduler=sched,
                     channels_last=False)
    fit(step, loader, epochs=2, checkpoint_dir=ck, log_every=0, progress=False,
        max_steps=stop or None)
    distributed.teardown()
    """)


def _run(script, shards, ck, world: int, batch: int, accum: int, stop: int = 0) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", str(world), str(script), shards, str(ck),
                        str(batch), str(accum), str(stop)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stderr


def _records(ck, world: int) -> list[dict]:
    return [json.loads(line) for r in range(world)
            for line in (ck / f"log-rank{r}.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def one_per_class(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("elastic")
    src = plain_folder(tmp / "src", classes=tuple(f"c{i:02d}" for i in range(48)),
                       per_class=1, size=(10, 10))
    out = str(tmp / "shards")
    convert(src, out, sizes=[8], shard_size=10, num_workers=1, progress=False)
    return out


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    path = tmp_path_factory.mktemp("elastic-script") / "rank.py"
    path.write_text(RANK_SCRIPT)
    return path


@pytest.fixture(scope="module")
def whole(one_per_class, script, tmp_path_factory) -> dict:
    """The checkpoint at the end of an uninterrupted run on 4 ranks."""
    ck = tmp_path_factory.mktemp("whole")
    _run(script, one_per_class, ck, 4, 2, 3)
    return torch.load(ck / "last.pt", weights_only=True)


def test_stopped_and_resumed_on_4_ranks_is_bit_exact(one_per_class, script, whole, tmp_path):
    """Over more than two ranks the all-reduce's sums depend on where a gradient sits in DDP's
    buckets, which DDP rebuilds after a run's first step: ``fit`` has them rebuilt before a
    resumed run's first step too."""
    _run(script, one_per_class, tmp_path, 4, 2, 3, stop=1)
    _run(script, one_per_class, tmp_path, 4, 2, 3)
    resumed = torch.load(tmp_path / "last.pt", weights_only=True)
    assert resumed["step"]["steps"] == whole["step"]["steps"] == 4
    for k, w in whole["model"].items():
        assert torch.equal(resumed["model"][k], w), k


def test_stopped_on_4_ranks_resumed_on_2_then_3_trains_what_an_uninterrupted_run_does(
        one_per_class, script, whole, tmp_path):
    """A global batch of 24 (4 ranks of 2 with accumulation 3; 2 ranks: 6; 3 ranks: 4), 2
    steps an epoch: stopped after step 1 (mid-epoch 0), resumed on 2 ranks and stopped after
    step 3 (mid-epoch 1), finished on 3 ranks."""
    ck = tmp_path / "elastic"
    _run(script, one_per_class, ck, 4, 2, 3, stop=1)
    err = _run(script, one_per_class, ck, 2, 2, 3, stop=3)
    assert "accumulation 6 instead of 3 keeps its global batch of 24" in err
    err = _run(script, one_per_class, ck, 3, 2, 3)
    assert "accumulation 4 instead of 3" in err
    # the samples each epoch's passes read, over all ranks and runs: each one once
    for epoch in (0, 1):
        counts = [r["label_counts"] for r in _records(ck, 4) if r["epoch"] == epoch]
        assert torch.tensor(counts).sum(0).tolist() == [1] * 48, epoch
    elastic = torch.load(ck / "last.pt", weights_only=True)
    assert whole["step"]["steps"] == elastic["step"]["steps"] == 4
    assert whole["optimizer"]["param_groups"][0]["lr"] == \
        pytest.approx(elastic["optimizer"]["param_groups"][0]["lr"], rel=1e-12)
    # the same 24 gradients a step, averaged over other ranks and accumulation windows:
    # float32 sums in another order, so equal to rounding (a different sample would move the
    # weights by ~1e-2)
    for k, w in whole["model"].items():
        torch.testing.assert_close(elastic["model"][k], w, rtol=1e-5, atol=1e-6)


def test_a_layout_that_cannot_keep_the_global_batch_is_named(one_per_class, tmp_path):
    """One process stands in for rank 0 of each layout (``fit`` reads the layout from its
    loader)."""
    import fastdata
    from fastdata.train import TrainStep, fit
    from fastdata.train.models import build_model

    def run(world, batch, accum):
        loader = fastdata.Loader(one_per_class, batch_size=batch, device="cpu", num_workers=0,
                                 rank=0, world_size=world, augment=False)
        model = build_model("tiny", 48)
        step = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.1),
                         precision="fp32", accum_steps=accum)
        fit(step, loader, epochs=2, checkpoint_dir=str(tmp_path), max_steps=1, progress=False,
            log_every=0)
    run(4, 2, 3)
    with pytest.raises(ValueError, match=r"saved by 4 rank\(s\) of batch 2 with accumulation 3, "
                       r"a global batch of 24; 3 rank\(s\) of batch 5 cannot make 24 .*choose a "
                       r"batch size that divides 24 / 3"):
        run(3, 5, 1)
