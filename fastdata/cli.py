"""The ``fastdata`` command line: convert, info, verify, train, bench, demo."""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import warnings

from fastdata.checks import printable
from fastdata.env import keep_freed_memory
from fastdata.format import CONTAINERS, ENCODINGS, FITS, check_size, json_text

log = logging.getLogger("fastdata")


def echo(text: str = "") -> None:
    try:
        sys.stdout.write(text + "\n")
    except UnicodeEncodeError:  # a file name that is not UTF-8, or a terminal's narrower code
        enc = sys.stdout.encoding or "utf-8"
        sys.stdout.write((text + "\n").encode(enc, "backslashreplace").decode(enc))


def _size(text: str) -> int:
    try:
        return check_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _sizes(text: str) -> list[int]:
    return [_size(t) for t in text.split(",") if t.strip()]


def _rate(text: str) -> float:
    """A learning rate or weight decay: finite and >= 0 (torch's optimizers let NaN through)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not valid; use a finite number >= 0")
    return value


def _fraction(text: str) -> float:
    """A probability or label smoothing: a number in [0, 1]."""
    value = _rate(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not valid; use a number in [0, 1]")
    return value


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


# ---------------------------------------------------------------- commands
#: ``fastdata convert``'s options that make a shard set what it is, and their defaults
CONVERT_DEFAULTS = {"format": "hdf5", "size": [[256]], "encoding": "raw", "quality": 90,
                    "fit": "crop", "shard_size": None, "labels": None}


def _convert_options(a) -> dict:
    """``convert()``'s keywords from the command line; with ``--resume`` and none of them
    given, those of the conversion being resumed (said in the log)."""
    given = {k: getattr(a, k) for k in CONVERT_DEFAULTS if getattr(a, k) is not None}
    if a.resume and not given:
        from fastdata.converters.convert import saved_options

        found = saved_options(a.out)
        if found is not None:
            saved, where = found
            log.info("resuming with the options recorded in %s: %s", where, " ".join(
                f"--{k.replace('_', '-')} {','.join(map(str, v)) if isinstance(v, list) else v}"
                for k, v in (("format", saved.get("container")), ("size", saved.get("sizes")),
                             ("encoding", saved.get("encoding")),
                             ("quality", saved.get("quality")), ("fit", saved.get("fit")),
                             ("shard_size", saved.get("shard_size")),
                             ("labels", saved.get("labels"))) if v is not None))
            return {k: v for k, v in saved.items() if v is not None}
    o = {**CONVERT_DEFAULTS, **given}
    if "quality" in given and o["encoding"] != "jpeg":
        raise ValueError(f"--quality {a.quality} applies to --encoding jpeg only (this "
                         f"conversion stores {o['encoding']} pixels): leave it out")
    return {"container": o["format"], "sizes": sorted({s for group in o["size"] for s in group}),
            "encoding": o["encoding"], "quality": o["quality"], "fit": o["fit"],
            "shard_size": o["shard_size"], "labels": o["labels"]}


def cmd_convert(a) -> int:
    from fastdata.converters.convert import ConversionError, convert

    try:
        convert(a.src, a.out, **_convert_options(a), workers=a.workers, on_error=a.on_error,
                overwrite=a.overwrite, resume=a.resume, progress=not a.quiet, engine=a.engine,
                address=a.address)
    except ConversionError as e:        # unreadable inputs: the data's fault, no traceback
        log.error("%s", e)
        return 1
    return 0


def info_dict(path: str) -> dict:
    import numpy as np

    from fastdata.readers import ShardSet

    ds = ShardSet(path)
    m = ds.manifest
    labels = ds.labels
    if ds.label_kind == "class":
        counts = np.bincount(labels, minlength=len(ds.classes))
    elif ds.label_kind == "multi_label":        # the images holding each class
        counts = labels.sum(0) if len(labels) else np.zeros(len(ds.classes))
    else:                                       # regression: no count per target
        counts = np.full(len(ds.classes), len(labels))
    return {
        "label_kind": ds.label_kind,
        "path": ds.root, "container": ds.container, "encoding": ds.encoding,
        "quality": m.get("quality"), "sizes": list(ds.sizes), "fit": m["fit"],
        "samples": len(ds), "classes": dict(zip(ds.classes, map(int, counts))),
        "shards": len(m["shards"]), "bytes": sum(s["bytes"] for s in m["shards"]),
        "skipped": m["skipped"], "ignored": m["ignored"], "empty_classes": m["empty_classes"],
        "source": m["source"], "format_version": m["version"],
        "readahead_at_random": ds.readahead,
    }


def print_info(d: dict) -> None:
    enc = d["encoding"] + (f" (quality {d['quality']})" if d["quality"] else "")
    p = printable       # names in a set are not trusted: no escape sequence reaches the terminal
    echo(f"{p(d['path'])}  (from {p(d['source'])})")
    plural = "" if d["shards"] == 1 else "s"
    echo(f"  {d['samples']} sample{'' if d['samples'] == 1 else 's'} in {d['shards']} "
         f"{d['container']} shard{plural}, {enc}, "
         f"sizes {', '.join(map(str, d['sizes']))} (fit: {d['fit']}), "
         f"{_human(d['bytes'])} on disk")
    kind, many = d.get("label_kind", "class"), len(d["classes"]) != 1
    what = {"class": ("class", "classes", ": samples each"),
            "multi_label": ("class", "classes", ", multi-label: samples holding each"),
            "regression": ("regression target", "regression targets", "")}[kind]
    echo(f"  {len(d['classes'])} {what[many]}{what[2]}:")
    names = {p(name): n for name, n in d["classes"].items()}
    width = max(map(len, names), default=0)
    for name, n in names.items():
        echo(f"    {name:<{width}}  {n}" if kind != "regression" else f"    {name}")
    if d["empty_classes"]:
        echo(f"  empty classes (kept so indices match folder names): "
             f"{', '.join(map(p, d['empty_classes']))}")
    echo(f"  skipped (unreadable): {len(d['skipped'])}")
    for s in d["skipped"]:
        echo(f"    {p(s['path'])}: {p(s['reason'])}")
    if d["ignored"]:
        echo("  ignored: " + ", ".join(f"{p(k)}: {v}" for k, v in d["ignored"].items()))
    echo("  out of the page cache, read at random: " + (
        "with readahead (the set fits in half the memory available now)"
        if d["readahead_at_random"] else "without readahead (the set is larger than half the "
        "memory available now): each shuffled epoch reads its samples from the disk"
        + {"hdf5": ", a batch's pages asked for at once",
           "lmdb": ", a batch's pages asked for at once where earlier reads place them"
           if d["encoding"] == "raw" else ""}[d["container"]]))


def cmd_info(a) -> int:
    if a.env:
        from fastdata.env import SIMD_FIX, env_info

        env = env_info()
        if a.json:
            echo(json.dumps(env, indent=1))
        else:
            width = max(map(len, env))
            for k, v in env.items():
                echo(f"{k:>{width}}: {v}")
            if not env["pil_simd"]:
                echo(f"  warning: PIL is not pillow-simd; fix: {SIMD_FIX}")
            if not env["native_kernel"]:
                echo("  warning: fastdata's C kernel was not built (no C compiler at install): "
                     "CPU augmentation runs about half as fast")
        if not a.out:
            return 0
    if not a.out:
        raise SystemExit("fastdata info: give a shard set directory (or --env)")
    d = info_dict(a.out)
    echo(json_text(d)) if a.json else print_info(d)
    return 0


def cmd_verify(a) -> int:
    from fastdata.verify import verify

    problems = verify(a.out, progress=not a.quiet)
    for p in problems:
        echo(f"DAMAGED {printable(p)}")
    n = len(problems)
    echo(f"{a.out}: " + (f"{n} problem{'s' * (n > 1)} found" if n else "OK"))
    if problems:
        import shlex

        from fastdata.format import read_manifest

        source = read_manifest(a.out)["source"]
        damaged = sorted({p.shard for p in problems})
        echo("to redo them (the conversion's options are read from the set):")
        echo("  rm -f " + " ".join(shlex.quote(printable(os.path.join(a.out, n))) for n in damaged))
        echo(f"  fastdata convert {shlex.quote(printable(source))} {shlex.quote(printable(a.out))} "
             f"--resume")
    return 0 if not problems else 1


def _held_out(last: dict, ds) -> str:
    """The evaluation of the last epoch, for the summary line ('' without one)."""
    if "val_mse" in last:
        return f", held-out mean squared error {last['val_mse']:.4g}"
    if "val_acc" not in last:
        return ""
    chance = (f"chance {1 / len(ds.classes):.1%}" if ds.label_kind == "class" else
              "each label counted")
    return f", held-out accuracy {last['val_acc']:.1%} ({chance})"


def train_recipe(a, classes: int, label_kind: str):
    """``fastdata train``'s batch transform from its augmentation options, in the order of
    torchvision's references (MixUp or CutMix last), or None without any.

    Raises:
        ValueError: MixUp, CutMix or label smoothing asked of labels that are not classes.
    """
    from fastdata import transforms as T
    from fastdata.augment import IMAGENET_MEAN

    if label_kind != "class" and (a.mixup_alpha or a.cutmix_alpha or a.label_smoothing):
        raise ValueError(f"--mixup-alpha, --cutmix-alpha and --label-smoothing work on class "
                         f"labels; this set's labels are {label_kind}")
    ops: list = []
    if a.color_jitter:
        ops.append(T.ColorJitter(a.color_jitter, a.color_jitter, a.color_jitter))
    if a.auto_augment == "ta_wide":
        ops.append(T.TrivialAugment())
    if a.random_erase:      # the mean colour: torchvision's 0 after normalising
        ops.append(T.RandomErasing(a.random_erase, value=IMAGENET_MEAN))
    mix = ([T.MixUp(a.mixup_alpha, num_classes=classes)] if a.mixup_alpha else []) + \
        ([T.CutMix(a.cutmix_alpha, num_classes=classes)] if a.cutmix_alpha else [])
    if mix:
        ops.append(mix[0] if len(mix) == 1 else T.RandomChoice(mix))
    return T.Compose(ops) if ops else None


def train_run(a) -> dict:
    """``fastdata train``: returns the last epoch's record (rank 0 prints it)."""
    import torch

    from fastdata.loaders import Loader
    from fastdata.readers import ShardSet
    from fastdata.train import TrainStep, build_model, fit, make_scheduler
    from fastdata.train.step import loss_for
    from fastdata.train import distributed as dist
    from fastdata.train.step import default_precision, input_dtype

    info = dist.setup(device=a.device)
    if info.device.type == "cpu":
        keep_freed_memory()
    try:
        precision = a.precision or default_precision(info.device)
        dtype = input_dtype(precision, info.device)
        common = dict(backend=a.backend, batch_size=a.batch_size, size=a.size, crop=a.crop,
                      device=info.device, dtype=dtype, seed=a.seed, num_workers=a.workers,
                      channels_last=True)   # the model's layout below: no per-step copy
        sset = ShardSet(a.out)
        train = Loader(sset, train=True, scale=(a.min_scale, 1.0), **common,
                       batch_transform=train_recipe(a, len(sset.classes), sset.label_kind))
        val = None
        if a.val:       # evaluated at the size trained on (by default each set's largest)
            held = ShardSet(a.val)
            if train.size not in held.sizes:
                both = set(held.sizes) & set(train.dataset.sizes)
                raise ValueError(f"--val {a.val} stores sizes {', '.join(map(str, held.sizes))}, "
                                 f"not {train.size}, the size trained on: convert it with "
                                 f"--size {train.size} too" +
                                 (f", or train with --size {max(both)}" if both else ""))
            val = Loader(held, train=False, **{**common, "size": train.size})
        if val is not None and val.dataset.classes != train.dataset.classes:
            raise ValueError(f"--val {a.val} has classes {val.dataset.classes}, "
                             f"not the training set's {train.dataset.classes}")
        torch.manual_seed(a.seed)
        # channels_last on every device: on CPU too it was faster for the demo's resnet8
        model = dist.wrap(build_model(a.model, len(train.dataset.classes)), info,
                          channels_last=True)
        if a.optimizer == "sgd":
            opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9, nesterov=True,
                                  weight_decay=a.weight_decay)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
        # optimizer steps in the run (fit also closes each epoch's last, partial window);
        # a bad --accum or --epochs is named by TrainStep and fit below
        total = max(a.epochs, 1) * math.ceil(len(train) / max(a.accum, 1))
        sched = make_scheduler(opt, a.schedule, total_steps=total, warmup_steps=total // 20)
        kind = train.dataset.label_kind
        step = TrainStep(model, opt, precision=precision, accum_steps=a.accum,
                         loss_fn=None if kind == "class" else loss_for(kind),
                         label_smoothing=a.label_smoothing,
                         clip_grad_norm=a.clip_grad_norm, scheduler=sched, compile=a.compile,
                         channels_last=True)
        log.info("rank %d/%d on %s, precision %s: %s", info.rank, info.world_size,
                 info.device, precision, train)
        if not info.is_main:        # one rank's progress is enough; warnings still show
            logging.getLogger("fastdata").setLevel(logging.WARNING)
        try:
            hist = fit(step, train, epochs=a.epochs, eval_loader=val,
                       checkpoint_dir=a.checkpoint, log_every=a.log_every,
                       progress=not a.quiet and info.is_main)
        except KeyboardInterrupt:
            if a.checkpoint is None and info.is_main:   # with one, fit says where it saved
                log.warning("interrupted: nothing saved (with --checkpoint DIR a Ctrl-C "
                            "saves, and the same command resumes from there)")
            raise
        last = hist[-1] if hist else {}
        if info.is_main and last:
            echo(f"trained {a.model} for {a.epochs} epoch{'' if a.epochs == 1 else 's'} on "
                 f"{a.out}: loss {last['loss']:.3f}{_held_out(last, train.dataset)}")
        train.close()
        if val is not None:
            val.close()
        del step, model         # DDP holds its process group: free it before the group goes
        return last
    finally:
        dist.teardown()


def cmd_train(a) -> int:
    train_run(a)
    return 0


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
    bench = Bench(a.out, source=a.source, backends=[b for b in a.backends.split(",") if b],
                  model=a.model, batch_size=a.batch_size, size=a.size, crop=a.crop,
                  warmup=a.warmup, batches=a.batches, repeat=a.repeat, device=a.device,
                  precision=a.precision, num_workers=a.workers)
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


def cmd_bench(a) -> int:
    bench_run(a)
    return 0


def cmd_demo(a) -> int:
    """Draw the sample set, convert it (HDF5 + LMDB), train on it, bench the loaders."""
    from fastdata.converters.convert import convert
    from fastdata._optional import available
    from fastdata.demo import make_sample_folder

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

    def sub(*argv):
        ns = build_parser().parse_args([str(x) for x in argv])
        ns.quiet = a.quiet
        return ns

    last = train_run(sub("train", j("train-hdf5"), "--val", j("val-hdf5"), "--size", 32,
                         "--epochs", a.epochs, "--min-scale", 0.35, "--batch-size", 32,
                         "--optimizer", "adamw", "--lr", 0.003, "--log-every", 0,
                         "--device", "cpu"))
    if last.get("val_acc", 0) <= 1.5 / 6:
        log.warning("held-out accuracy %.3f is not clearly above chance (0.167)",
                    last.get("val_acc", 0))
    plot = ["--plot", j("bench.png")] if available("matplotlib")[0] else []
    if not plot:
        log.warning("no plot: matplotlib is not installed (pip install 'fastdata[plot]')")
    bench_run(sub("bench", j("train-hdf5"), j("train-lmdb"), "--source", j("images", "train"),
                  "--model", "resnet8", "--batch-size", 32, "--warmup", 3,
                  "--batches", a.bench_batches, "--repeat", 2, "--device", "cpu",
                  "--json", j("bench.json"), *plot))
    return 0


# ---------------------------------------------------------------- parser

class _Help(argparse.HelpFormatter):
    """Shows an option's default after its help, unless the help already says it."""

    def _get_help_string(self, action):
        unset = any(action.default is v for v in (None, False, argparse.SUPPRESS))
        if unset or "default" in action.help:
            return action.help
        return f"{action.help} (default %(default)s)"


def add_train_args(t: argparse.ArgumentParser) -> None:
    from fastdata.loaders import BACKENDS
    from fastdata.train.fit import SCHEDULES
    from fastdata.train.step import PRECISIONS

    t.add_argument("out", help="training shard set")
    t.add_argument("--val", help="held-out shard set for accuracy after each epoch")
    t.add_argument("--backend", choices=list(BACKENDS), default="torch", help="loader backend")
    t.add_argument("--model", default="resnet8", help="built-in (tiny, resnet8, resnet14), a "
                   "torchvision name, or module:callable(num_classes=...)")
    t.add_argument("--epochs", type=int, default=10, help="passes over the training set")
    t.add_argument("--batch-size", type=int, default=64, help="per process and micro-batch")
    t.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    t.add_argument("--precision", choices=list(PRECISIONS), default=None,
                   help="default: bf16 on CUDA (fp16 without bf16 support), fp32 on CPU")
    t.add_argument("--checkpoint", help="directory for last.pt (resumed from when present) "
                   "and per-rank logs")
    t.add_argument("--size", type=_size, default=None,
                   help="stored size to read (default: the largest)")
    t.add_argument("--crop", type=int, default=None, help="output crop (default: the size)")
    t.add_argument("--min-scale", type=float, default=0.08,
                   help="smallest RandomResizedCrop area fraction")
    t.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd", help="optimizer")
    t.add_argument("--lr", type=_rate, default=0.1, help="peak learning rate")
    t.add_argument("--weight-decay", type=_rate, default=5e-4, help="weight decay")
    t.add_argument("--schedule", choices=SCHEDULES, default="onecycle",
                   help="learning-rate schedule")
    t.add_argument("--clip-grad-norm", type=float, default=None,
                   help="clip the gradient norm to this (default: no clipping)")
    t.add_argument("--workers", type=int, default=None,
                   help="loader threads per process (default: min(8, usable cores))")
    t.add_argument("--device", default=None, help="default: cuda:LOCAL_RANK when available")
    t.add_argument("--seed", type=int, default=0, help="seed of the sample order and the model")
    t.add_argument("--compile", action="store_true", help="torch.compile the model")
    t.add_argument("--log-every", type=int, default=50, help="batches between loss logs")
    g = t.add_argument_group("augmentation after the crop, as a batch transform on the output "
                             "device (torchvision's reference recipe's options)")
    g.add_argument("--color-jitter", type=_rate, default=0.0, metavar="V",
                   help="ColorJitter of brightness, contrast and saturation V (0: none)")
    g.add_argument("--auto-augment", choices=("ta_wide",), default=None,
                   help="ta_wide: TrivialAugmentWide, an operation per image")
    g.add_argument("--random-erase", type=_fraction, default=0.0, metavar="P",
                   help="RandomErasing with probability P, filled with the mean colour")
    g.add_argument("--mixup-alpha", type=_rate, default=0.0, metavar="A",
                   help="MixUp with Beta(A, A) (0: none; with --cutmix-alpha, one per batch)")
    g.add_argument("--cutmix-alpha", type=_rate, default=0.0, metavar="A",
                   help="CutMix with Beta(A, A) (0: none)")
    g.add_argument("--label-smoothing", type=_fraction, default=0.0, metavar="E",
                   help="cross-entropy's label smoothing (class labels)")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The CLI; given the ``command`` about to run, the others' torch-dependent options (the
    names of backends and precisions) are left out, so convert/info/verify start without torch.
    """
    full = command not in ("convert", "info", "verify")
    p = argparse.ArgumentParser(prog="fastdata", description="Image shards and fast loaders "
                                "for PyTorch training.")
    quiet = dict(action="store_true", help="no progress bars or info logs")
    p.add_argument("-q", "--quiet", **quiet)
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, **kw) -> argparse.ArgumentParser:
        s = sub.add_parser(name, formatter_class=_Help, **kw)
        s.add_argument("-q", "--quiet", default=argparse.SUPPRESS, **quiet)  # after it too
        return s

    c = add("convert", help="pack an image folder (root/<class>/...) into shards")
    c.add_argument("src", help="image folder, ImageFolder layout (any layout with --labels)")
    c.add_argument("out", help="output directory for the shard set")
    resumed = " (with --resume and none of the options that shape the set: the ones it was " \
        "started with)"
    c.add_argument("--format", choices=CONTAINERS, default=None,
                   help="container (default hdf5)")
    c.add_argument("--size", type=_sizes, action="append", metavar="S[,S...]",
                   help="stored square size(s), powers of two >= 8; repeatable (default 256)")
    c.add_argument("--encoding", choices=ENCODINGS, default=None,
                   help="raw uint8 pixels or JPEG records (default raw)")
    c.add_argument("--quality", type=int, default=None,
                   help="JPEG quality, 1-100, for --encoding jpeg (default 90)")
    c.add_argument("--fit", choices=FITS, default=None,
                   help="non-square images: crop (shorter side, centre crop), pad, stretch "
                   "(default crop)")
    c.add_argument("--labels", default=None, metavar="FILE.csv",
                   help="labels from a CSV file instead of class folders: a header `path,label` "
                        "(a class per image), `path,<class>,...` (0/1: multi-label) or "
                        "`path,<target>,...` (numbers: regression); paths relative to SRC")
    c.add_argument("--workers", type=int, default=None, help="decode processes (default: "
                   "the cores this process may use)")
    c.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="where shards are made: local decode processes, or a task per shard "
                        "on a Ray cluster (needs fastdata[ray]; the same shards)")
    c.add_argument("--address", default=None, help="the Ray cluster's address for --engine "
                   "ray (default: RAY_ADDRESS, or a local cluster started for the run)")
    c.add_argument("--shard-size", type=int, default=None,
                   help="source files per shard: a shard holds the readable ones of its "
                        "range (default: ~256 MiB of raw data per shard)")
    c.add_argument("--on-error", choices=("skip", "raise"), default="skip",
                   help="unreadable inputs: skip and report them, or stop")
    g = c.add_mutually_exclusive_group()
    g.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT")
    g.add_argument("--resume", action="store_true", help="finish an interrupted conversion, or "
                   "redo the shards of a finished one that are missing" + resumed)
    c.set_defaults(func=cmd_convert)

    i = add("info", help="describe a shard set (or the environment with --env)")
    i.add_argument("out", nargs="?", help="shard set directory (with manifest.json)")
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.add_argument("--env", action="store_true", help="versions, pillow-simd check, GPU")
    i.set_defaults(func=cmd_info)

    v = add("verify", help="recompute checksums, decode every JPEG")
    v.add_argument("out", help="shard set directory (with manifest.json)")
    v.set_defaults(func=cmd_verify)

    t = add("train", help="train a model on a shard set (torchrun for DDP)")
    t.set_defaults(func=cmd_train)
    b = add("bench", help="loader and model throughput vs a PIL baseline and the model's "
            "ceiling")
    b.set_defaults(func=cmd_bench)
    if full:
        add_train_args(t)
        add_bench_args(b)

    d = add("demo", help="draw a sample dataset, convert it, train on it")
    d.add_argument("--dir", default="fastdata-demo", help="working directory")
    d.add_argument("--epochs", type=int, default=15, help="training epochs on the sample set")
    d.add_argument("--per-class", type=int, default=80, help="training images drawn per "
                   "class (held-out: a quarter as many)")
    d.add_argument("--bench-batches", type=int, default=10, help="batches per timed bench run")
    d.set_defaults(func=cmd_demo)
    return p


def add_bench_args(b: argparse.ArgumentParser) -> None:
    from fastdata.train.step import PRECISIONS

    b.add_argument("out", nargs="+", help="shard set(s): torch and dali run on each, so one "
                   "run compares containers and encodings")
    b.add_argument("--source", help="image folder for the baseline (default: the manifest's "
                   "source, when it still exists)")
    b.add_argument("--backends", default="baseline,torch,dali",
                   help="comma-separated: baseline, torch, dali")
    b.add_argument("--model", default="none", help="none, a built-in (tiny, resnet8, "
                   "resnet14), a torchvision name (resnet18, resnet50...) or module:callable")
    b.add_argument("--batch-size", type=int, default=64, help="images per batch")
    b.add_argument("--size", type=_size, default=None,
                   help="stored size to read (default: the largest)")
    b.add_argument("--crop", type=int, default=None, help="training crop (default min(224, "
                   "size))")
    b.add_argument("--warmup", type=int, default=5, help="batches before timing")
    b.add_argument("--batches", type=int, default=50, help="batches per timed run")
    b.add_argument("--repeat", type=int, default=3, help="timed runs; the table shows their "
                   "median and their spread (default 3)")
    b.add_argument("--precision", choices=list(PRECISIONS), default=None,
                   help="default: bf16 on CUDA (fp16 without bf16 support), fp32 on CPU")
    b.add_argument("--workers", type=int, default=None,
                   help="each backend's workers: threads, DALI threads, baseline "
                   "processes (default: min(8, usable cores))")
    b.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    b.add_argument("--cpus", default=None, metavar="LIST",
                   help="run the whole bench (loaders, their workers and the model's thread) "
                   "on these host cores only, e.g. 0-3: what a GPU gets from its share of a "
                   "node (default: every core this process may use)")
    b.add_argument("--json", help="write every figure and the environment here")
    b.add_argument("--plot", help="write a PNG bar chart here (needs fastdata[plot])")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = build_parser(next((x for x in argv if not x.startswith("-")), None)).parse_args(argv)
    logging.basicConfig(level=logging.WARNING if a.quiet else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    # a command's warnings in one line each, as its logs (not the library's file and line)
    warnings.formatwarning = lambda message, category, *_, **__: \
        f"WARNING {category.__name__}: {message}\n"
    try:
        return a.func(a)
    except BrokenPipeError:     # `fastdata info out/ | head`: the reader left, as for any tool
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # no error at exit
        return 141
    except (ValueError, OSError, ImportError) as e:     # bad input or damaged data: no traceback
        log.error("%s", e)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
