"""``TrainStep``: one micro-batch in, the loss out as a device tensor; AMP, accumulation,
DDP ``no_sync``, clipping and the optimizer/scaler/scheduler step done right.

* ``precision``: ``"bf16"`` (autocast to bfloat16, no scaler), ``"fp16"`` (autocast to
  float16 + ``torch.amp.GradScaler``), ``"fp32"`` (no autocast). Default ``None``: bf16 on a
  CUDA device that supports it, fp16 on one that does not, fp32 on CPU (CPU bf16 autocast works,
  pass ``"bf16"``, but most CPUs have no bf16 units and it is slower than fp32 there).
* Accumulation: every micro-batch's loss is divided by ``accum_steps``; a DDP model skips the
  gradient all-reduce (``no_sync``) on all but the last micro-batch of a window; the optimizer,
  scaler and scheduler step only on that last one, then ``zero_grad(set_to_none=True)``.
  ``k`` micro-batches of ``b`` therefore equal one batch of ``k*b`` (the loss is a mean).
  ``step(x, y, close_window=True)`` ends a window early (``fit`` does at an epoch's last batch,
  as Lightning and the HF Trainer step there): that micro-batch synchronises, and the ``n < k``
  micro-batches' gradients are scaled by ``k/n``, so they equal one batch of ``n*b``.
* With fp16 the gradients are unscaled before clipping; a step whose gradients hold inf/NaN
  is skipped by the scaler (and the scale lowered).
* ``channels_last`` (default: on CUDA) converts the model once and each batch (a no-op for
  loader output that already is). A DDP model must be converted before it is wrapped
  (``distributed.wrap`` does); one that is not gets a warning.
* The default loss is cross-entropy, with ``label_smoothing``; it takes class indices
  ``(B,)`` or soft targets ``(B, C)`` (``fastdata.transforms.MixUp``/``CutMix``). A detection
  batch's targets go to the model, ``model(images, targets)``, which returns its losses (as
  torchvision's detection models do in training mode: a dict, added up).
* No host synchronisation: nothing calls ``.item()``/``.cpu()``; ``loss_sum``/``samples`` add
  up on the device and are read by whoever logs, when they log. (One exception belongs to
  torch: with fp16, ``GradScaler.step`` reads the inf check on the host once per optimizer
  step unless the optimizer is fused, e.g. ``SGD(..., fused=True)``; bf16 needs no scaler.)
"""
from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable

import torch
from torch import nn

from fastdata.checks import choice, integer

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def default_precision(device: torch.device) -> str:
    """``"bf16"`` on a CUDA device that supports it, ``"fp16"`` on one that does not, else
    ``"fp32"``."""
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "fp32"


def input_dtype(precision: str, device: torch.device) -> torch.dtype:
    """What a loader should deliver for ``precision``: the autocast dtype on CUDA (half the
    bytes, same result: the first layer casts anyway), float32 on CPU."""
    low = PRECISIONS[precision]
    return low if (low is not None and device.type == "cuda") else torch.float32


