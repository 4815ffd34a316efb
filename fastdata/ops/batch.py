"""The batch hook: how a loader runs a user's ``batch_transform`` and normalises after it.

``BatchTransform`` is the protocol of batch operations (``fastdata.transforms``): a call on
``(images, labels)`` with a generator, and the optional fold of the loader's normalisation into
the transform's last pass over the pixels. ``BatchHook`` runs a transform for a batch: its
generator from the batch's seed, the fold where the transform offers one, the check of what it
returns, then the normalisation.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable

import numpy as np
import torch

from fastdata.ops.normalize import Normalize


def _signature(fn: Callable) -> inspect.Signature | None:
    """The signature a call of ``fn`` goes through: a ``torch.nn.Module``'s ``forward`` (its
    ``__call__`` takes anything), else ``fn``'s own; None where it has none to read."""
    try:
        return inspect.signature(fn.forward if isinstance(fn, torch.nn.Module) else fn)
    except (TypeError, ValueError):
        return None


def takes_generator(fn: Callable) -> bool:
    """Whether ``fn`` names a ``generator`` parameter (a ``**kwargs`` does not count: a
    torchvision transform's ``__call__`` takes one and passes it to a ``forward`` that takes
    none)."""
    sig = _signature(fn)
    p = sig.parameters.get("generator") if sig is not None else None
    return p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)


def takes_labels(fn: Callable) -> bool:
    """Whether ``fn`` is called as ``fn(images, labels)`` (two positional parameters, or
    ``*args`` as a torchvision v2 transform's), rather than ``fn(images)`` (one, as a v1
    transform's or an image-only module's)."""
    sig = _signature(fn)
    if sig is None:
        return True
    params = [p for p in sig.parameters.values() if p.name != "generator"]
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return True
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params) >= 2


def call(fn: Callable, images, labels, generator):
    """``fn(images, labels)`` (``fn(images)`` where it takes the images alone, the labels then
    unchanged), with ``generator=`` where it names one; the result checked to be
    ``(images, labels)``.

    Raises:
        TypeError: ``fn`` returned something else.
    """
    extra = {"generator": generator} if takes_generator(fn) else {}
    if not takes_labels(fn):
        out = fn(images, **extra)
        if not torch.is_tensor(out):
            raise TypeError(f"batch_transform {fn!r} takes the images alone and returned "
                            f"{type(out).__name__}; it must return the images (a tensor)")
        return out, labels
    out = fn(images, labels, **extra)
    if not (isinstance(out, tuple) and len(out) == 2 and torch.is_tensor(out[0])):
        raise TypeError(f"batch_transform {fn!r} returned {type(out).__name__}; it must return "
                        f"(images, labels)")
    return out


def batch_generator(seed: int, device: torch.device) -> torch.Generator:
    """The generator a batch transform gets for the batch whose seed is ``seed``."""
    g = torch.Generator(device=device)
    g.manual_seed(int(np.random.SeedSequence([seed, 2]).generate_state(1, np.uint64)[0] >> 1))
    return g


def host_generator(generator: torch.Generator | None) -> torch.Generator | None:
    """A CPU generator for a transform's per-batch values: ``generator`` itself on the CPU.
    From a device's generator, one seeded on the host (no device value read), a stream of
    its own at each call (the device generator's offset moves on), the first the same as a
    CPU generator of the same seed gives."""
    if generator is None or generator.device.type == "cpu":
        return generator
    seed, offset = generator.initial_seed(), generator.get_offset()
    generator.set_offset(offset + 4)
    if offset:
        seed = int(np.random.SeedSequence([seed, offset]).generate_state(1, np.uint64)[0] >> 1)
    return torch.Generator().manual_seed(seed)


def coins(n: int, p: float, host) -> torch.Tensor:
    """``n`` draws of True with probability ``p``, on the host, shaped (n, 1, 1, 1)."""
    return (torch.rand(n, generator=host) < p).view(n, 1, 1, 1)


