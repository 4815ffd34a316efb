"""Fused GPU kernels for the batch operations, written in Triton.

``transforms.ColorJitter`` as separate torch operations makes about thirty passes over a batch
(the hue rotation alone some twenty); a training step that should take the whole GPU then
waits for them. Here the four adjustments run per pixel in one pass (two where contrast needs
the mean of what comes before it), the same arithmetic as the CPU's C kernel
(``_native.c``), with the loader's normalisation folded in where it asks. RandomErasing with
a constant fill writes its boxes only. The crop's resampling matrices are written in one pass
each, where torch's operations make about ten over them. Triton ships with PyTorch's CUDA
builds on Linux; without it the operations fall back to torch's (``fastdata.kernels.triton()``
loads this module only where Triton imports).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from fastdata.kernels.device import constant

BLOCK = 1024


@triton.jit
def clamp01(x):
    return tl.minimum(tl.maximum(x, 0.0), 1.0)


@triton.jit
def luma(r, g, b):
    return 0.2989 * r + 0.587 * g + 0.114 * b


@triton.jit
def hsv_channel(K, maxc, cr):
    # HSV's closed form back to RGB in units of the chroma, as the C kernel's
    c6 = 6.0 * cr
    K = tl.where(K < 0.0, K + c6, K)
    K = tl.where(K >= c6, K - c6, K)
    K = tl.where(K >= c6, K - c6, K)
    m = tl.maximum(tl.minimum(K, 4.0 * cr - K), 0.0)
    return maxc - tl.minimum(m, cr)


@triton.jit
def hue(r, g, b, shift):
    s6 = 6.0 * (shift - tl.floor(shift + 0.5))
    maxc = tl.maximum(tl.maximum(r, g), b)
    minc = tl.minimum(tl.minimum(r, g), b)
    cr = maxc - minc
    isr = maxc == r
    isg = (maxc == g) & ~isr
    num = tl.where(isr, g - b, tl.where(isg, b - r, r - g))
    base = num + cr * (tl.where(isr, 0.0, tl.where(isg, 2.0, 4.0)) + s6)
    return (hsv_channel(base + 5.0 * cr, maxc, cr), hsv_channel(base + 3.0 * cr, maxc, cr),
            hsv_channel(base + cr, maxc, cr))


@triton.jit
def adjust(op, r, g, b, fb, fc, fs, fh, mean):
    # 0 brightness, 1 contrast (blend with the image's mean luma), 2 saturation, 3 hue
    if op == 3:
        r, g, b = hue(r, g, b, fh)
    else:
        w = tl.where(op == 0, fb, tl.where(op == 1, fc, fs))
        o = tl.where(op == 0, 0.0, tl.where(op == 1, mean, luma(r, g, b)))
        r = clamp01(w * r + (1.0 - w) * o)
        g = clamp01(w * g + (1.0 - w) * o)
        b = clamp01(w * b + (1.0 - w) * o)
    return r, g, b


# the order is drawn per batch: one compiled kernel for every order
@triton.jit(do_not_specialize=["o0", "o1", "o2", "o3", "stop"])
def jitter(x, factors, means, partial, affine, s_img, s_chan, s_pix, pixels, o0, o1, o2, o3,
           stop, WRITE: tl.constexpr, AFFINE: tl.constexpr, BLOCK: tl.constexpr):
    """Apply the first ``stop`` of ops ``o0..o3`` to one block of one image's pixels; WRITE:
    store them (with AFFINE times ``affine[:3]`` plus ``affine[3:]`` per channel), else store
    the block's luma sum (for contrast's mean: the ops before it are computed again in the
    second pass, cheaper on a GPU than writing them and reading them back)."""
    img, blk = tl.program_id(0), tl.program_id(1)
    pix = blk * BLOCK + tl.arange(0, BLOCK)
    inside = pix < pixels
    at = x + img.to(tl.int64) * s_img + pix.to(tl.int64) * s_pix
    r = tl.load(at, mask=inside, other=0.0)
    g = tl.load(at + s_chan, mask=inside, other=0.0)
    b = tl.load(at + 2 * s_chan, mask=inside, other=0.0)
    fb, fc = tl.load(factors + 4 * img), tl.load(factors + 4 * img + 1)
    fs, fh = tl.load(factors + 4 * img + 2), tl.load(factors + 4 * img + 3)
    mean = tl.load(means + img)
    for k in tl.static_range(4):
        if k == 0:
            op = o0
        elif k == 1:
            op = o1
        elif k == 2:
            op = o2
        else:
            op = o3
        if k < stop:
            r, g, b = adjust(op, r, g, b, fb, fc, fs, fh, mean)
    if WRITE:
        if AFFINE:
            r = r * tl.load(affine) + tl.load(affine + 3)
            g = g * tl.load(affine + 1) + tl.load(affine + 4)
            b = b * tl.load(affine + 2) + tl.load(affine + 5)
        tl.store(at, r, mask=inside)
        tl.store(at + s_chan, g, mask=inside)
        tl.store(at + 2 * s_chan, b, mask=inside)
    else:
        tl.store(partial + img * tl.num_programs(1) + blk,
                 tl.sum(tl.where(inside, luma(r, g, b), 0.0), axis=0))


def color_jitter(images: torch.Tensor, factors: torch.Tensor, order: Sequence[int],
                 scale: Sequence[float] | None = None,
                 shift: Sequence[float] | None = None) -> None:
    """``transforms.ColorJitter``'s adjustments in place, as ``cpu.color_jitter`` on the
    CPU: ``images`` float32 ``(B, 3, H, W)``, contiguous or channels_last; ``factors``
    ``(B, 4)`` on its device (brightness, contrast, saturation, hue); ``order`` the
    adjustments (0-3) in order; then, with ``scale`` and ``shift`` (3 values each),
    ``x * scale + shift`` per channel in the same pass. Queued on the current stream; nothing
    is read on the host.

    Raises:
        ValueError: images of another dtype, shape or layout, or a bad order.
    """
    n, c, h, w = images.shape
    if images.dtype != torch.float32 or c != 3 or images.stride(2) != w * images.stride(3):
        raise ValueError(f"images must be float32 (B, 3, H, W), contiguous or channels_last, "
                         f"not {images.dtype} {tuple(images.shape)} strides {images.stride()}")
    ops = [int(k) for k in order]
    if len(ops) > 4 or any(k not in range(4) for k in ops):
        raise ValueError(f"order must be up to 4 of 0-3, not {ops}")
    if (not ops and scale is None) or n == 0:
        return
    blocks = -(-h * w // BLOCK)
    factors = factors.to(torch.float32).contiguous()
    # the 6 values copied to the device once (from pageable memory a copy waits for the stream)
    affine = None if scale is None or shift is None else constant((*scale, *shift),
                                                                  str(images.device),
                                                  torch.float32)
    args = [*images.stride()[:2], images.stride(3), h * w, *(ops + [0] * (4 - len(ops)))]
    means = torch.zeros(n, dtype=torch.float32, device=images.device)
    if 1 in ops:        # contrast: the mean luma of what the ops before it make
        partial = torch.empty((n, blocks), dtype=torch.float32, device=images.device)
        jitter[(n, blocks)](images, factors, means, partial, means, *args, ops.index(1),
                            WRITE=False, AFFINE=False, BLOCK=BLOCK)
        means = partial.sum(1) / (h * w)
    jitter[(n, blocks)](images, factors, means, means, means if affine is None else affine,
                        *args, len(ops), WRITE=True, AFFINE=affine is not None, BLOCK=BLOCK)



@triton.jit
def erase_row(x, boxes, fill, s_img, s_chan, s_row, s_pix, WIDTH: tl.constexpr):
    """Row ``program_id(1)`` of image ``program_id(0)``: its pixels inside the image's box
    (``boxes``: (B, 4) top, left, height, width) set to ``fill`` (3 values); nothing else is
    read or written."""
    img, y = tl.program_id(0), tl.program_id(1)
    top, left = tl.load(boxes + 4 * img), tl.load(boxes + 4 * img + 1)
    h, w = tl.load(boxes + 4 * img + 2), tl.load(boxes + 4 * img + 3)
    xs = tl.arange(0, WIDTH)
    ys = xs * 0 + y         # the row as a vector: the mask is one
    inside = (ys >= top) & (ys < top + h) & (xs >= left) & (xs < left + w)
    at = x + img.to(tl.int64) * s_img + y.to(tl.int64) * s_row + xs.to(tl.int64) * s_pix
    for c in tl.static_range(3):
        tl.store(at + c * s_chan, tl.load(fill + c).to(x.dtype.element_ty), mask=inside)


def erase(images: torch.Tensor, boxes: torch.Tensor, fill: torch.Tensor) -> None:
    """``transforms.RandomErasing`` with a constant fill, in place: each image's box of
    ``boxes`` ((B, 4) int64 top, left, height, width on its device; height 0: none) set to
    ``fill`` (3 values on the device). Only the boxes are written, where a masked copy of the
    batch reads and writes all of it. Queued on the current stream.

    Raises:
        ValueError: images not (B, 3, H, W), or boxes not (B, 4).
    """
    n, c, h, w = images.shape
    if c != 3 or tuple(boxes.shape) != (n, 4):
        raise ValueError(f"images must be (B, 3, H, W) and boxes (B, 4), not "
                         f"{tuple(images.shape)} and {tuple(boxes.shape)}")
    if n and h and w:
        erase_row[(n, h)](images, boxes.to(torch.int64).contiguous(),
                          fill.to(torch.float32).contiguous(), *images.stride(),
                          WIDTH=triton.next_power_of_2(w))


@triton.jit
def resample_row(w, start, length, flips, out, size, SIZE: tl.constexpr, FLIP: tl.constexpr):
    """Row ``program_id(1)`` of matrix ``program_id(0)`` of ``augment.resample_weights``."""
    b, i = tl.program_id(0), tl.program_id(1)
    first, span = tl.load(start + b).to(tl.float32), tl.load(length + b).to(tl.float32)
    scale = span / out
    at = i.to(tl.float32)
    if FLIP:
        at = tl.where(tl.load(flips + b) != 0, out - 1 - at, at)
    centre = (at + 0.5) * scale - 0.5 + first
    pos = tl.arange(0, SIZE)
    p = pos.to(tl.float32)
    tent = tl.maximum(tl.abs(p - centre) * (-1.0 / tl.maximum(scale, 1.0)) + 1.0, 0.0)
    tent = tl.where((p >= first) & (p < first + span), tent, 0.0)
    row = w + (b.to(tl.int64) * out + i) * size
    tl.store(row + pos, (tent / tl.sum(tent, axis=0)).to(w.dtype.element_ty), mask=pos < size)


def resample_weights(start: torch.Tensor, length: torch.Tensor, size: int, out: int,
                     flips: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """``augment.resample_weights`` on ``start``'s CUDA device, each matrix row in one
    program: (B, out, size) in ``dtype``, queued on the current stream."""
    n = len(start)
    w = torch.empty((n, out, size), dtype=dtype, device=start.device)
    if n and out and size:
        f = start if flips is None else flips.to(torch.int32).contiguous()
        resample_row[(n, out)](w, start.contiguous(), length.contiguous(), f, out, size,
                               SIZE=triton.next_power_of_2(size), FLIP=flips is not None)
    return w
