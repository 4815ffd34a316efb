"""``fastdata train``: a model trained on a shard set with fastdata's step, under torchrun for
several processes."""

from __future__ import annotations

import argparse
import logging
import math

from fastdata.cli.common import echo, fraction_arg, log, rate_arg, size_arg
from fastdata.env import keep_freed_memory

HELP = "train a model on a shard set (torchrun for DDP)"


def _held_out(last: dict, ds) -> str:
    """The evaluation of the last epoch, for the summary line ('' without one)."""
    if "val_mse" in last:
        return f", held-out mean squared error {last['val_mse']:.4g}"
    if "val_acc" not in last:
        return ""
    chance = (f"chance {1 / len(ds.classes):.1%}" if ds.label_kind == "class" else
              "of the labelled pixels" if ds.label_kind == "segmentation" else
              "each label counted")
    return f", held-out accuracy {last['val_acc']:.1%} ({chance})"


def _loaders(a, sset, device, dtype) -> tuple:
    """``fastdata train``'s training loader over ``sset`` and its held-out one (None without
    ``--val``)."""
    from fastdata.loader import Loader
    from fastdata.shards import ShardSet
    from fastdata.train.models import default_crop
    from fastdata.train.recipes import train_recipe

    crop = a.crop
    if crop is None:
        size = sset.size if a.size is None else sset.stored_size(a.size)
        crop = default_crop(a.model, size)
        log.info("crop %d: %s's default from images stored at %d px (--crop to choose)",
                 crop, a.model, size)
    common = dict(backend=a.backend, batch_size=a.batch_size, size=a.size, crop=crop,
                  device=device, dtype=dtype, seed=a.seed, num_workers=a.workers,
                  channels_last=True)   # the model's layout: no per-step copy
    train = Loader(sset, train=True, scale=(a.min_scale, 1.0), **common,
                   shuffle_window=a.shuffle_window, shard_split=a.shard_split,
                   batch_transform=train_recipe(a, len(sset.classes), sset.label_kind))
    if not a.val:
        return train, None
    held = ShardSet(a.val)      # evaluated at the size trained on (each set's largest default)
    if train.size not in held.sizes:
        both = set(held.sizes) & set(train.dataset.sizes)
        raise ValueError(f"--val {a.val} stores sizes {', '.join(map(str, held.sizes))}, "
                         f"not {train.size}, the size trained on: convert it with "
                         f"--size {train.size} too" +
                         (f", or train with --size {max(both)}" if both else ""))
    if held.classes != train.dataset.classes:
        raise ValueError(f"--val {a.val} has classes {held.classes}, "
                         f"not the training set's {train.dataset.classes}")
    return train, Loader(held, train=False, **{**common, "size": train.size})


def train_run(a) -> dict:
    """``fastdata train``: returns the last epoch's record (rank 0 prints it)."""
    import torch

    from fastdata.train import TrainStep, build_model, fit, make_scheduler
    from fastdata.train import distributed as dist
    from fastdata.train.step import default_precision, input_dtype, loss_for

    info = dist.setup(device=a.device)
    if info.device.type == "cpu":
        keep_freed_memory()
    try:
        precision = a.precision or default_precision(info.device)
        dtype = input_dtype(precision, info.device)
        from fastdata.shards import ShardSet

        sset = ShardSet(a.shards)
        torch.manual_seed(a.seed)
        net = build_model(a.model, len(sset.classes))     # a bad --model named before anything
        train, val = _loaders(a, sset, info.device, dtype)
        # channels_last on every device: on CPU too it was faster for the demo's resnet8
        model = dist.wrap(net, info, channels_last=True)
        opt: torch.optim.Optimizer
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
                         loss_fn=None if kind in ("class", "detection") else loss_for(kind),
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
                 f"{a.shards}: loss {last['loss']:.3f}{_held_out(last, train.dataset)}")
        train.close()
        if val is not None:
            val.close()
        del step, model         # DDP holds its process group: free it before the group goes
        return last
    finally:
        dist.teardown()


def run(a) -> int:
    train_run(a)
    return 0