class BatchTransform:
    """Base of the batch operations: ``op(images, labels, generator=None) -> (images,
    labels)``. ``images``: ``(B, 3, H, W)`` float in [0, 1]; ``generator``: a
    ``torch.Generator`` on the images' device (None: torch's default one). An operation may
    write into ``images`` (the loader's batch, made for this call): pass a copy to keep
    yours."""

    def __call__(self, images: torch.Tensor, labels: torch.Tensor,
                 generator: torch.Generator | None = None):
        """Transform a batch; its random draws come from ``generator``."""
        raise NotImplementedError

    def fold_normalization(self, scale: tuple, shift: tuple) -> BatchTransform | None:
        """This transform returning ``x * scale + shift`` per channel (the loader's
        normalisation, folded into its last pass over the pixels), with the same draws; None
        where it has no such form. A loader runs it in place of the two."""
        return None

    def after_normalization(self, scale: tuple, shift: tuple) -> BatchTransform | None:
        """The transform that does to ``x * scale + shift`` what this one does to ``x``, with
        the same draws (so the normalisation may run before it); None where there is none."""
        return None

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"


def ask(t, method: str, scale: tuple, shift: tuple) -> BatchTransform | None:
    """``t.fold_normalization`` or ``t.after_normalization`` (``method``) of ``scale`` and
    ``shift``; None where ``t`` is not a ``BatchTransform``, or where it runs a ``__call__`` of
    a subclass's (outside fastdata) that the method does not come with (one that may ignore
    what it asks)."""
    if not isinstance(t, BatchTransform):
        return None
    mro = type(t).__mro__
    runs = next(c for c in mro if "__call__" in vars(c))
    has = next(c for c in mro if method in vars(c))
    if not runs.__module__.startswith("fastdata.") and not issubclass(has, runs):
        return None
    return getattr(t, method)(scale, shift)


def ask_each(transforms: list, method: str, scale: tuple, shift: tuple) -> list | None:
    """``ask`` of each transform, or None where one has none."""
    out = [ask(t, method, scale, shift) for t in transforms]
    return None if any(t is None for t in out) else out


class BatchHook:
    """A loader's batch transform then normalisation, for the batch whose seed is given. Where
    the transform can fold the normalisation into its last pass over the pixels
    (``BatchTransform.fold_normalization``: e.g. ColorJitter followed by RandomGrayscale,
    RandomErasing, MixUp or CutMix), it does, with the same draws: one pass fewer over the
    batch."""

    def __init__(self, fn: Callable, normalize: Normalize):
        self.fn, self.normalize = fn, normalize

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, seed: int):
        """The batch transform with the batch's generator, checked, then the normalisation."""
        n = self.normalize
        # folded per batch, not once: a change to the user's transform shows at the next one
        folded = ask(self.fn, "fold_normalization", n.scale, n.shift)
        fn = self.fn if folded is None else folded
        given = images, labels
        images, labels = call(fn, images, labels, batch_generator(seed, images.device))
        check_batch(images, labels, *given)
        return n(images, values=folded is None), labels


def check_batch(images: torch.Tensor, labels, given: torch.Tensor, given_labels) -> None:
    """What the loader needs of a batch transform's images: the batch's size, 3 channels,
    floats, on the batch's device (the height and width are the transform's choice); and of
    its labels: a tensor of the batch's size on that device (their dtype and columns are the
    transform's choice: MixUp makes soft targets), or a detection batch's targets in the form
    they were given.

    Raises:
        ValueError: naming what came back and what was given.
    """
    if (images.dim() != 4 or images.shape[:2] != given.shape[:2] or
            not images.is_floating_point() or images.device != given.device):
        raise ValueError(f"batch_transform returned images of shape {tuple(images.shape)}, "
                         f"{images.dtype}, on {images.device}; it must return float images of "
                         f"shape ({len(given)}, 3, H, W) on {given.device}, as it was given")
    if not torch.is_tensor(given_labels):        # a detection batch's targets: list or dict
        if type(labels) is not type(given_labels) or (
                isinstance(labels, list) and len(labels) != len(given)):
            raise ValueError(f"batch_transform returned labels of type "
                             f"{type(labels).__name__}; it must return the detection targets "
                             f"as it was given them ({type(given_labels).__name__}"
                             f"{' of ' + str(len(given)) if isinstance(labels, list) else ''})")
        return
    if not torch.is_tensor(labels) or labels.dim() < 1 or len(labels) != len(given) or \
            labels.device != given_labels.device:
        what = (f"labels of shape {tuple(labels.shape)} on {labels.device}"
                if torch.is_tensor(labels) else f"labels of type {type(labels).__name__}")
        raise ValueError(f"batch_transform returned {what}; it must return a tensor of "
                         f"{len(given)} labels (one per image) on {given_labels.device}, as "
                         f"it was given")
