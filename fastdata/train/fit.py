"""A small training loop around ``TrainStep``: epochs, ``set_epoch``, eval accuracy reduced
over ranks, LR schedules, throughput logs, atomic checkpoints and exact resume.

Checkpoints (``checkpoint_dir/last.pt``, written by rank 0 to a temporary file and renamed)
hold the model, optimizer, scheduler, step (scaler + counters), loader position, epoch and the
torch RNG state. They are taken only where an accumulation window closes, every
``checkpoint_every`` optimizer steps and at the end of each epoch (whose last batch closes
its window, full or not: ``TrainStep(..., close_window=True)``), so a resumed run continues
with exactly the batches and parameters an uninterrupted run would have had. Ctrl-C or SIGTERM
(torchrun passes either on to every rank; batch schedulers send SIGTERM before they kill)
saves a checkpoint where the current window closes and then stops; a second one stops that
process at once. With DDP the ranks agree where to stop: at each window's end one CPU
all-reduce of a flag over gloo, which does not wait on the GPU.
Each rank also appends one JSON line per epoch to ``checkpoint_dir/log-rank<r>.jsonl``.
"""
from __future__ import annotations

import json
import logging
import math
import os
import signal
import time
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from fastdata.loader import Loader
from tqdm import tqdm

from fastdata.checks import choice, flag, integer
from fastdata.interrupt import SigintLatch
from fastdata.outdir import FolderLock, replace_atomically
from fastdata.train.distributed import all_reduce_sum, any_rank, barrier, cpu_group
from fastdata.train.step import TrainStep

log = logging.getLogger("fastdata.train")
SCHEDULES = ("none", "onecycle", "cosine")


def make_scheduler(optimizer: torch.optim.Optimizer, name: str, *, total_steps: int,
                   warmup_steps: int = 0) -> torch.optim.lr_scheduler.LRScheduler | None:
    """A learning-rate schedule by name, stepped once per optimizer step.

    Args:
        optimizer: the optimizer whose groups' ``lr`` it moves.
        name: ``none``; ``onecycle`` (peak at each group's ``lr``); ``cosine`` (to 0 after a
            linear warm-up).
        total_steps: optimizer steps in the whole run (its length is fixed: a run resumed
            with another length is refused).
        warmup_steps: the cosine schedule's linear warm-up.

    Returns:
        The scheduler, or None for ``none``.

    Raises:
        ValueError: an unknown ``name`` (the valid ones are named).
    """
    choice("schedule", name, SCHEDULES)
    total_steps = max(1, int(total_steps))
    if name == "none":
        return None
    if name == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=[g["lr"] for g in optimizer.param_groups], total_steps=total_steps)
    warm = min(int(warmup_steps), total_steps - 1)
    sched = torch.optim.lr_scheduler.LambdaLR(optimizer, _WarmupCosine(total_steps, warm))
    # in its state_dict, as OneCycleLR's: checked on resume
    sched.total_steps = total_steps  # type: ignore[attr-defined]
    return sched


class _WarmupCosine:
    """LambdaLR's factor of the cosine schedule: an object, so that LambdaLR saves its length
    with its state and a run resumed on another layout keeps the saved one."""

    def __init__(self, total_steps: int, warmup_steps: int):
        self.total_steps, self.warmup_steps = total_steps, warmup_steps

    def __call__(self, s: int) -> float:
        warm = self.warmup_steps
        if s < warm:
            return (s + 1) / (warm + 1)
        return 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, self.total_steps - warm)))


