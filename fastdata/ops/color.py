"""Colour operations on float ``(B, 3, H, W)`` images in [0, 1], a factor per image:
torchvision's definitions (and PIL's for the 8-bit ones)."""
from __future__ import annotations

import functools

import torch

from fastdata.kernels.device import constant

# RGB → luma, as torchvision's rgb_to_grayscale (ITU-R 601-2)
LUMA = (0.2989, 0.587, 0.114)


def grayscale(x: torch.Tensor) -> torch.Tensor:
    """``(B, 3, H, W)`` → ``(B, 1, H, W)`` luma."""
    r, g, b = x.unbind(1)
    return (LUMA[0] * r + LUMA[1] * g + LUMA[2] * b).unsqueeze(1)


def _blend(a: torch.Tensor, b, f: torch.Tensor) -> torch.Tensor:
    return (f * a + (1 - f) * b).clamp_(0, 1)


def adjust_brightness(x, f):
    return _blend(x, 0.0, f)


def adjust_contrast(x, f):
    return _blend(x, grayscale(x).mean(dim=(-3, -2, -1), keepdim=True), f)


def adjust_saturation(x, f):
    return _blend(x, grayscale(x), f)


def adjust_hue(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Rotate each image's hue by ``shift`` (in turns, per image), as torchvision's
    ``adjust_hue`` on tensors: through HSV and back."""
    r, g, b = x.unbind(1)
    maxc, _ = x.max(1)
    minc, _ = x.min(1)
    delta = maxc - minc
    eq = maxc == minc
    safe = torch.where(eq, torch.ones_like(delta), delta)
    s = delta / torch.where(eq, torch.ones_like(maxc), maxc)
    rc, gc, bc = ((maxc - c) / safe for c in (r, g, b))
    h = torch.where(maxc == r, bc - gc,
                    torch.where(maxc == g, 2.0 + rc - bc, 4.0 + gc - rc))
    h = torch.fmod(h / 6.0 + 1.0, 1.0)
    h = torch.where(eq, torch.zeros_like(h), h)
    h = torch.remainder(h + shift.view(-1, 1, 1), 1.0)
    v = maxc
    i = torch.floor(h * 6.0)
    f = h * 6.0 - i
    i = i.to(torch.int64) % 6
    p, q, t = (v * (1 - s)).clamp(0, 1), (v * (1 - s * f)).clamp(0, 1), \
        (v * (1 - s * (1 - f))).clamp(0, 1)
    sel = [(v, q, p, p, t, v), (t, v, v, q, p, p), (p, p, t, v, v, q)]
    out = [functools.reduce(torch.add, (torch.where(i == k, c[k], 0.0) for k in range(6)))
           for c in sel]
    return torch.stack(out, 1)


# ---- the 8-bit and sharpness operations of TrivialAugment ----
def adjust_sharpness(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """torchvision's: blend with the image smoothed by [[1, 1, 1], [1, 5, 1], [1, 1, 1]] / 13
    (its border pixels kept)."""
    smooth = x.clone()
    if x.is_cuda:       # one depthwise convolution
        kernel = constant(((1.0, 1.0, 1.0), (1.0, 5.0, 1.0), (1.0, 1.0, 1.0)), str(x.device),
                           x.dtype) / 13
        smooth[..., 1:-1, 1:-1] = torch.nn.functional.conv2d(x, kernel.expand(3, 1, 3, 3),
                                                             groups=3)
    else:               # a 3x3 box as two 3-sums, plus 4x the centre: faster on a CPU
        box = x[..., :-2, :] + x[..., 1:-1, :] + x[..., 2:, :]
        box = box[..., :-2] + box[..., 1:-1] + box[..., 2:]
        smooth[..., 1:-1, 1:-1] = box.add_(x[..., 1:-1, 1:-1], alpha=4).div_(13)
    return _blend(x, smooth, f)


def _as_levels(x: torch.Tensor) -> torch.Tensor:
    """[0, 1] values as the uint8 levels the PIL definitions work on, whole numbers in
    ``x``'s dtype."""
    return (x * 255).round_().clamp_(0, 255)


def posterize(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """Keep the top ``bits`` (per image, 1-8) of each 8-bit level."""
    # a level's low bits cleared: floor(level / 2^k) * 2^k, exact in floats (no int64 copy)
    step = torch.exp2(8 - bits.to(x.dtype).round()).view(-1, 1, 1, 1)
    return torch.floor(_as_levels(x) / step).mul_(step).div_(255)


def solarize(x: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """Invert the values at or above ``threshold`` (per image, in [0, 1])."""
    # a lerp by 0 or 1 picks exactly, and runs faster than torch.where on a CPU
    return torch.lerp(x, 1 - x, (x >= threshold.view(-1, 1, 1, 1)).to(x.dtype))


def autocontrast(x: torch.Tensor) -> torch.Tensor:
    """Stretch each channel of each image to [0, 1] (unchanged where it is flat)."""
    lo = x.amin(dim=(-2, -1), keepdim=True)
    hi = x.amax(dim=(-2, -1), keepdim=True)
    flat = hi <= lo
    scale = torch.where(flat, torch.ones_like(hi), 1 / torch.where(flat, torch.ones_like(hi),
                                                                    hi - lo))
    return ((x - torch.where(flat, torch.zeros_like(lo), lo)) * scale).clamp_(0, 1)


def equalize(x: torch.Tensor) -> torch.Tensor:
    """PIL's (and torchvision's) histogram equalisation of each channel's 8-bit levels."""
    n, c, h, w = x.shape
    levels = _as_levels(x).long().reshape(n * c, h * w)
    hist = torch.zeros(n * c, 256, dtype=torch.int64, device=x.device)
    hist.scatter_add_(1, levels, torch.ones_like(levels))
    index = torch.arange(256, device=x.device)
    last = (index * (hist > 0)).argmax(1, keepdim=True)     # the highest level present
    step = (h * w - hist.gather(1, last)) // 255
    safe = step.clamp(min=1)
    lut = (hist.cumsum(1) + safe // 2) // safe
    lut = torch.cat([torch.zeros_like(lut[:, :1]), lut[:, :-1]], 1).clamp_(0, 255)
    lut = torch.where(step > 0, lut, index)        # a channel of one level: unchanged
    return (lut.to(x.dtype) / 255).gather(1, levels).view(n, c, h, w)
