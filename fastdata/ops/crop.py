"""The built-in crop stage: batched crop/flip/resize/normalise on a device, from uint8 NHWC
batches.

Train: RandomResizedCrop with torchvision's sampling (scale, log-uniform ratio, 10 attempts,
then the centre-crop fallback) + horizontal flip. Eval: centre crop of ``eval_ratio`` of the
stored square (torchvision's Resize(256)+CenterCrop(224) is ratio 0.875) resized to ``crop``.
Then ``(x/255 - mean)/std`` in the requested dtype and memory format (uint8 output skips it).

Three kernels give the same geometry: ``native`` (fastdata's C kernel, float32, bfloat16 or
uint8 output on CPU: crop, resize and normalise in one pass, rounded once as it is stored; the
CPU default for those where it was built), ``per_sample`` (uint8 antialiased bilinear
``interpolate`` per image, each image normalised while still in cache: the CPU path
otherwise) and ``batched`` (the same antialiased weights as two batched matrix products for
the whole batch, for CUDA).
All randomness comes from the ``torch.Generator`` passed in, so results do not depend on which
worker ran a batch.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from fastdata import kernels
from fastdata.checks import choice, flag, numbers_of
from fastdata.kernels import cpu
from fastdata.ops.boxes import center_boxes, packed_params, random_resized_crop_boxes
from fastdata.ops.normalize import IMAGENET_MEAN, IMAGENET_STD, scale_shift


def _resizer(out: int):
    """``patch → patch resized to (out, out)``, as ``F.interpolate(mode="bilinear",
    antialias=True, align_corners=False)``: through its aten op where torch has it, which
    skips the Python checks of ``interpolate``, held under the GIL, at every image."""
    op = getattr(torch._C._nn, "_upsample_bilinear2d_aa", None)
    if op is None:
        return lambda p: F.interpolate(p, size=(out, out), mode="bilinear", antialias=True,
                                       align_corners=False)
    return lambda p: op(p, (out, out), False, None)


def resized_patches(images, boxes, flips, out: int):
    """images: a (B, H, W, 3) uint8 tensor or B (H, W, 3) ones → each image's box resized to
    (3, out, out) uint8 (channels_last strides), flipped where asked: one image at a time, so
    what follows works in cache."""
    resized = _resizer(out)
    for k, (img, (top, left, h, w)) in enumerate(zip(images, boxes.tolist())):
        sh, sw, sc = img.stride()
        # one call for the crop's view (slicing four dimensions costs more Python time); NHWC
        # memory as a channels_last NCHW
        patch = img.as_strided((1, 3, h, w), (img.shape[0] * sh, sc, sh, sw),
                               img.storage_offset() + top * sh + left * sw)
        resize = (h, w) != (out, out)
        if flips[k]:    # mirror the source crop, usually smaller than the output: the resize
            patch = patch.flip(-1)      # commutes with it, bit for bit
        elif resize:    # a dense patch halves the uint8 AA kernel's time on CPU
            patch = patch.contiguous(memory_format=torch.channels_last)
        if resize:
            patch = resized(patch)
        yield patch[0]


def crop_resize_per_sample(images, boxes, flips, out: int,
                           memory_format=torch.channels_last) -> torch.Tensor:
    """images: (B, H, W, 3) uint8, or B such images → (B, 3, out, out) uint8 in
    ``memory_format``."""
    y = torch.empty((len(images), 3, out, out), dtype=torch.uint8, device=images[0].device,
                    memory_format=memory_format)
    for k, patch in enumerate(resized_patches(images, boxes, flips, out)):
        y[k] = patch
    return y


def resample_weights(start, length, size: int, out: int, flips=None,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``(B, out, size)`` in ``dtype`` on ``start``'s device: row ``i`` of matrix ``b``
    resamples the window ``[start[b], start[b] + length[b])`` of a line of ``size`` pixels to
    output pixel ``i`` with ``interpolate(mode="bilinear", antialias=True)``'s weights (PIL's
    triangle filter, widened by the downscale factor), mirrored where ``flips``. Computed in
    float32; the (B, out, size) passes are kept few, as on CUDA they cost more than the
    products that use them (in one, with Triton)."""
    if start.is_cuda and kernels.triton() is not None:
        return kernels.triton().resample_weights(start, length, size, out, flips, dtype)
    start = start.to(torch.float32)[:, None, None]
    length = length.to(torch.float32)[:, None, None]
    scale = length / out
    i = torch.arange(out, device=start.device, dtype=torch.float32)[None, :, None]
    if flips is not None:           # mirrored: output pixel i samples where out-1-i would
        i = torch.where(flips.to(torch.bool)[:, None, None], out - 1 - i, i)
    centre = (i + 0.5) * scale - 0.5 + start        # in line coordinates
    pos = torch.arange(size, device=start.device, dtype=torch.float32)[None, None, :]
    inside = ((pos >= start) & (pos < start + length)).to(torch.float32)     # (B, 1, size)
    w = (pos - centre).abs_().mul_(-1 / scale.clamp(min=1)).add_(1).clamp_(min=0).mul_(inside)
    return torch.div(w, w.sum(-1, keepdim=True), out=torch.empty(w.shape, dtype=dtype,
                                                                  device=w.device))