@torch.no_grad()
def evaluate(step: TrainStep, loader: Loader) -> float:
    """Score ``step``'s model over ``loader``, summed over all ranks (one host sync at the end).

    Args:
        step: the ``TrainStep`` whose model is scored (in eval mode, restored after).
        loader: a ``Loader`` with ``train=False`` (every sample once across the ranks).

    Returns:
        Top-1 accuracy for class labels, the share of labels right (logit > 0 for 1) for
        multi-label targets, the mean squared error for regression targets, the share of
        labelled pixels right for class maps.
    """
    model = step.module
    was_training = model.training
    model.eval()
    sums = torch.zeros(2, dtype=torch.float64, device=step.device)
    for images, labels in loader:
        if step.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with step.autocast():
            out = model(images)
        if labels.dim() == 3:       # class maps: the share of labelled pixels right
            labelled = labels != 255
            sums[0] += ((out.argmax(1) == labels) & labelled).sum()
            sums[1] += labelled.sum()
            continue
        if labels.dim() == 1:
            sums[0] += (out.argmax(1) == labels).sum()
        elif loader.dataset.label_kind == "multi_label":
            sums[0] += ((out > 0) == (labels > 0.5)).sum()
        else:
            sums[0] += (out.float() - labels).square().sum()
        sums[1] += labels.numel()
    model.train(was_training)
    total, n = all_reduce_sum(sums).tolist()
    return total / max(n, 1)


def _count(seen: torch.Tensor, labels: torch.Tensor) -> None:
    """Add a batch's labels to the samples seen per class (soft and multi-hot rows by their
    mass), on the device: ``bincount`` would sync on CUDA."""
    if isinstance(labels, (list, dict)):       # detection targets: their boxes' classes
        k = labels["labels"] if isinstance(labels, dict) else torch.cat(
            [t["labels"] for t in labels])
        seen.index_add_(0, (k - 1).clamp(min=0).flatten(), (k >= 1).flatten().to(seen.dtype))
    elif labels.dim() == 1:
        seen.index_add_(0, labels, torch.ones_like(labels, dtype=seen.dtype))
    elif labels.dim() == 2 and labels.shape[1] == len(seen):     # not a class map's pixels
        seen += labels.sum(0)


def _scores(step: TrainStep, loader) -> dict:
    """The evaluation's record: ``val_mse`` for regression targets, ``val_acc`` for class and
    multi-label sets; none for detection sets (their metrics, mAP, are the caller's)."""
    kind = loader.dataset.label_kind
    if kind == "detection":
        return {}
    return {"val_mse" if kind == "regression" else "val_acc": evaluate(step, loader)}


def _scores_text(rec: dict) -> str:
    return "".join(f", {k.replace('_', ' ')} {rec[k]:.3f}" for k in ("val_acc", "val_mse")
                   if k in rec)


def _save(path: str, state: dict) -> None:
    replace_atomically(path, lambda tmp: torch.save(state, tmp))


def _lock(checkpoint_dir: str, rank: int, group) -> FolderLock | None:
    """Rank 0 locks the checkpoint folder for the run (two runs would overwrite each other's
    checkpoints); every rank raises if it could not, so that none waits for it."""
    lock, error = None, None
    if rank == 0:
        try:
            lock = FolderLock(checkpoint_dir, "fastdata train").acquire()
        except OSError as e:
            error = e
    if any_rank(error is not None, group):
        raise error or RuntimeError(f"rank 0 could not lock {checkpoint_dir}: see its log")
    return lock


def _append_log(path: str, rec: dict) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0),
                 0o644)
    with os.fdopen(fd, "a") as f:
        f.write(json.dumps(rec) + "\n")


