"""Composition of batch transforms: in order, or one of several per batch."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from fastdata.ops.batch import BatchTransform, ask, ask_each, call, host_generator


class Compose(BatchTransform):
    """Apply ``transforms`` in order, each with the same generator (its draws advance it)."""

    def __init__(self, transforms: Sequence[Callable]):
        self.transforms = list(transforms)
        for t in self.transforms:
            if not callable(t):
                raise TypeError(f"Compose takes callables; {t!r} is not one")

    def __call__(self, images, labels, generator=None):
        """The batch transformed: ``(images, labels)``."""
        for t in self.transforms:
            images, labels = call(t, images, labels, generator)
        return images, labels

    def fold_normalization(self, scale, shift):
        """The last transform that folds it in, where every one after it can run after it."""
        after: list = []
        for k in range(len(self.transforms) - 1, -1, -1):
            t = self.transforms[k]
            folded = ask(t, "fold_normalization", scale, shift)
            if folded is not None:
                return Compose([*self.transforms[:k], folded, *after])
            moved = ask(t, "after_normalization", scale, shift)
            if moved is None:
                return None
            after.insert(0, moved)
        return None

    def after_normalization(self, scale, shift):
        """Each transform's own, where every one has one."""
        moved = ask_each(self.transforms, "after_normalization", scale, shift)
        return None if moved is None else Compose(moved)


class RandomChoice(BatchTransform):
    """One of ``transforms`` per batch, with probabilities ``p`` (None: equal), as timm and
    torchvision's references pick MixUp or CutMix."""

    def __init__(self, transforms: Sequence[Callable], p: Sequence[float] | None = None):
        self.transforms = list(transforms)
        if not self.transforms:
            raise ValueError("RandomChoice needs at least one transform")
        p = [1.0] * len(self.transforms) if p is None else [float(v) for v in p]
        if len(p) != len(self.transforms) or min(p) < 0 or sum(p) <= 0:
            raise ValueError(f"p={p!r} is not valid; give {len(self.transforms)} weights >= 0 "
                             f"with a positive sum")
        self.p = [v / sum(p) for v in p]

    def __call__(self, images, labels, generator=None):
        """The batch transformed: ``(images, labels)``."""
        u = float(torch.rand((), generator=host_generator(generator)))
        k = min(int(np.searchsorted(np.cumsum(self.p), u, side="right")), len(self.p) - 1)
        return call(self.transforms[k], images, labels, generator)

    def fold_normalization(self, scale, shift):
        """Each choice's own, where every one has one (the same draw picks among them)."""
        return self._ask_all("fold_normalization", scale, shift)

    def after_normalization(self, scale, shift):
        """Each choice's own, where every one has one."""
        return self._ask_all("after_normalization", scale, shift)

    def _ask_all(self, method, scale, shift):
        out = ask_each(self.transforms, method, scale, shift)
        return None if out is None else RandomChoice(out, self.p)


class PerImage(BatchTransform):
    """``transform`` applied to each image of the batch on its own, ``transform(image)`` on a
    ``(3, H, W)`` tensor, the labels unchanged: a torchvision transform given a whole batch
    draws one set of parameters for all of it (one brightness factor, one rotation), given
    one image at a time, a set per image. Its draws come from torch's global generator, as
    torchvision's do; one call per image costs a kernel launch or more per image on a GPU."""

    def __init__(self, transform: Callable):
        if not callable(transform):
            raise TypeError(f"PerImage takes a callable; {transform!r} is not one")
        self.transform = transform

    def __call__(self, images, labels, generator=None):
        """The batch, each image transformed on its own: ``(images, labels)``."""
        return torch.stack([self.transform(image) for image in images]), labels