def crop_resize_batched(x: torch.Tensor, boxes, flips, out: int, *,
                        dtype: torch.dtype = torch.float32, affine=None) -> torch.Tensor:
    """x: (B, H, W, 3) uint8 → (B, 3, out, out) in ``dtype``, values in 0..255 or, with
    ``affine=(scale, shift)`` (per channel), ``scale * value + shift``: the same antialiased
    crop-resize as the per-sample kernel, as two batched matrix products over the whole stored
    image (a crop's weights are zero outside it), so a launch per image and aliasing on
    downscaled crops are both avoided. The scale rides on the uint8 → ``dtype`` conversion and
    the shift on the second product (the weights of a pixel sum to 1)."""
    b, height, width, _ = x.shape
    if boxes.device != x.device:    # one copy, pinned: CUDA makes a copy from pageable memory
        p = packed_params(boxes, flips)     # wait for its stream's earlier work
        p = (p.pin_memory() if x.is_cuda else p).to(x.device, non_blocking=True)
        boxes, flips = p[:, :4], p[:, 4]
    flips = torch.as_tensor(flips, dtype=torch.bool, device=x.device)
    wy = resample_weights(boxes[:, 0], boxes[:, 2], height, out, dtype=dtype)
    wx = resample_weights(boxes[:, 1], boxes[:, 3], width, out, flips, dtype=dtype)
    scale, shift = (torch.as_tensor(v, dtype=dtype, device=x.device)
                    for v in (affine or ((1.0,) * 3, (0.0,) * 3)))
    rows = x.reshape(b, height, width * 3) * scale.repeat(width)       # one op: to dtype, scaled
    t = torch.bmm(wy, rows)                                             # (B, out, W*3)
    t = t.view(b, out, width, 3).transpose(1, 2).reshape(b, width, out * 3)
    y = torch.baddbmm(shift.repeat(out)[None, None], wx, t)
    return y.view(b, out, out, 3).permute(0, 3, 2, 1)                  # (B, x, y, channel)