def fit(step: TrainStep, loader: Loader, *, epochs: int, eval_loader: Loader | None = None,
        checkpoint_dir: str | None = None, checkpoint_every: int | None = None,
        resume: bool = True, log_every: int = 50, max_steps: int | None = None,
        progress: bool = True) -> list[dict]:
    """Train for ``epochs``; returns one record per epoch run here (loss, img/s, val_acc…).

    Args:
        step: the model, optimizer and schedule (``TrainStep``).
        loader: the training ``Loader`` (its ``set_epoch`` is called each epoch).
        epochs: passes over the training set, in all (a resumed run trains the rest).
        eval_loader: a ``Loader`` with ``train=False``, evaluated after each epoch
            (``evaluate``).
        checkpoint_dir: folder of ``last.pt`` (resumed from when ``resume``) and per-rank logs;
            locked for the run. None: no checkpoints.
        checkpoint_every: optimizer steps between checkpoints within an epoch.
        log_every: batches between loss logs (and the progress bar's loss); 0: none.
        max_steps: stop after that many optimizer steps in total (the checkpoint is written
            first), e.g. to split a run.
        progress: a progress bar per epoch on rank 0 (images/s, loss at each log).

    Returns:
        One record per epoch run here (loss, images_per_s, val_acc, ...).

    Raises:
        ValueError: a bad argument, a checkpoint of another run or not fastdata's, or one
            of another world size or batch size whose global batch this layout cannot make
            (where it can, the accumulation is set to keep it: ``docs/loading.md``, "Resuming
            on another layout").
        FolderBusyError: another run holds ``checkpoint_dir``.
        KeyboardInterrupt: Ctrl-C or SIGTERM, after saving where the window closed.
    """
    import torch.distributed as dist

    integer("epochs", epochs, 1)
    integer("log_every", log_every, 0)
    integer("checkpoint_every", checkpoint_every, 1, optional=True)
    integer("max_steps", max_steps, 1, optional=True)
    flag("progress", progress)
    if len(loader) == 0:
        raise ValueError(f"no full training batch per epoch: {loader!r}; use a smaller batch "
                         f"size")
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    if step.device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    ckpt = os.path.join(checkpoint_dir, "last.pt") if checkpoint_dir else None
    if checkpoint_dir:
        if os.path.exists(checkpoint_dir) and not os.path.isdir(checkpoint_dir):
            raise ValueError(f"checkpoint_dir={checkpoint_dir!r} is a file: give a folder (its "
                             f"last.pt is written there)")
        os.makedirs(checkpoint_dir, exist_ok=True)
    group = cpu_group() if ckpt else None
    lock = None
    try:
        lock = _lock(checkpoint_dir, rank, group) if checkpoint_dir else None
        return _fit(step, loader, epochs=epochs, eval_loader=eval_loader, ckpt=ckpt,
                    checkpoint_every=checkpoint_every, resume=resume, log_every=log_every,
                    max_steps=max_steps, rank=rank, group=group,
                    progress=progress and rank == 0)
    finally:
        if lock is not None:
            lock.release()
        if group is not None:
            dist.destroy_process_group(group)


def _fit(step: TrainStep, loader, *, epochs, eval_loader, ckpt, checkpoint_every, resume,
         log_every, max_steps, rank, group, progress) -> list[dict]:
    epoch0, mid = 0, False      # mid: epoch0 resumes after some of its samples
    if ckpt and resume and os.path.exists(ckpt):
        epoch0, mid = _load(ckpt, step, loader)
        if epoch0 >= epochs:
            log.info("nothing left to train: %s is at the end of epoch %d of %d (optimizer "
                     "step %d)", ckpt, epoch0 - 1, epochs, step.steps)
        else:
            log.info("resumed from %s: epoch %d, after %d of its samples (optimizer step %d)",
                     ckpt, epoch0, loader.order.offset if mid else 0, step.steps)
    run = _Run(step, loader, ckpt=ckpt, checkpoint_every=checkpoint_every, log_every=log_every,
               max_steps=max_steps, rank=rank, group=group, progress=progress,
               resumed=bool(ckpt and resume and os.path.exists(ckpt)))
    history = []
    try:
        for epoch in range(epoch0, epochs):
            rec, stopped = run.train_epoch(epoch, mid and epoch == epoch0)
            halt = run.interrupted()    # in the epoch's last window: stop without evaluating
            if eval_loader is not None and not stopped and not halt:
                rec.update(_scores(step, eval_loader))
            history.append(rec)
            run.record(rec)
            if stopped:
                break
            run.save(epoch + 1)
            if halt or run.interrupted():       # (or during the evaluation)
                run.stop(epoch + 1)
    finally:
        run.latch.restore()
    return history


