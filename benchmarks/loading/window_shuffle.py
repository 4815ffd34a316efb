"""How random a shuffle over windows of shards is, and whether training notices: the sample
set (``fastdata demo``'s 6 shape classes) converted into 12 shards of 40, read with a full
shuffle, with ``shuffle_window=W`` and with ``shuffle_window=2, shard_split=4`` (the global
batches of 4 ranks of 8: consecutive 32 of the epoch's order, so one process trains on what 4
ranks would); the demo's recipe trained with each (the shuffle figures of docs/performance.md).

    OPENBLAS_NUM_THREADS=1 python -W ignore -m benchmarks.loading.window_shuffle --seeds 2

Randomness: over 20 epochs, the distinct shards a batch of 32 draws from (full shuffle: nearly
all 12) and the distinct classes it holds (of 6), with the set converted in folder order
(class after class: a window of few shards holds few classes) and with ``shuffle=True``.
Training: resnet8 at 32 px, AdamW 3e-3, OneCycle, RandomResizedCrop (scale 0.35-1) + flip,
batch 32, 15 epochs, fp32 on the CPU; held-out accuracy after the last epoch, per seed.
"""
from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np


def _name(window: int | None, split: int | None) -> str:
    if window is None:
        return "full shuffle"
    return f"shuffle_window={window}" + (f", shard_split={split}" if split else "")


def _randomness(path: str, window: int | None, split: int | None) -> tuple[float, float]:
    import fastdata

    ds = fastdata.open(path)
    loader = fastdata.Loader(ds, batch_size=32, device="cpu", num_workers=0,
                             shuffle_window=window, shard_split=split)
    starts = np.array([s["start"] for s in ds.manifest["shards"]])
    shards, classes = [], []
    for epoch in range(20):
        loader.set_epoch(epoch)
        order = loader.order.permutation()
        for b in range(0, len(order) - 31, 32):
            shards.append(len(np.unique(np.searchsorted(starts, order[b:b + 32], "right"))))
            classes.append(len(np.unique(ds.labels[order[b:b + 32]])))
    return float(np.mean(shards)), float(np.mean(classes))


def _train(path: str, val: str, window: int | None, split: int | None, seed: int) -> float:
    import torch

    import fastdata
    from fastdata.train import TrainStep, evaluate, fit, make_scheduler
    from fastdata.train.models import build_model

    torch.manual_seed(seed)
    loader = fastdata.Loader(path, batch_size=32, device="cpu", num_workers=2, seed=seed,
                             scale=(0.35, 1.0), shuffle_window=window, shard_split=split,
                             size=32)
    held = fastdata.Loader(val, batch_size=64, train=False, device="cpu", size=32)
    model = build_model("resnet8", len(loader.dataset.classes))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=5e-4)
    sched = make_scheduler(opt, "onecycle", total_steps=15 * len(loader))
    step = TrainStep(model, opt, precision="fp32", scheduler=sched, channels_last=True)
    fit(step, loader, epochs=15, log_every=0, progress=False)
    return evaluate(step, held)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--window", type=int, nargs="+", default=[2, 6])
    p.add_argument("--split", type=int, default=4, help="shard_split beside shuffle_window=2")
    a = p.parse_args()
    from fastdata.cli.sample_data import make_sample_folder
    from fastdata.converters.convert import convert

    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        j = lambda *x: os.path.join(tmp, *x)  # noqa: E731
        make_sample_folder(j("train"), per_class=80, seed=0)
        make_sample_folder(j("val"), per_class=20, seed=1)
        convert(j("val"), j("val-set"), sizes=[32], progress=False)
        for mixed in (False, True):
            shards = "shards mixed (convert --shuffle)" if mixed else "shards class by class"
            train = j(f"train-{mixed}")
            convert(j("train"), train, sizes=[32], shard_size=40, progress=False, shuffle=mixed)
            split = (2, a.split)
            for w, s in ((None, None), (1, None), (2, None), (4, None), (6, None), split):
                n, classes = _randomness(train, w, s)
                print(f"{shards}, {_name(w, s)}: {n:.1f} shards and {classes:.1f} classes a "
                      f"batch of 32", flush=True)
            for seed in range(a.seeds):
                for w, s in ((None, None), *((w, None) for w in a.window), split):
                    acc = _train(train, j("val-set"), w, s, seed)
                    print(f"{shards}, seed {seed}, {_name(w, s)}: held-out accuracy {acc:.3f}",
                          flush=True)


if __name__ == "__main__":
    main()