class CropStage:
    """Callable: ``(uint8 (B,H,W,3) tensor, generator) -> (B,3,crop,crop)`` per the contract
    (``crop=None``: the input's size). ``half_products``: the CUDA kernel's products in float16
    (tensor cores; their rounding stays under half a grey level), by default where ``dtype``
    is float16 or bfloat16; also right for a float32 stage whose result ends in half
    precision."""

    def __init__(self, *, train: bool, crop: int | None = None, dtype: torch.dtype = torch.float32,
                 channels_last: bool = False, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                 scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), flip: float = 0.5,
                 eval_ratio: float | None = None, kernel: str = "auto",
                 half_products: bool | None = None):
        mean, std = numbers_of("mean", mean, 3), numbers_of("std", std, 3)
        scale, ratio = numbers_of("scale", scale, 2), numbers_of("ratio", ratio, 2)
        if min(std) <= 0:
            raise ValueError(f"std={std!r} is not valid; every value must be > 0")
        if not 0 < scale[0] <= scale[1] <= 1:
            raise ValueError(f"scale={scale!r} is not valid; use (lo, hi), 0 < lo <= hi <= 1")
        if not 0 < ratio[0] <= ratio[1]:
            raise ValueError(f"ratio={ratio!r} is not valid; use (lo, hi), 0 < lo <= hi")
        choice("kernel", kernel, ("auto", "native", "per_sample", "batched"))
        if kernel == "native":
            cpu.require()
            if dtype not in cpu.OUT_TYPES:
                raise ValueError(f"kernel='native' gives float32, bfloat16 or uint8 output, not "
                                 f"dtype={dtype}; use kernel='auto'")
        self.train, self.crop, self.dtype, self.channels_last = train, crop, dtype, channels_last
        self.scale, self.ratio, self.flip, self._eval_ratio = scale, ratio, flip, eval_ratio
        self.kernel = kernel
        self.mean, self.std = mean, std
        self.half_products = flag("half_products", half_products,
                                  dtype in (torch.float16, torch.bfloat16))
        # y/255 → (y/255 - mean)/std as y*scale + shift, per device and row width: built once
        self._constants: dict = {}

    def params(self, n: int, height: int, width: int, generator):
        if self.train:
            boxes = random_resized_crop_boxes(n, height, width, scale=self.scale,
                                              ratio=self.ratio, generator=generator)
            flips = (torch.rand(n, generator=generator).numpy() < self.flip).tolist()
        else:
            boxes, flips = center_boxes(n, height, width, self.eval_ratio), [False] * n
        return boxes, flips

    def __call__(self, x, generator=None, out: torch.Tensor | None = None,
                 params=None) -> torch.Tensor:
        """``x``: a (B, H, W, 3) uint8 tensor, or a sequence of B (H, W, 3) ones (e.g. views of
        memory-mapped shards); ``out``: an optional preallocated result (right shape, dtype and
        memory format); ``params``: ``(boxes, flips)`` drawn beforehand by ``params()``."""
        n, (height, width) = len(x), x[0].shape[:2]
        boxes, flips = params if params is not None else self.params(n, height, width, generator)
        kernel = self.kernel
        if kernel == "auto":
            kernel = "batched" if x[0].device.type == "cuda" else (
                "native" if self.dtype in cpu.OUT_TYPES and cpu.available() else "per_sample")
        if kernel == "batched" and not torch.is_tensor(x):
            x = torch.stack(list(x))
        side = self.crop or height          # no crop: output at the stored size
        if self.dtype == torch.uint8 and kernel != "native":
            if kernel == "per_sample":
                y = crop_resize_per_sample(x, boxes, flips, side, self.memory_format)
            else:
                y = crop_resize_batched(x, boxes, flips, side).round_().clamp_(0, 255).to(
                    torch.uint8).contiguous(memory_format=self.memory_format)
            return y if out is None else out.copy_(y)
        if out is None:
            out = torch.empty((n, 3, side, side), dtype=self.dtype, device=x[0].device,
                              memory_format=self.memory_format)
        if kernel == "native":      # uint8: the resized pixels as they are
            a, b = self._scale_shift(out.device) if self.dtype != torch.uint8 else (
                (1, 1, 1), (0, 0, 0))
            return cpu.crop_resize(x, packed_params(boxes, flips), out, a, b)
        if kernel == "batched":
            # half-precision products for a half-precision result: tensor cores, half the
            # bytes, and their rounding (< 0.5 grey level) below a bf16 output's (~1 level)
            half = self.half_products and x.is_cuda
            a, b = self._scale_shift(x.device)
            y = crop_resize_batched(x, boxes, flips, side, affine=(a.view(3), b.view(3)),
                                    dtype=torch.float16 if half else torch.float32)
            return out.copy_(y)
        # each image normalised as soon as it is resized, while in cache: one pass over the
        # float output instead of three
        put = self._put(out)
        for k, patch in enumerate(resized_patches(x, boxes, flips, side)):
            put(k, patch)
        return out

    def _put(self, out: torch.Tensor):
        """``put(k, image)``: a uint8 (3,h,w) image → ``out[k]``, normalised; the per-batch
        choices and views made once, as the per-image Python overhead counts on CPU."""
        n, _, h, w = out.shape
        if out.dtype != torch.float32 or not out.is_contiguous(memory_format=torch.channels_last):
            return lambda k, y: self.normalize(y, out[k])
        # along (h, w*3) rows of HWC memory, one fused multiply-add: broadcasting 3 constants
        # over a last dim of 3 is slower on CPU
        a, b = self._scale_shift(out.device, w)
        rows = out.permute(0, 2, 3, 1).reshape(n, h, 3 * w)       # a view
        return lambda k, y: torch.addcmul(b, y.permute(1, 2, 0).reshape(h, 3 * w), a,
                                          out=rows[k])

    @property
    def eval_ratio(self) -> float:
        """Given, or torchvision's Resize(256)+CenterCrop(224) with a crop, all without."""
        if self._eval_ratio is None:
            return 0.875 if self.crop else 1.0
        return self._eval_ratio

    def with_crop(self, crop: int | None) -> CropStage:
        """A copy with another output size (an iteration in flight keeps this one)."""
        other = copy.copy(self)
        other.crop = crop
        return other

    def to_unit(self) -> CropStage:
        """A copy whose output is float32 values in [0, 1], not normalised (what runs before a
        batch transform, the normalisation after it), all else kept: crop, flip, ratios,
        kernel and the half-precision products."""
        other = copy.copy(self)
        other.dtype, other.mean, other.std = torch.float32, (0.0,) * 3, (1.0,) * 3
        other._constants = {}
        return other

    @property
    def memory_format(self):
        return torch.channels_last if self.channels_last else torch.contiguous_format

    def _scale_shift(self, device, width: int = 0):
        """The per-channel constants as (3,1,1), or repeated along a row of HWC memory."""
        key = (str(device), width)
        if key not in self._constants:
            a, b = map(torch.tensor, scale_shift(self.mean, self.std, levels=255))
            shape = (lambda t: t.repeat(width)) if width else (lambda t: t.view(3, 1, 1))
            self._constants[key] = (shape(a).to(device), shape(b).to(device))
        return self._constants[key]

    def normalize(self, y: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """(..., 3, h, w) uint8 or float in 0..255 → ``out`` (the requested float dtype)."""
        a, b = self._scale_shift(y.device)
        if out.dtype == torch.float32:      # one op, whatever the layouts and y's dtype
            return torch.addcmul(b, y, a, out=out)
        return out.copy_(torch.addcmul(b, y.float(), a))      # scale in fp32, then round once