class _Run:
    """One rank's training epochs: progress, loss logs, checkpoints and the agreed stop."""

    def __init__(self, step: TrainStep, loader, *, ckpt, checkpoint_every, log_every, max_steps,
                 rank, group, progress, resumed=False):
        self.step, self.loader, self.ckpt, self.rank, self.group = step, loader, ckpt, rank, group
        self.checkpoint_every, self.log_every, self.max_steps = checkpoint_every, log_every, \
            max_steps
        self.progress = progress
        self.last = len(loader)     # batches of the current pass
        self.settle = resumed       # DDP's buckets made as the uninterrupted run has them
        self.nclass = len(loader.dataset.classes)
        # with checkpoints, Ctrl-C or SIGTERM stops where an accumulation window closes, after
        # saving there (fastdata/interrupt.py), at the same step on every rank
        self.latch = SigintLatch(enabled=bool(ckpt), signals=(signal.SIGINT, signal.SIGTERM))

    def save(self, epoch: int) -> None:
        if self.ckpt and self.step.at_window_end:
            if self.rank == 0:
                _save(self.ckpt, _state(self.step, self.loader, epoch))
            barrier()

    def interrupted(self) -> bool:
        return bool(self.ckpt) and any_rank(self.latch.hit, self.group)

    def stop(self, epoch: int):
        if self.rank == 0:
            log.warning("interrupted (%s): %s saved at epoch %d, step %d; run the same command "
                        "again to resume", self.latch.signal or "on another rank", self.ckpt,
                        epoch, self.step.steps)
        raise KeyboardInterrupt

    def train_epoch(self, epoch: int, resumed: bool) -> tuple[dict, bool]:
        """Epoch ``epoch`` (the rest of it where ``resumed``); returns its record and whether
        ``max_steps`` stopped it."""
        step, loader = self.step, self.loader
        loader.set_epoch(epoch)
        step.model.train()
        # samples a class was the label of (float: soft and multi-hot targets count by mass)
        seen = torch.zeros(self.nclass, dtype=torch.float64, device=step.device)
        self.loss_sum = self.n_sum = 0.0
        t0 = self.t_log = time.perf_counter()
        stopped = False
        order = loader.order
        last = loader.batches_left() if resumed else len(loader)    # batches of this pass
        done = order.offset // order.world_size if resumed else 0   # a rank's share before
        bar = tqdm(total=done + last * order.batch_size, initial=done, unit="img",
                   desc=f"epoch {epoch}", disable=not self.progress, dynamic_ncols=True)
        self.last = last
        for k, (images, labels) in enumerate(loader, 1):
            if self.settle:
                step.settle_buckets(images)
                self.settle = False
            step(images, labels, close_window=k == last)
            _count(seen, labels)
            bar.update(images.shape[0])
            if self.log_every and k % self.log_every == 0:
                self._log(epoch, k, bar)
            if step.at_window_end and self._window_closed(epoch, k):
                stopped = True
                break
        self._add(step.read_metrics())
        bar.set_postfix(loss=f"{self.loss_sum / max(self.n_sum, 1):.4f}", refresh=False)
        bar.close()             # its last line stays: the epoch's img/s and loss
        secs = time.perf_counter() - t0
        n = self.n_sum
        return {"epoch": epoch, "rank": self.rank, "steps": step.steps, "samples": int(n),
                "loss": self.loss_sum / max(n, 1), "seconds": secs,
                "images_per_s": n / max(secs, 1e-9),
                "lr": step.optimizer.param_groups[0]["lr"],
                "label_counts": np.round(seen.tolist(), 3).tolist(),
                "complete": not stopped}, stopped

    def _add(self, m: dict) -> None:
        self.loss_sum, self.n_sum = self.loss_sum + m["loss"] * m["samples"], \
            self.n_sum + m["samples"]

    def _log(self, epoch: int, k: int, bar) -> None:
        m = self.step.read_metrics()
        bar.set_postfix(loss=f"{m['loss']:.4f}", refresh=False)
        self._add(m)
        now = time.perf_counter()
        log.info("epoch %d batch %d/%d loss %.4f  %.0f img/s", epoch, k, self.last,
                 m["loss"], m["samples"] / max(now - self.t_log, 1e-9))
        self.t_log = now

    def _window_closed(self, epoch: int, k: int) -> bool:
        """After the window that batch ``k`` closed: checkpoint and stop as asked; returns
        whether ``max_steps`` is reached."""
        inner = k < self.last                 # the epoch's end saves anyway
        halt = inner and self.interrupted()
        stopped = self.max_steps is not None and self.step.steps >= self.max_steps
        if halt or stopped or (inner and self.checkpoint_every
                               and self.step.steps % self.checkpoint_every == 0):
            self.save(epoch)                  # once, whichever of them asked
        if halt:
            self.stop(epoch)
        return stopped

    def record(self, rec: dict) -> None:
        if self.ckpt:
            _append_log(os.path.join(os.path.dirname(self.ckpt), f"log-rank{self.rank}.jsonl"),
                        rec)
        log.info("epoch %d: loss %.4f, %.0f img/s%s", rec["epoch"], rec["loss"],
                 rec["images_per_s"], _scores_text(rec))


