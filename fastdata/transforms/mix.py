"""MixUp and CutMix: images and their targets blended with the batch's previous ones."""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from fastdata.checks import integer, positive
from fastdata.ops.batch import BatchTransform, host_generator


def soft_targets(labels: torch.Tensor, num_classes: int, dtype=torch.float32) -> torch.Tensor:
    """Class indices ``(B,)`` → one-hot ``(B, C)``; soft ``(B, C)`` targets as they are."""
    if labels.dim() == 2:
        if labels.shape[1] != num_classes:
            raise ValueError(f"labels of shape {tuple(labels.shape)} do not have "
                             f"num_classes={num_classes} columns")
        return labels.to(dtype)
    out = torch.zeros((len(labels), num_classes), dtype=dtype, device=labels.device)
    return out.scatter_(1, labels.view(-1, 1), 1.0)


def check_classes(fn: Callable, classes: int) -> None:
    """Refuse a MixUp or CutMix in ``fn`` (fastdata's or torchvision's, through any
    ``Compose`` or ``RandomChoice``) with fewer ``num_classes`` than a set of class labels has:
    on a GPU its one-hot targets would fail inside a kernel, which takes the process's CUDA
    context down with it.

    Raises:
        ValueError: naming the operation and the number of classes to use.
    """
    inner = getattr(fn, "transforms", None)
    for t in inner if isinstance(inner, (list, tuple)) else ():
        check_classes(t, classes)
    n = getattr(fn, "num_classes", None)
    mixes = isinstance(fn, _Mix) or type(fn).__name__ in ("MixUp", "CutMix")
    if mixes and isinstance(n, int) and n < classes:
        raise ValueError(f"{type(fn).__name__}(num_classes={n}) cannot hold this set's "
                         f"labels: it has {classes} classes; use num_classes={classes}")


class _Mix(BatchTransform):
    """What MixUp and CutMix share: λ ~ Beta(alpha, alpha) per batch, ``num_classes``."""

    def __init__(self, alpha: float = 1.0, *, num_classes: int):
        self.alpha = positive("alpha", alpha)
        self.num_classes = integer("num_classes", num_classes, 1)

    def after_normalization(self, scale, shift):
        """Itself: a blend of two images, weights summing to 1, commutes with it."""
        return self     # a blend of two images, weights summing to 1: it commutes

    def _lam(self, host) -> tuple[float, np.random.Generator]:
        """λ ~ Beta(alpha, alpha), and a generator for the rest of the batch's values."""
        seed = int(torch.randint(2 ** 62, (), generator=host))
        rng = np.random.default_rng(seed)
        return float(rng.beta(self.alpha, self.alpha)), rng


class MixUp(_Mix):
    """torchvision's ``MixUp``: one λ ~ Beta(alpha, alpha) per batch; each image and its
    one-hot target blended with the batch's previous one (``roll(1, 0)``): ``λ·a + (1-λ)·b``.
    Labels become float ``(B, num_classes)``."""

    def __call__(self, images, labels, generator=None):
        """The batch transformed: ``(images, labels)``."""
        lam, _ = self._lam(host_generator(generator))
        y = soft_targets(labels, self.num_classes)
        if images.device.type == "cpu":     # in place, image by image, from the last one
            last = images[-1].clone()
            for k in range(len(images) - 1, 0, -1):
                images[k].lerp_(images[k - 1], 1 - lam)
            images[0].lerp_(last, 1 - lam)
        else:       # lerp(images, images.roll(1, 0)) without the rolled copy
            out = torch.empty_like(images)
            torch.lerp(images[1:], images[:-1], 1 - lam, out=out[1:])
            torch.lerp(images[:1], images[-1:], 1 - lam, out=out[:1])
            images = out
        return images, y.lerp(y.roll(1, 0), 1 - lam)


class CutMix(_Mix):
    """torchvision's ``CutMix``: one λ ~ Beta(alpha, alpha) and one box per batch (centre
    uniform, sides ``sqrt(1-λ)`` of the image's, clipped); the box is pasted from the batch's
    previous image (``roll(1, 0)``) and targets mixed by the area kept. Labels become float
    ``(B, num_classes)``."""

    def __call__(self, images, labels, generator=None):
        """The batch transformed: ``(images, labels)``."""
        lam, rng = self._lam(host_generator(generator))
        height, width = images.shape[-2:]
        cy, cx = int(rng.integers(height)), int(rng.integers(width))
        r = 0.5 * math.sqrt(1.0 - lam)
        rh, rw = int(r * height), int(r * width)
        y0, y1 = max(cy - rh, 0), min(cy + rh, height)
        x0, x1 = max(cx - rw, 0), min(cx + rw, width)
        box = images[..., y0:y1, x0:x1]
        box.copy_(box.roll(1, 0))       # in place: only the box is read and written
        kept = 1.0 - (y1 - y0) * (x1 - x0) / (height * width)
        y = soft_targets(labels, self.num_classes)
        return images, y.lerp(y.roll(1, 0), 1 - kept)
