"""Colour transforms: ColorJitter and RandomGrayscale."""
from __future__ import annotations

import copy
import math
import numbers

import torch

from fastdata import kernels
from fastdata.checks import probability
from fastdata.kernels import cpu
from fastdata.kernels.device import to_device
from fastdata.ops.batch import BatchTransform, coins, host_generator
from fastdata.ops.color import (
    LUMA,
    adjust_brightness,
    adjust_contrast,
    adjust_hue,
    adjust_saturation,
    grayscale,
)
from fastdata.ops.normalize import per_channel


def _range(name: str, value, centre: float, low: float, high: float) -> tuple[float, float]:
    """torchvision's ColorJitter arguments: ``v`` → ``[centre - v, centre + v]`` clipped to
    ``[low, high]``, or an explicit ``(lo, hi)``."""
    if isinstance(value, numbers.Real):
        if value < 0:
            raise ValueError(f"{name}={value!r} is not valid; use a number >= 0 or (lo, hi)")
        lo, hi = centre - float(value), centre + float(value)
    else:
        try:
            lo, hi = (float(v) for v in value)
        except (TypeError, ValueError):
            raise ValueError(f"{name}={value!r} is not valid; use a number >= 0 or (lo, hi)") \
                from None
    if not low <= lo <= hi <= high:
        raise ValueError(f"{name}={value!r} is not valid; it must lie within [{low}, {high}]")
    return max(lo, low), hi


class ColorJitter(BatchTransform):
    """torchvision's ``ColorJitter``, a factor per image: brightness, contrast and saturation
    factors uniform in ``[max(0, 1 - v), 1 + v]``, a hue shift uniform in ``[-hue, hue]``
    (``hue`` <= 0.5), each given as ``v`` or ``(lo, hi)``. The order of the four adjustments
    is drawn once per batch (torchvision draws it per call, which is per image in a per-image
    pipeline)."""

    def __init__(self, brightness=0.0, contrast=0.0, saturation=0.0, hue=0.0):
        self.brightness = _range("brightness", brightness, 1.0, 0.0, math.inf)
        self.contrast = _range("contrast", contrast, 1.0, 0.0, math.inf)
        self.saturation = _range("saturation", saturation, 1.0, 0.0, math.inf)
        self.hue = _range("hue", hue, 0.0, -0.5, 0.5)
        self._affine: tuple | None = None      # (scale, shift) folded in, per channel

    def fold_normalization(self, scale, shift):
        """The same jitter, then ``x * scale + shift`` in the same pass."""
        folded = copy.copy(self)
        folded._affine = (tuple(scale), tuple(shift))
        return folded

    def __call__(self, images, labels, generator=None):
        """The batch transformed: ``(images, labels)``."""
        n = len(images)
        ops = [(adjust_brightness, self.brightness, (1.0, 1.0)),
               (adjust_contrast, self.contrast, (1.0, 1.0)),
               (adjust_saturation, self.saturation, (1.0, 1.0)),
               (adjust_hue, self.hue, (0.0, 0.0))]
        host = host_generator(generator)
        order = [k for k in torch.randperm(4, generator=host).tolist()
                 if ops[k][1] != ops[k][2]]
        lo, hi = (torch.tensor([r[j] for _, r, _ in ops]) for j in (0, 1))
        factors = to_device(lo + (hi - lo) * torch.rand(n, 4, generator=host), images)   # (B, 4)
        affine = self._affine or (None, None)
        if cpu.fits(images):          # per pixel in one or two passes, not per op
            cpu.color_jitter(images, factors, order, *affine)
            return images, labels
        if _fused_gpu_ok(images):       # the same, in a Triton kernel
            kernels.triton().color_jitter(images, factors, order, *affine)
            return images, labels
        for k in order:
            images = ops[k][0](images, factors[:, k].view(n, 1, 1, 1))
        if self._affine is not None:
            images = per_channel(images, *self._affine)
        return images, labels


def _fused_gpu_ok(images: torch.Tensor) -> bool:
    _, _, _, w = images.shape
    return (images.is_cuda and images.dtype == torch.float32 and
            images.stride(2) == w * images.stride(3) and kernels.triton() is not None)


class RandomGrayscale(BatchTransform):
    """Each image made grey (its luma in all three channels) with probability ``p``."""

    def __init__(self, p: float = 0.1):
        self.p = probability("p", p)
        self._affine: tuple | None = None      # (scale, shift) the images come normalised by

    def after_normalization(self, scale, shift):
        """The same coin per image, on normalised images (the grey of the values before)."""
        moved = copy.copy(self)
        moved._affine = (tuple(scale), tuple(shift))
        return moved

    def __call__(self, images, labels, generator=None):
        """The batch transformed: ``(images, labels)``."""
        grey = coins(len(images), self.p, host_generator(generator))
        if images.device.type == "cpu":     # the grey images only, image by image
            for k in grey.view(-1).nonzero()[:, 0].tolist():
                images[k] = self._grey(images[k:k + 1])[0]
            return images, labels
        return torch.where(to_device(grey, images), self._grey(images).expand_as(images),
                           images), labels

    def _grey(self, x: torch.Tensor) -> torch.Tensor:
        if self._affine is None:
            return grayscale(x)
        # the luma of the values before normalisation, then normalised as each channel
        scale, shift = self._affine
        w = [luma / a for luma, a in zip(LUMA, scale)]
        luma = w[0] * x[:, 0] + w[1] * x[:, 1] + w[2] * x[:, 2] - sum(
            wc * b for wc, b in zip(w, shift))
        return per_channel(luma.unsqueeze(1), scale, shift)
