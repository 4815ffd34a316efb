"""fastdata's C kernel (crop + resize + flip + normalise in one pass) against the float
reference kernel, on the inputs the loader gives it and on the ones it must refuse."""
from __future__ import annotations

import shutil
import sysconfig

import numpy as np
import pytest
import torch

from fastdata.kernels import cpu
from fastdata.ops.boxes import packed_params, random_resized_crop_boxes
from fastdata.ops.crop import CropStage, crop_resize_batched

needs_kernel = pytest.mark.skipif(not cpu.available(), reason="fastdata.kernels._native not built")


def test_the_kernel_is_built_where_a_compiler_is():
    """The extension is optional at install (no compiler: the torch ops instead), so a broken
    build would pass unnoticed: where this Python's C compiler exists, it must be there."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc}) here")
    assert cpu.available()


def _reference(images, params, out, scale, shift):
    """crop_resize_batched one image at a time (the images may differ in size)."""
    return torch.stack([
        crop_resize_batched(img[None], params[k:k + 1, :4], params[k:k + 1, 4], out,
                            affine=(scale, shift))[0] for k, img in enumerate(images)])


@needs_kernel
@pytest.mark.parametrize("size,out", [(48, 24), (48, 40), (37, 37), (64, 20), (20, 64),
                                      (48, 22), (48, 23)])
@pytest.mark.parametrize("layout", ["nchw", "channels_last", "strided"])
def test_the_kernel_resamples_like_the_reference(size, out, layout):
    """Up- and antialiased downscales, flips, 1-pixel-wide boxes, sources of different sizes
    whose rows are further apart than their width (views of a larger array), and NCHW,
    channels_last and arbitrary output strides: the reference kernel's float values."""
    g = torch.Generator().manual_seed(size * out)
    big = torch.from_numpy(np.random.default_rng(out).integers(0, 256, (40, size + 7, size + 9, 3),
                                                               dtype=np.uint8))
    images = [big[k, k % 5:size + k % 5 - k % 3, 2:size + 2] for k in range(40)]   # rows apart
    boxes = torch.cat([random_resized_crop_boxes(36, size - 4, size, generator=g),
                       torch.tensor([[0, 0, 1, 1], [3, 0, 1, size], [0, 5, size - 4, 1],
                                     [0, 0, size - 4, size]])])
    flips = (torch.rand(40, generator=g) < 0.5).tolist()
    params = packed_params(boxes, flips)
    scale, shift = torch.tensor([1 / 50, 1 / 60, 1 / 70]), torch.tensor([-2.0, -1.5, -1.0])
    if layout == "strided":     # (B, 3, O, O) as a view of (O, B, O, 4) memory
        y = torch.full((out, 40, out, 4), float("nan")).permute(1, 3, 0, 2)[:, 1:]
    else:
        y = torch.full((40, 3, out, out), float("nan")).contiguous(
            memory_format=torch.channels_last if layout == "channels_last" else
            torch.contiguous_format)
    assert cpu.crop_resize(images, params, y, scale, shift) is y
    ref = _reference(images, params, out, scale, shift)
    # in grey levels; float32 rounding differs with the build (FMA or not: 0.001 without)
    assert ((y - ref) / scale.view(3, 1, 1)).abs().max() <= 2e-3


@needs_kernel
@pytest.mark.parametrize("layout", ["nchw", "channels_last", "strided"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.uint8])
def test_half_and_uint8_outputs_are_the_float_output_rounded_once(layout, dtype):
    """bfloat16: the float32 values rounded as torch rounds them; uint8 (no normalisation):
    the resized pixels rounded to the nearest level, ties to even. Odd widths leave a tail
    past the 8-wide conversion."""
    g = torch.Generator().manual_seed(7)
    x = torch.from_numpy(np.random.default_rng(7).integers(0, 256, (24, 40, 40, 3),
                                                           dtype=np.uint8))
    params = packed_params(random_resized_crop_boxes(24, 40, 40, generator=g),
                           (torch.rand(24, generator=g) < 0.5).tolist())
    if dtype == torch.uint8:
        scale, shift = torch.ones(3), torch.zeros(3)
    else:
        scale, shift = torch.tensor([1 / 50, 1 / 60, 1 / 70]), torch.tensor([-2.0, -1.5, -1.0])
    for out in (29, 30, 31, 32):
        f = torch.empty((24, 3, out, out))
        cpu.crop_resize(list(x), params, f, scale, shift)
        if layout == "strided":
            y = torch.zeros((out, 24, out, 4), dtype=dtype).permute(1, 3, 0, 2)[:, 1:]
        else:
            y = torch.zeros((24, 3, out, out), dtype=dtype).contiguous(
                memory_format=torch.channels_last if layout == "channels_last" else
                torch.contiguous_format)
        assert cpu.crop_resize(list(x), params, y, scale, shift) is y
        want = f.to(torch.bfloat16) if dtype == torch.bfloat16 else f.round().to(torch.uint8)
        assert torch.equal(y, want)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.uint8])
