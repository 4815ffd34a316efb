"""``fastdata bench``: loaders against a plain PIL pipeline and the model's ceiling."""

from __future__ import annotations

import argparse
import os

from fastdata.cli.common import echo, size_arg
from fastdata.env import keep_freed_memory

HELP = "loader and model throughput vs a PIL baseline and the model's ceiling"


def bench_run(a) -> dict:
    from fastdata.bench import Bench, check_plot_path, plot, table

    for opt, path in (("--json", a.json), ("--plot", a.plot)):    # before minutes of timing
        folder = os.path.dirname(os.path.abspath(path)) if path else None
        if folder and not os.path.isdir(folder):
            raise ValueError(f"{opt} {path}: folder {folder} does not exist")
    if a.plot:
        check_plot_path(a.plot)
    if a.cpus:              # before any thread or worker starts: they all inherit it
        from fastdata.env import confine, parse_cpus

        confine(parse_cpus(a.cpus))
    bench = Bench(a.shards, source=a.source, backends=[b for b in a.backends.split(",") if b],
                  model=a.model, batch_size=a.batch_size, size=a.size, crop=a.crop,
                  warmup=a.warmup, batches=a.batches, repeat=a.repeat, device=a.device,
                  precision=a.precision, num_workers=a.workers, profile=a.profile,
                  compile=a.compile or False, model_threads=a.model_threads)
    if bench.device.type == "cpu":
        keep_freed_memory()
    report = bench.run(progress=not a.quiet)
    echo(table(report))
    if a.json:
        from fastdata.format import write_json_atomic

        write_json_atomic(a.json, report)
        echo(f"figures: {a.json}")
    if a.plot:
        plot(report, a.plot)
        echo(f"plot: {a.plot}")
    if report["interrupted"]:
        raise KeyboardInterrupt     # exit 130 (also ends a demo), after the figures are out
    return report


def run(a) -> int:
    bench_run(a)
    return 0


def add_args(b: argparse.ArgumentParser) -> None:
    from fastdata.train.step import PRECISIONS

    b.add_argument("shards", nargs="+", help="shard set(s), folders or URLs (s3://, gs://, az://, "
                   "http(s)://): torch and dali run on each, so one "
                   "run compares containers and encodings")
    b.add_argument("--source", help="image folder for the baseline (default: the manifest's "
                   "source, when it still exists)")
    b.add_argument("--backends", default="baseline,torch,dali",
                   help="comma-separated: baseline, torch, dali")
    b.add_argument("--model", default="none", help="none, a built-in (tiny, resnet8, "
                   "resnet14; tiny_detector, tiny_segmenter), a torchvision name (resnet18, "
                   "resnet50...) or module:callable")
    b.add_argument("--batch-size", type=int, default=64, help="images per batch")
    b.add_argument("--size", type=size_arg, default=None,
                   help="stored size to read (default: the largest)")
    b.add_argument("--crop", type=int, default=None, help="training crop (default min(224, "
                   "size))")
    b.add_argument("--warmup", type=int, default=5, help="batches before timing")
    b.add_argument("--batches", type=int, default=50, help="batches per timed run")
    b.add_argument("--repeat", type=int, default=3, help="timed runs; the table shows their "
                   "median and their spread (default 3)")
    b.add_argument("--precision", choices=list(PRECISIONS), default=None,
                   help="default: bf16 on CUDA (fp16 without bf16 support), fp32 on CPU")
    b.add_argument("--num-workers", "--workers", dest="workers", type=int, default=None,
                   help="each backend's workers: threads, DALI threads, baseline "
                   "processes (default: min(8, usable cores))")
    b.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    b.add_argument("--cpus", default=None, metavar="LIST",
                   help="run the whole bench (loaders, their workers and the model's thread) "
                   "on these host cores only, e.g. 0-3: what a GPU gets from its share of a "
                   "node (default: every core this process may use)")
    b.add_argument("--model-threads", type=int, default=None, metavar="N",
                   help="on a CPU, the threads the model's step runs on, fed and ceiling alike "
                   "(default 1: with more, their ops spin waiting for one another and the "
                   "runs' times follow whatever else runs on the cores)")
    b.add_argument("--json", help="write every figure and the environment here")
    b.add_argument("--plot", help="write a PNG bar chart here (needs fastdata-shards[plot])")
    b.add_argument("--compile", nargs="?", const=True, default=None, metavar="BACKEND",
                   help="torch.compile the model, fed and ceiling alike (default backend: "
                   "inductor; `--compile eager` only traces it)")
    b.add_argument("--profile", metavar="DIR", help="write a torch.profiler trace of a few "
                   "batches of each row here (<row>.pt.trace.json: TensorBoard's profiler "
                   "plugin or Perfetto show where a step waits)")