def add_args(t: argparse.ArgumentParser) -> None:
    from fastdata.loader import BACKENDS
    from fastdata.train.fit import SCHEDULES
    from fastdata.train.step import PRECISIONS

    t.add_argument("shards", help="training shard set: its folder or URL (s3://, gs://, az://, "
                   "http(s)://)")
    t.add_argument("--val", help="held-out shard set (folder or URL) for accuracy after each "
                   "epoch")
    t.add_argument("--backend", choices=list(BACKENDS), default="torch", help="loader backend")
    t.add_argument("--model", default="resnet8", help="built-in: tiny (a very small net, "
                   "for checking a pipeline), resnet8 or resnet14 (small ResNets for small "
                   "images: trained at up to 64 px by default), tiny_detector or "
                   "tiny_segmenter (for detection and segmentation sets); a torchvision name "
                   "(resnet50...: up to 224 px by default); or module:callable(num_classes=...)")
    t.add_argument("--epochs", type=int, default=10, help="passes over the training set")
    t.add_argument("--batch-size", type=int, default=64, help="per process and micro-batch")
    t.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    t.add_argument("--precision", choices=list(PRECISIONS), default=None,
                   help="default: bf16 on CUDA (fp16 without bf16 support), fp32 on CPU")
    t.add_argument("--checkpoint", help="directory for last.pt (resumed from when present) "
                   "and per-rank logs")
    t.add_argument("--size", type=size_arg, default=None,
                   help="stored size to read (default: the largest)")
    t.add_argument("--crop", type=int, default=None, help="output crop (default: the stored "
                   "size, at most 64 for a built-in model and 224 for any other)")
    t.add_argument("--shuffle-window", type=int, default=None, metavar="W",
                   help="shuffle within windows of W shards (a bucket's set: the first batch "
                        "needs one window; docs/loading.md)")
    t.add_argument("--shard-split", type=int, default=None, metavar="P",
                   help="cut each epoch's shards into P runs, one a rank (set it to the world "
                        "size): a node downloads only its ranks' shards")
    t.add_argument("--min-scale", type=float, default=0.08,
                   help="smallest RandomResizedCrop area fraction")
    t.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd", help="optimizer")
    t.add_argument("--lr", type=rate_arg, default=0.1, help="peak learning rate")
    t.add_argument("--weight-decay", type=rate_arg, default=5e-4, help="weight decay")
    t.add_argument("--schedule", choices=SCHEDULES, default="onecycle",
                   help="learning-rate schedule")
    t.add_argument("--clip-grad-norm", type=float, default=None,
                   help="clip the gradient norm to this (default: no clipping)")
    # the Loader's num_workers (its `workers` is a kind: threads or processes)
    t.add_argument("--num-workers", "--workers", dest="workers", type=int, default=None,
                   help="loader threads per process (default: min(8, usable cores))")
    t.add_argument("--device", default=None, help="default: cuda:LOCAL_RANK when available")
    t.add_argument("--seed", type=int, default=0, help="seed of the sample order and the model")
    t.add_argument("--compile", action="store_true", help="torch.compile the model")
    t.add_argument("--log-every", type=int, default=50, help="batches between loss logs")
    g = t.add_argument_group("augmentation after the crop, as a batch transform on the output "
                             "device (torchvision's reference recipe's options)")
    g.add_argument("--color-jitter", type=rate_arg, default=0.0, metavar="V",
                   help="ColorJitter of brightness, contrast and saturation V (0: none)")
    g.add_argument("--auto-augment", choices=("ta_wide",), default=None,
                   help="ta_wide: TrivialAugmentWide, an operation per image")
    g.add_argument("--random-erase", type=fraction_arg, default=0.0, metavar="P",
                   help="RandomErasing with probability P, filled with the mean colour")
    g.add_argument("--mixup-alpha", type=rate_arg, default=0.0, metavar="A",
                   help="MixUp with Beta(A, A) (0: none; with --cutmix-alpha, one per batch)")
    g.add_argument("--cutmix-alpha", type=rate_arg, default=0.0, metavar="A",
                   help="CutMix with Beta(A, A) (0: none)")
    g.add_argument("--label-smoothing", type=fraction_arg, default=0.0, metavar="E",
                   help="cross-entropy's label smoothing (class labels)")