def _state(step: TrainStep, loader, epoch: int) -> dict:
    return {"model": step.module.state_dict(), "optimizer": step.optimizer.state_dict(),
            "optimizer_class": _class(step.optimizer),
            "scheduler": step.scheduler.state_dict() if step.scheduler else None,
            "scheduler_class": _class(step.scheduler),
            "step": step.state_dict(), "accum_steps": step.accum_steps,
            "loader": loader.state_dict(), "epoch": epoch, "rng": torch.get_rng_state()}


_SCHEDULE_NAMES = {None: "none", "OneCycleLR": "onecycle", "LambdaLR": "cosine"}


def _class(obj) -> str | None:
    return None if obj is None else type(obj).__name__


def _base(group: dict, key: str):
    """A param group's setting as given, not as a schedule has moved it (OneCycleLR keeps the
    given lr as ``max_lr``, LambdaLR as ``initial_lr``)."""
    value = group.get("max_lr", group.get("initial_lr", group["lr"])) if key == "lr" else \
        group.get(key)
    return None if value is None else float(value)      # (a tensor lr: capturable optimizers)


def _listed(values: list) -> str:
    shown = [f"{v:g}" if v is not None else "none" for v in values]
    return shown[0] if len(set(shown)) == 1 else ", ".join(shown)


