"""``fastdata demo``: draw the sample set, convert it, train on it, bench the loaders."""

from __future__ import annotations

import argparse
import os

from fastdata.cli import bench, train
from fastdata.cli.common import log
from fastdata.cli.info import info_dict, print_info
from fastdata.cli.sample_data import make_sample_folder

HELP = "draw a sample dataset, convert it, train on it"


def run(a) -> int:
    """Draw the sample set, convert it (HDF5 + LMDB), train on it, bench the loaders."""
    from fastdata._optional import available
    from fastdata.converters.convert import convert

    root = os.path.abspath(a.dir)
    j = lambda *p: os.path.join(root, *p)  # noqa: E731
    for split, per_class, seed in (("train", a.per_class, 0),
                                   ("val", max(1, a.per_class // 4), 1)):
        if not os.path.isdir(j("images", split)):
            log.info("drawing the sample %s images in %s", split, j("images", split))
            make_sample_folder(j("images", split), per_class=per_class, seed=seed)
    for split, container in (("train", "hdf5"), ("train", "lmdb"), ("val", "hdf5")):
        out = j(f"{split}-{container}")
        convert(j("images", split), out, container=container, sizes=[32, 64], overwrite=True,
                progress=not a.quiet)
        print_info(info_dict(out))

    last = train.train_run(options(train.add_args, a, j("train-hdf5"), "--val", j("val-hdf5"),
                                   "--size", 32,
                         "--epochs", a.epochs, "--min-scale", 0.35, "--batch-size", 32,
                         "--optimizer", "adamw", "--lr", 0.003, "--log-every", 0,
                         "--device", "cpu"))
    if last.get("val_acc", 0) <= 1.5 / 6:
        log.warning("held-out accuracy %.3f is not clearly above chance (0.167)",
                    last.get("val_acc", 0))
    plot = ["--plot", j("bench.png")] if available("matplotlib")[0] else []
    if not plot:
        log.warning("no plot: matplotlib is not installed (pip install 'fastdata-shards[plot]')")
    bench.bench_run(options(bench.add_args, a, j("train-hdf5"), j("train-lmdb"),
                            "--source", j("images", "train"),
                  "--model", "resnet8", "--batch-size", 32, "--warmup", 3,
                  "--batches", a.bench_batches, "--repeat", 2, "--device", "cpu",
                  "--json", j("bench.json"), *plot))
    return 0


def options(add_args, a, *argv) -> argparse.Namespace:
    """A command's options from its own parser (its defaults), for ``argv``."""
    p = argparse.ArgumentParser()
    add_args(p)
    ns = p.parse_args([str(x) for x in argv])
    ns.quiet = a.quiet
    return ns


def add_args(d: argparse.ArgumentParser) -> None:
    d.add_argument("--dir", default="fastdata-demo", help="working directory")
    d.add_argument("--epochs", type=int, default=15, help="training epochs on the sample set")
    d.add_argument("--per-class", type=int, default=80, help="training images drawn per "
                   "class (held-out: a quarter as many)")
    d.add_argument("--bench-batches", type=int, default=10, help="batches per timed bench run")
