"""The crop stage: torchvision's box sampling, flips, and its kernels against each other."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fastdata.kernels import cpu
from fastdata.ops.boxes import packed_params, random_resized_crop_boxes
from fastdata.ops.crop import (
    CropStage,
    crop_resize_batched,
    crop_resize_per_sample,
    resized_patches,
)


def test_crop_boxes_follow_torchvision_semantics():
    g = torch.Generator().manual_seed(0)
    boxes = random_resized_crop_boxes(4000, 48, 64, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3),
                                      generator=g)
    top, left, h, w = boxes.T
    assert (top >= 0).all() and (left >= 0).all()
    assert (top + h <= 48).all() and (left + w <= 64).all()          # inside the image
    area = (h * w).float() / (48 * 64)
    aspect = w.float() / h.float()
    assert area.min() >= 0.06 and area.max() <= 1.0
    assert aspect.min() >= 0.7 and aspect.max() <= 1.4
    assert area.std() > 0.1 and len({tuple(b) for b in boxes.tolist()}) > 3000



def _boxes_in_torch(n, height, width, scale, ratio, g):
    """The same sampling written in torch ops alone: the definition the boxes must match."""
    area = height * width * torch.empty(n, 10).uniform_(scale[0], scale[1], generator=g)
    aspect = torch.exp(torch.empty(n, 10).uniform_(np.log(ratio[0]), np.log(ratio[1]),
                                                   generator=g))
    w, h = torch.sqrt(area * aspect).round().long(), torch.sqrt(area / aspect).round().long()
    ok = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = ok.to(torch.float32).argmax(1, keepdim=True)
    bh, bw, found = h.gather(1, first)[:, 0], w.gather(1, first)[:, 0], ok.any(1)
    r = width / height
    fh, fw = ((round(width / ratio[0]), width) if r < ratio[0] else
              (height, round(height * ratio[1])) if r > ratio[1] else (height, width))
    bh, bw = bh.masked_fill(~found, fh), bw.masked_fill(~found, fw)
    u = torch.rand(n, 2, generator=g)
    return torch.stack([(u[:, 0] * (height - bh + 1)).long(),
                        (u[:, 1] * (width - bw + 1)).long(), bh, bw], 1)


def test_crop_boxes_are_the_torch_computation_bit_for_bit():
    """Computed in NumPy after torch's draws, the boxes are what torch's own float32 ops give,
    over sizes, scales and ratios that leave some images without a fitting attempt."""
    rng = np.random.default_rng(0)
    cases = [(seed, int(rng.integers(1, 400)), int(rng.integers(1, 400)), 50,
              tuple(sorted(rng.uniform(0.01, 1.5, 2))),
              tuple(sorted(np.exp(rng.uniform(-1.5, 1.5, 2))))) for seed in range(300)]
    # a draw where NumPy's float32 square root is one bit from torch's (71.5 against 71.49..)
    cases.append((702, 75, 73, 57, (0.8760708445059504, 1.289210906139352),
                  (0.26751844235909794, 1.159356029182281)))
    for seed, height, width, n, scale, ratio in cases:
        got = random_resized_crop_boxes(n, height, width, scale=scale, ratio=ratio,
                                        generator=torch.Generator().manual_seed(seed))
        assert torch.equal(got, _boxes_in_torch(n, height, width, scale, ratio,
                                                torch.Generator().manual_seed(seed))), seed

def _images(n=16, s=20, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (n, s, s, 3),
                                                                   dtype=np.uint8))


def test_flip_really_flips():
    x = _images()
    aug = CropStage(train=True, dtype=torch.uint8, scale=(1.0, 1.0), ratio=(1.0, 1.0))
    y = aug(x, torch.Generator().manual_seed(1)).permute(0, 2, 3, 1)
    flipped = [bool(torch.equal(y[k], x[k].flip(1))) for k in range(len(x))]
    same = [bool(torch.equal(y[k], x[k])) for k in range(len(x))]
    assert all(f != s for f, s in zip(flipped, same))                # each is one or the other
    assert 0 < sum(flipped) < len(x)


def test_a_mirrored_crop_is_the_mirror_of_the_crop():
    """The per-sample kernel gives ``interpolate(antialias=True)`` of each crop exactly, and
    it mirrors the source crop before resizing it (less to copy): the same pixels as mirroring
    the resized crop, upscaled or antialiased-downscaled."""
    x = _images(64, 48)
    boxes = random_resized_crop_boxes(64, 48, 48, generator=torch.Generator().manual_seed(2))
    for out in (24, 40):                    # most crops shrink to 24, grow to 40
        plain = list(resized_patches(x, boxes, [False] * 64, out))
        mirrored = list(resized_patches(x, boxes, [True] * 64, out))
        assert all(torch.equal(m, p.flip(-1)) for m, p in zip(mirrored, plain))
        for k, (t, l, h, w) in enumerate(boxes.tolist()):
            crop = x[k:k + 1, t:t + h, l:l + w].permute(0, 3, 1, 2)
            ref = F.interpolate(crop, size=(out, out), mode="bilinear", antialias=True)
            assert torch.equal(plain[k], ref[0])


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_strided_input_gives_the_same_batch(dtype):
    """A sliced (non-contiguous) batch gives what its contiguous copy gives."""
    x = _images(32, 40)[::2, 3:, 5:38]                  # every other image, an odd window
    aug = CropStage(train=True, crop=24, dtype=dtype, channels_last=True)
    a = aug(x, torch.Generator().manual_seed(7))
    assert torch.equal(a, aug(x.contiguous(), torch.Generator().manual_seed(7)))


def test_normalisation_and_kernels_agree():
    x = _images(8, 32)
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    ident = CropStage(train=False, mean=mean, std=std)(x)               # no crop: exact values
    ref = (x.permute(0, 3, 1, 2).float() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) \
        / torch.tensor(std).view(1, 3, 1, 1)
    assert torch.allclose(ident, ref, atol=1e-5)
    const = torch.full((4, 32, 32, 3), 128, dtype=torch.uint8)
    y = CropStage(train=True, crop=24)(const, torch.Generator().manual_seed(0))
    expected = (128 / 255 - torch.tensor((0.485, 0.456, 0.406))) \
        / torch.tensor((0.229, 0.224, 0.225))
    assert torch.allclose(y.mean((0, 2, 3)), expected, atol=1e-3)
    level = 1 / (255 * min(std)) + 1e-5                # one grey level, normalised
    for train in (False, True):
        a = CropStage(train=train, crop=24, mean=mean, std=std, kernel="per_sample")(
            x, torch.Generator().manual_seed(4))
        b = CropStage(train=train, crop=24, mean=mean, std=std, kernel="batched")(
            x, torch.Generator().manual_seed(4))
        assert a.shape == b.shape and (a - b).abs().max() <= level


@pytest.mark.parametrize("size,out", [(48, 24), (48, 40), (37, 37), (64, 20)])
def test_the_batched_kernel_resamples_like_the_per_sample_kernel(size, out):
    """The CUDA kernel (two batched matrix products, run here on CPU) gives each crop
    ``interpolate(antialias=True)``'s values, mirrored where asked, and so stays within one
    grey level of the CPU's uint8 kernel, downscaled crops included (no aliasing)."""
    g = torch.Generator().manual_seed(size + out)
    x = _images(48, size, seed=out)
    boxes = random_resized_crop_boxes(48, size, size, generator=g)
    flips = (torch.rand(48, generator=g) < 0.5).tolist()
    y = crop_resize_batched(x, boxes, flips, out)
    for k, (t, l, h, w) in enumerate(boxes.tolist()):
        crop = x[k, t:t + h, l:l + w].permute(2, 0, 1)[None].float()
        ref = F.interpolate(crop, size=(out, out), mode="bilinear", antialias=True)[0]
        assert torch.allclose(y[k], ref.flip(-1) if flips[k] else ref, atol=1e-3)
    u8 = crop_resize_per_sample(x, boxes, flips, out)
    assert (y.round() - u8.float()).abs().max() <= 1
    # the parameters packed into one (B, 5) tensor, as the torch backend sends them to a GPU
    p = packed_params(boxes, flips, out=torch.full((48, 5), -1, dtype=torch.int64))
    assert torch.equal(crop_resize_batched(x, p[:, :4], p[:, 4], out), y)
    # normalising inside (scale on the conversion, shift on the second product), in half
    # precision as CUDA does for half-precision outputs: under half a grey level apart
    scale, shift = torch.tensor([1 / 50, 1 / 60, 1 / 70]), torch.tensor([-2.0, -1.5, -1.0])
    ref = y * scale.view(3, 1, 1) + shift.view(3, 1, 1)
    for dtype, levels in ((torch.float32, 1e-3), (torch.float16, 0.5)):
        z = crop_resize_batched(x, boxes, flips, out, dtype=dtype, affine=(scale, shift))
        assert z.dtype == dtype
        assert ((z.float() - ref) / scale.view(3, 1, 1)).abs().max() <= levels


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layouts_hold_the_same_values(dtype, train):
    """channels_last and NCHW output hold the same values up to float rounding, normalised as
    asked: float32 (the C kernel where built) as the float reference kernel computes it,
    bfloat16 from the uint8 resize. Eval's 24 px centre box of a 32 px image needs no resize:
    its rows are a strided view of the batch."""
    x, mean, std = _images(8, 32), (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    kw = dict(train=train, crop=24, mean=mean, std=std, eval_ratio=None if train else 0.75)
    y = {cl: CropStage(dtype=dtype, channels_last=cl, **kw)(x, torch.Generator().manual_seed(2))
         for cl in (False, True)}
    assert y[False].is_contiguous() and y[True].is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(y[False].float(), y[True].float(), rtol=0, atol=1e-6)
    plain = CropStage(dtype=torch.uint8, **kw)(x, torch.Generator().manual_seed(2))
    if not train:
        assert torch.equal(plain, x[:, 4:28, 4:28].permute(0, 3, 1, 2))
    mean, std = torch.tensor(mean).view(1, 3, 1, 1), torch.tensor(std).view(1, 3, 1, 1)
    if dtype == torch.float32:
        boxes, flips = CropStage(**kw).params(8, 32, 32, torch.Generator().manual_seed(2))
        ref = (crop_resize_batched(x, boxes, flips, 24) / 255 - mean) / std
        atol = 1e-4 if cpu.available() else 1 / (255 * 0.2)     # else: the uint8 resize
    else:
        ref, atol = (plain.float() / 255 - mean) / std, 0.05
    assert torch.allclose(y[True].float(), ref, atol=atol)


def test_the_stage_before_a_batch_transform_keeps_all_but_the_normalisation():
    """Values in [0, 1] in float32, every other choice kept (flip, the evaluation ratio, the
    kernel were once dropped)."""
    stage = CropStage(train=True, crop=16, dtype=torch.bfloat16, flip=0.0, eval_ratio=0.5,
                      kernel="per_sample", scale=(0.5, 0.9), ratio=(0.9, 1.1))
    unit = stage.to_unit()
    assert unit.dtype == torch.float32 and unit.mean == (0.0,) * 3 and unit.std == (1.0,) * 3
    for name in ("train", "crop", "flip", "_eval_ratio", "kernel", "scale", "ratio",
                 "half_products", "channels_last"):
        assert getattr(unit, name) == getattr(stage, name), name
    assert stage.dtype == torch.bfloat16 and stage.mean != unit.mean      # a copy
    x = torch.randint(0, 256, (2, 20, 24, 3), dtype=torch.uint8)
    out = unit(x, generator=torch.Generator().manual_seed(0))
    assert out.dtype == torch.float32 and 0 <= out.min() and out.max() <= 1
