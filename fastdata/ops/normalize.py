"""The one normalisation: ``(x - mean) / std`` per channel as ``x * scale + shift``, with
``scale = 1 / (levels * std)`` and ``shift = -mean / std`` for values in ``0..levels``."""
from __future__ import annotations

import torch

from fastdata.kernels import cpu
from fastdata.kernels.device import constant

IMAGENET_MEAN = (0.485, 0.456, 0.406)


IMAGENET_STD = (0.229, 0.224, 0.225)


def scale_shift(mean, std, levels: float = 1.0) -> tuple[tuple, tuple]:
    """``(x / levels - mean) / std`` as ``x * scale + shift``: ``(scale, shift)``, 3 floats
    each."""
    return (tuple(1 / (levels * s) for s in std), tuple(-m / s for m, s in zip(mean, std)))


def per_channel(x: torch.Tensor, scale: tuple, shift: tuple) -> torch.Tensor:
    """``x * scale + shift`` with a value per channel of (..., 3, H, W)."""
    a, b = (constant(tuple(v), str(x.device), x.dtype).view(3, 1, 1) for v in (scale, shift))
    return torch.addcmul(b, x, a)


class Normalize:
    """The loader's last step after a batch transform: ``(x - mean) / std`` in ``dtype`` and
    ``memory_format`` (with ``values=False``, the dtype and layout only: the transform did the
    rest)."""

    def __init__(self, mean, std, dtype: torch.dtype, memory_format):
        self.mean, self.std, self.dtype, self.memory_format = mean, std, dtype, memory_format
        self.scale, self.shift = scale_shift(mean, std)

    def __call__(self, x: torch.Tensor, values: bool = True) -> torch.Tensor:
        # in place only where each element has its own memory (not, e.g., an expanded view)
        dense = x.is_contiguous() or x.is_contiguous(memory_format=torch.channels_last)
        if values and dense and cpu.fits(x):      # one pass, each pixel once
            cpu.affine(x, self.scale, self.shift)
        elif values and dense and x.dtype == torch.float32:
            a, b = (constant(v, str(x.device), x.dtype).view(3, 1, 1)
                    for v in (self.scale, self.shift))
            x = torch.addcmul(b, x, a, out=x)
        elif values:
            x = per_channel(x.float(), self.scale, self.shift)
        return x.to(self.dtype, memory_format=self.memory_format)