def _device_of(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def loss_for(label_kind: str, *, label_smoothing: float = 0.0) -> nn.Module:
    """The loss for a shard set's ``label_kind``.

    Args:
        label_kind: ``"class"``, ``"multi_label"``, ``"regression"`` or ``"segmentation"``
            (``ShardSet.label_kind``).
        label_smoothing: for class labels and class maps.

    Returns:
        Cross-entropy for class labels (indices or soft targets) and for class maps (per
        pixel, 255 ignored), BCE-with-logits for multi-label targets, MSE for regression
        targets.

    Raises:
        ValueError: another ``label_kind``.
    """
    choice("label_kind", label_kind, ("class", "multi_label", "regression", "segmentation"))
    if label_kind == "class":
        return nn.CrossEntropyLoss(label_smoothing=label_smoothing)
    if label_kind == "segmentation":       # per pixel; 255: no class
        return nn.CrossEntropyLoss(ignore_index=255, label_smoothing=label_smoothing)
    return nn.BCEWithLogitsLoss() if label_kind == "multi_label" else nn.MSELoss()


class TrainStep:
    """One training step, called per micro-batch: ``loss = step(images, labels)``.

    Args:
        model: the model (plain, or DDP-wrapped: ``fastdata.train.distributed.wrap``).
        optimizer: its optimizer.
        loss_fn: the loss (default: cross-entropy with ``label_smoothing``; ``loss_for``
            gives the one for a set's label kind).
        label_smoothing: for the default loss.
        precision: ``"bf16"``, ``"fp16"`` (with a GradScaler) or ``"fp32"``; default: bf16 on
            CUDA where supported, fp16 on other CUDA devices, fp32 on CPU.
        accum_steps: micro-batches per optimizer step.
        clip_grad_norm: clip the gradients' norm to this (after unscaling), or None.
        scheduler: a learning-rate scheduler stepped once per optimizer step.
        channels_last: run the model channels_last (default: on CUDA).
        compile: run the forward pass through ``torch.compile``: True (its default backend,
            inductor), or a backend's name (e.g. ``"eager"``, which traces without
            generating code: a quick check that the model compiles).

    Raises:
        ValueError: a bad argument, named with the valid choices.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *,
                 loss_fn: Callable | None = None,
                 label_smoothing: float = 0.0, precision: str | None = None, accum_steps: int = 1,
                 clip_grad_norm: float | None = None,
                 scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
                 channels_last: bool | None = None, compile: bool | str = False):
        self.device = _device_of(model)
        precision = default_precision(self.device) if precision is None else precision
        choice("precision", precision, PRECISIONS)
        integer("accum_steps", accum_steps, 1)
        if clip_grad_norm is not None and not clip_grad_norm > 0:
            raise ValueError(f"clip_grad_norm={clip_grad_norm!r} is not valid; use a number > 0 "
                             f"or None")
        self.precision, self.accum_steps = precision, accum_steps
        self.clip_grad_norm = clip_grad_norm
        # on a CPU the better layout depends on the model (resnet8 runs faster channels_last,
        # the tiny model slower), so the default is CUDA only
        if channels_last is None:
            channels_last = self.device.type == "cuda"
        self.channels_last = bool(channels_last)
        if self.channels_last:
            conv = [p for p in model.parameters() if p.dim() == 4]
            if hasattr(model, "no_sync") and not all(
                    p.is_contiguous(memory_format=torch.channels_last) for p in conv):
                warnings.warn("channels_last: this DDP model is converted after DDP was built, "
                              "so every gradient is copied into NCHW buckets; convert it "
                              "before wrapping (fastdata.train.distributed.wrap does)",
                              stacklevel=2)
            model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self.model = model                                  # DDP-wrapped or plain
        self.forward = torch.compile(model, backend=compile if isinstance(compile, str)
                                     else "inductor") if compile else model
        self.optimizer, self.scheduler = optimizer, scheduler
        if not isinstance(label_smoothing, (int, float)) or not 0 <= label_smoothing < 1:
            raise ValueError(f"label_smoothing={label_smoothing!r} is not valid; use a number "
                             f"in [0, 1)")
        if loss_fn is not None and label_smoothing:
            raise ValueError("label_smoothing applies to the default cross-entropy loss; with "
                             "a loss_fn, smooth inside it")
        self._own_loss = loss_fn is not None
        # class indices (B,) or soft targets (B, C) from MixUp/CutMix: cross-entropy takes both
        self.loss_fn = nn.CrossEntropyLoss(label_smoothing=float(label_smoothing)) \
            if loss_fn is None else loss_fn
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=precision == "fp16")
        self.micro = 0              # micro-batches of the open window
        self.steps = 0              # optimizer steps taken (attempted, with fp16)
        self.loss_sum = torch.zeros((), device=self.device)
        self.samples = torch.zeros((), dtype=torch.int64, device=self.device)

    @property
    def at_window_end(self) -> bool:
        """No micro-batch of an accumulation window is pending (a safe point to checkpoint)."""
        return self.micro == 0

    @property
    def module(self) -> nn.Module:
        """The model without its DDP wrapper (for saving and evaluation)."""
        return getattr(self.model, "module", self.model)

    def autocast(self):
        """The autocast context of the step's precision (none for fp32)."""
        dtype = PRECISIONS[self.precision]
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=dtype)

    def settle_buckets(self, images: torch.Tensor) -> None:
        """Before a resumed DDP run's first step: one synchronised backward of a zero loss, so
        that DDP rebuilds its gradient buckets in the order the gradients arrive, as the
        uninterrupted run did after its first step. Without it the resumed run's first
        all-reduce packs the gradients in DDP's initial order, and over more than two ranks
        adds them in another order (last-bit differences). Gradients, buffers (BatchNorm's
        statistics) and the RNG states are left as they were. A no-op without DDP."""
        if not hasattr(self.model, "no_sync"):
            return
        buffers = [b.detach().clone() for b in self.module.buffers()]
        rng = torch.random.get_rng_state()
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        if self.channels_last and images.dim() == 4:
            images = images.contiguous(memory_format=torch.channels_last)
        with self.autocast():
            out = self.forward(images)
        parts = out.values() if isinstance(out, dict) else out if isinstance(
            out, (list, tuple)) else (out,)
        zero = torch.zeros((), device=self.device)
        (sum((t.float().sum() for t in parts if torch.is_tensor(t)), zero) * 0).backward()
        self.optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for mine, saved in zip(self.module.buffers(), buffers):
                mine.copy_(saved)
        torch.random.set_rng_state(rng)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)

    def __call__(self, images: torch.Tensor, labels, *,
                 close_window: bool = False) -> torch.Tensor:
        """One micro-batch: forward, backward, and the step when it closes a window (every
        ``accum_steps``-th, or this one with ``close_window``). ``labels``: a batch's labels,
        or a detection set's targets (``_loss``)."""
        n = self.micro + 1
        last = close_window or n == self.accum_steps
        if self.channels_last and images.dim() == 4:
            images = images.contiguous(memory_format=torch.channels_last)
        sync = contextlib.nullcontext() if last or not hasattr(self.model, "no_sync") \
            else self.model.no_sync()  # type: ignore[operator]
        with sync:
            with self.autocast():
                loss = self._loss(images, labels)
            self.scaler.scale(loss / self.accum_steps).backward()
        self.micro = 0 if last else n
        if last:
            self._step(n)
        loss = loss.detach()
        self.loss_sum += loss.float() * len(images)
        self.samples += len(images)
        return loss

    def _loss(self, images: torch.Tensor, labels) -> torch.Tensor:
        """``loss_fn(model(images), labels)``; for a detection batch's targets (a list of
        dicts, or padded in a dict), ``model(images, targets)``, which returns its losses
        (torchvision's detection models: a dict of them, added up) unless a ``loss_fn`` was
        given, which then takes ``(model output, targets)``."""
        if torch.is_tensor(labels) or self._own_loss:
            return self.loss_fn(self.forward(images), labels)
        out = self.forward(images, labels)
        if isinstance(out, dict):
            return sum(out.values(), torch.zeros((), device=images.device))
        return out

    def _step(self, n: int) -> None:
        opt = self.optimizer
        if n < self.accum_steps:        # a window closed early: the mean over its n batches
            grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
            torch._foreach_mul_(grads, self.accum_steps / n)
        if self.clip_grad_norm is not None:
            self.scaler.unscale_(opt)
            params = [p for g in opt.param_groups for p in g["params"]]
            torch.nn.utils.clip_grad_norm_(params, self.clip_grad_norm, foreach=True)
        self.scaler.step(opt)           # fp16: skipped (on device) when grads hold inf/NaN
        self.scaler.update()
        if self.scheduler is not None:
            with warnings.catch_warnings():     # a skipped fp16 step makes torch warn once
                warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step",
                                        UserWarning)
                self.scheduler.step()
        opt.zero_grad(set_to_none=True)
        self.steps += 1

    def read_metrics(self, reset: bool = True) -> dict:
        """Mean loss and samples since the last read (one host sync: call at log intervals)."""
        n = int(self.samples.item())
        mean = float(self.loss_sum.item()) / max(n, 1)
        if reset:
            self.loss_sum.zero_()
            self.samples.zero_()
        return {"loss": mean, "samples": n}

    def state_dict(self) -> dict:
        """The step's counters and its gradient scaler's state (the caller saves the model's and
        the optimizer's)."""
        return {"micro": self.micro, "steps": self.steps, "scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore a ``state_dict()``."""
        # "micro" counted every micro-batch before close_window: saved at a window's end
        self.micro, self.steps = state["micro"] % self.accum_steps, state["steps"]
        if state["scaler"]:     # empty: saved without fp16 (a bf16 or fp32 run); a fresh scale
            self.scaler.load_state_dict(state["scaler"])
