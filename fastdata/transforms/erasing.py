"""RandomErasing: a box per image set to a value or to noise."""
from __future__ import annotations

import copy

import numpy as np
import torch

from fastdata import kernels
from fastdata.checks import probability
from fastdata.kernels.device import constant, to_device
from fastdata.ops.batch import BatchTransform, coins, host_generator
from fastdata.ops.boxes import attempts, first_fit, place
from fastdata.ops.normalize import per_channel


def _fill_values(value) -> tuple:
    """A number or numbers as a tuple of floats; () where they are not finite numbers."""
    try:
        values = np.ravel(np.asarray(value, dtype=float))
    except (TypeError, ValueError):
        return ()
    return tuple(values.tolist()) if np.isfinite(values).all() else ()


class RandomErasing(BatchTransform):
    """torchvision's ``RandomErasing``: with probability ``p``, a box of ``scale`` of the
    image's area and aspect ratio in ``ratio`` (log-uniform), 10 attempts to fit, is set to
    ``value`` (a number, 3 numbers, or ``"random"`` for normal noise)."""

    def __init__(self, p: float = 0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0.0):
        self.p = probability("p", p)
        self.scale, self.ratio = tuple(map(float, scale)), tuple(map(float, ratio))
        if not 0 < self.scale[0] <= self.scale[1] <= 1 or not 0 < self.ratio[0] <= self.ratio[1]:
            raise ValueError(f"scale={scale!r} or ratio={ratio!r} is not valid; use (lo, hi) with "
                             f"0 < lo <= hi (<= 1 for scale)")
        random = isinstance(value, str) and value == "random"
        self.value = "random" if random else _fill_values(value)
        if not random and len(self.value) not in (1, 3):
            raise ValueError(f"value={value!r} is not valid; use a number, 3 numbers or "
                             f"'random'")
        self._affine: tuple | None = None      # (scale, shift): the fill mapped as the pixels

    def after_normalization(self, scale, shift):
        """The same boxes, their fill normalised as the pixels are."""
        moved = copy.copy(self)
        moved._affine = (tuple(scale), tuple(shift))
        return moved

    def boxes(self, n: int, height: int, width: int, like: torch.Tensor, generator):
        """``(n, 4)`` int64 ``top, left, h, w`` per image (``h == 0``: nothing erased), drawn
        on the host and put on ``like``'s device."""
        host = host_generator(generator)
        area, aspect = attempts(n, height, width, self.scale, self.ratio, host)
        h = torch.sqrt(area * aspect).round().long()
        w = torch.sqrt(area / aspect).round().long()
        h, w, found = first_fit(h, w, (h < height) & (w < width))
        found &= coins(n, self.p, host).view(n)
        h, w = torch.where(found, h, 0), torch.where(found, w, 0)
        top, left = place(height, width, h, w, host)
        return to_device(torch.stack([top, left, h, w], 1), like)

    def _fill(self, shape, images, generator) -> torch.Tensor:
        if self.value == "random":
            noise = torch.randn(shape, device=images.device, generator=generator,
                                dtype=images.dtype)
            return noise if self._affine is None else per_channel(noise, *self._affine)
        value = np.broadcast_to(np.array(self.value), 3)
        if self._affine is not None:
            value = value * np.array(self._affine[0]) + np.array(self._affine[1])
        return constant(tuple(value.tolist()), str(images.device), images.dtype) \
            .reshape(3, 1, 1)

    def __call__(self, images, labels, generator=None):
        """The batch transformed: ``(images, labels)``."""
        n, c, height, width = images.shape
        boxes = self.boxes(n, height, width, images, generator)
        if images.device.type == "cpu":     # the boxes only, image by image
            for k, (top, left, h, w) in enumerate(boxes.tolist()):
                if h:
                    box = images[k, :, top:top + h, left:left + w]
                    box.copy_(self._fill(box.shape, images, generator).expand_as(box))
            return images, labels
        if self.value != "random" and images.is_cuda and kernels.triton() is not None:
            fill = self._fill(images.shape, images, generator).reshape(3)
            kernels.triton().erase(images, boxes, fill)     # the boxes only
            return images, labels
        top, left, h, w = (t.view(n, 1, 1, 1) for t in boxes.unbind(1))
        ys = torch.arange(height, device=images.device).view(1, 1, height, 1)
        xs = torch.arange(width, device=images.device).view(1, 1, 1, width)
        inside = (ys >= top) & (ys < top + h) & (xs >= left) & (xs < left + w)
        return torch.where(inside, self._fill(images.shape, images, generator), images), labels