def test_the_crop_stage_takes_the_kernel_for_half_and_uint8_output(dtype):
    x = torch.from_numpy(np.random.default_rng(4).integers(0, 256, (16, 32, 32, 3),
                                                           dtype=np.uint8))
    for train in (True, False):
        a, b, c = (CropStage(kernel=k, train=train, crop=24, dtype=dtype)(
            list(x), torch.Generator().manual_seed(5)) for k in ("auto", "native", "per_sample"))
        assert torch.equal(a, b) and a.dtype == dtype
        diff = (b.float() - c.float()).abs().max()      # per_sample rounds to uint8 first
        assert 0 < diff <= (1 if dtype == torch.uint8 else 0.05)


@needs_kernel
def test_the_loader_transform_uses_it_and_stays_within_a_grey_level_of_the_uint8_path():
    x = torch.from_numpy(np.random.default_rng(3).integers(0, 256, (16, 32, 32, 3),
                                                           dtype=np.uint8))
    level = 1 / (255 * 0.224) + 1e-5        # one grey level in the smallest default std
    for train in (True, False):
        kw = dict(train=train, crop=24, channels_last=True)
        a, b, c = (CropStage(kernel=k, **kw)(list(x), torch.Generator().manual_seed(5))
                   for k in ("auto", "native", "per_sample"))
        assert torch.equal(a, b)
        assert (b - c).abs().max() <= level and (b - c).abs().max() > 0


@needs_kernel
@pytest.mark.parametrize("case,match", [
    ("dtype", "uint8 CPU"), ("layout", "packed RGB pixels"), ("box", "not inside"),
    ("out", "float32, bfloat16 or uint8 CPU tensor"), ("params", r"\(4, 5\)"),
    ("uint8", r"uint8 output takes the pixels as they are")])
def test_bad_inputs_are_refused_before_c_sees_them(case, match):
    x = torch.zeros((4, 16, 16, 3), dtype=torch.uint8)
    params = torch.tensor([[0, 0, 16, 16, 0]] * 4)
    out = torch.empty((4, 3, 8, 8))
    images = list(x)
    if case == "dtype":
        images[2] = images[2].float()
    elif case == "layout":
        images[1] = x[1].permute(1, 0, 2)       # columns as rows: pixels not packed
    elif case == "box":
        params[3] = torch.tensor([4, 0, 13, 16, 0])
    elif case == "out":
        out = out.double()
    elif case == "uint8":
        out = out.to(torch.uint8)
    else:
        params = params[:, :4]
    with pytest.raises(ValueError, match=match):
        cpu.crop_resize(images, params, out, (2, 1, 1) if case == "uint8" else (1, 1, 1),
                        (0, 0, 0))


def test_kernel_choice_is_checked():
    with pytest.raises(ValueError, match="kernel='fast' is not valid"):
        CropStage(train=True, kernel="fast")
    with pytest.raises(ValueError, match="half_products='yes' is not valid"):
        CropStage(train=True, half_products="yes")
    assert CropStage(train=True, dtype=torch.bfloat16).half_products
    if cpu.available():
        with pytest.raises(ValueError, match="float32, bfloat16 or uint8 output, not "
                                             "dtype=torch.float16"):
            CropStage(train=True, kernel="native", dtype=torch.float16)
    else:
        with pytest.raises(ImportError, match="not built"):
            CropStage(train=True, kernel="native")


@pytest.mark.parametrize("mode", ["RGB", "RGBX"])
@pytest.mark.parametrize("size", [(1, 1), (5, 3), (7, 9), (256, 256)])
def test_the_converter_packs_pixels_like_pillow_with_and_without_the_kernel(monkeypatch, mode,
                                                                            size):
    """The converter packs 4-byte pixels into its ring through the kernel (Pillow's Arrow
    export) or, without it, through Pillow: the same bytes either way, tails included."""
    from PIL import Image

    from fastdata.converters import decode

    rng = np.random.default_rng(sum(size))
    img = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 4), np.uint8), "RGBX")
    img = img.convert(mode)
    want = np.asarray(img.convert("RGB")).reshape(-1)
    kernel = decode._native_pack()
    assert (kernel is not None) == cpu.available()
    for pack in {kernel, None}:
        monkeypatch.setattr(decode, "_native_pack", lambda pack=pack: pack)
        out = np.full(3 * size[0] * size[1] + 5, 7, np.uint8)     # 5 guard bytes after it
        decode.pack_into(img, out[:-5])
        assert np.array_equal(out[:-5], want) and (out[-5:] == 7).all()
    if kernel is not None:      # called as such (pack_into falls back on a ValueError)
        out = np.empty(3 * size[0] * size[1], np.uint8)
        kernel(*img.__arrow_c_array__(), out)
        assert np.array_equal(out, want)
        with pytest.raises(ValueError, match="3 bytes a pixel"):
            kernel(*img.__arrow_c_array__(), np.empty(5, np.uint8))