def _keep_global_batch(path: str, saved: dict, step: TrainStep, loader) -> bool:
    """On another layout (world size or batch size) than the checkpoint's, set the
    accumulation that keeps its global batch, so that each optimizer step sees the same
    samples; returns whether the layout changed.

    Raises:
        ValueError: this layout cannot make the saved global batch (one line, with a fix).
    """
    o, here = saved["loader"]["order"], loader.order
    if (o["world_size"], o["batch_size"]) == (here.world_size, here.batch_size):
        return False
    accum = saved.get("accum_steps", step.accum_steps)
    glob, per = o["world_size"] * o["batch_size"] * accum, here.world_size * here.batch_size
    if glob % per:
        raise ValueError(f"{path} was saved by {o['world_size']} rank(s) of batch "
                         f"{o['batch_size']} with accumulation {accum}, a global batch of "
                         f"{glob}; {here.world_size} rank(s) of batch {here.batch_size} cannot "
                         f"make {glob} ({glob} is not a multiple of {per}): choose a batch "
                         f"size that divides {glob} / {here.world_size}, or start anew")
    if glob // per != step.accum_steps:
        log.warning("%s was saved by %d rank(s) of batch %d: accumulation %d instead of %d "
                    "keeps its global batch of %d", path, o["world_size"], o["batch_size"],
                    glob // per, step.accum_steps, glob)
        step.accum_steps = glob // per
    return True


def _check_same_run(path: str, saved: dict, step: TrainStep, relaid: bool = False) -> None:
    """A checkpoint of another model, optimizer, learning rate or weight decay, schedule or
    schedule length, named in one line (instead of torch's page of mismatched keys, Adam's
    KeyError on SGD's state, a new --lr silently replaced by the saved one, LambdaLR's KeyError
    on OneCycleLR's state, a schedule silently restarted or dropped, or OneCycleLR's "Tried to
    step N times")."""
    again = "resume with the same settings, or start anew in another checkpoint folder"
    theirs, mine = saved["model"], step.module.state_dict()
    shape = lambda d, k: list(getattr(d[k], "shape", ())) if k in d else "absent"  # noqa: E731
    differ = sorted(k for k in theirs.keys() | mine.keys()
                    if shape(theirs, k) != shape(mine, k))
    if differ:
        k = differ[0]
        raise ValueError(f"{path} holds another model's weights: {len(differ)} of its tensors "
                         f"differ from this model's (e.g. {k}: {shape(theirs, k)} there, "
                         f"{shape(mine, k)} here); {again}")
    cls = saved.get("optimizer_class")      # absent from checkpoints saved before it was kept
    if cls is not None and cls != _class(step.optimizer):
        raise ValueError(f"{path} was saved with the optimizer {cls}, and this run uses "
                         f"{_class(step.optimizer)}; {again}")
    for key, option in (("lr", "--lr"), ("weight_decay", "--weight-decay")):
        have = [_base(g, key) for g in saved["optimizer"]["param_groups"]]
        want = [_base(g, key) for g in step.optimizer.param_groups]
        if have != want:                    # else loading the optimizer drops this run's
            raise ValueError(f"{path} was saved with {key} {_listed(have)}, and this run has "
                             f"{_listed(want)} ({option}); {again}")
    ours = _class(step.scheduler)
    saved_as = None if saved["scheduler"] is None else saved.get("scheduler_class", ours)
    if saved_as != ours:                    # (a class not kept: saved before it was)
        name = lambda c: _SCHEDULE_NAMES.get(c, c)  # noqa: E731
        raise ValueError(f"{path} was saved with the learning-rate schedule {name(saved_as)}, "
                         f"and this run uses {name(ours)} (--schedule); {again}")
    if step.scheduler is not None and saved["scheduler"] is not None and not relaid:
        # (on another layout the saved length, in optimizer steps, goes on)
        have = saved["scheduler"].get("total_steps")
        want = getattr(step.scheduler, "total_steps", None)  # type: ignore[assignment]
        if have is not None and have != want:   # None: a cosine saved before lengths were
            raise ValueError(f"{path} was saved by a run whose learning-rate schedule lasts "
                             f"{have} optimizer steps, and this run's lasts {want} (other "
                             f"epochs, batch size, accumulation or world size): a schedule's "
                             f"length is fixed when its run starts, so a finished run is not "
                             f"extended; {again}")


def _load(path: str, step: TrainStep, loader) -> tuple[int, bool]:
    """Restore ``path``, also on another layout; returns (epoch, whether it resumes after
    some of its samples)."""
    try:
        # tensors and plain types only: a pickle that runs code is refused before it runs
        s = torch.load(path, map_location=step.device, weights_only=True)
        if not isinstance(s, dict) or not {"model", "optimizer", "step", "epoch"} <= s.keys():
            raise ValueError("not a checkpoint of fastdata.train.fit")
    except Exception as e:      # noqa: BLE001 - torch.load raises anything on a damaged file
        raise ValueError(f"{path} cannot be read as a checkpoint ({type(e).__name__}: {e}); "
                         f"restore it, or delete it to start anew") from e
    _check_same_run(path, s, step, _keep_global_batch(path, s, step, loader))
    step.module.load_state_dict(s["model"])
    step.optimizer.load_state_dict(s["optimizer"])
    if step.scheduler is not None and s["scheduler"] is not None:
        step.scheduler.load_state_dict(s["scheduler"])
    step.load_state_dict(s["step"])
    torch.set_rng_state(s["rng"].cpu())
    if s["epoch"] == s["loader"]["order"]["epoch"]:      # a mid-epoch checkpoint
        loader.load_state_dict(s["loader"])
        return s["epoch"], True
    return s["epoch"], False
