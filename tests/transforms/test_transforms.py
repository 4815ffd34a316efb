"""Users' transforms: the batch operations against references, and both loader hooks."""
from __future__ import annotations

import colorsys
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps
from torch import nn

import fastdata
from fastdata import transforms as T
from fastdata.kernels import cpu
from fastdata.ops import color as C
from fastdata.ops import geometry as G
from fastdata.ops.batch import BatchHook, ask, batch_generator, call, host_generator
from fastdata.ops.normalize import Normalize
from fastdata.train.step import TrainStep

LUMA = np.array([0.2989, 0.587, 0.114])


def images(n=4, size=12, seed=0) -> torch.Tensor:
    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def np_grey(x):                               # (3, H, W) → (H, W)
    return np.tensordot(LUMA, x, axes=1)


@pytest.mark.parametrize("op", ["brightness", "contrast", "saturation"])
def test_colour_adjustments_match_torchvision_definitions(op):
    x = images()
    f = torch.tensor([0.3, 1.0, 1.7, 0.0]).view(4, 1, 1, 1)
    got = getattr(C, f"adjust_{op}")(x.clone(), f).numpy()
    for k, img in enumerate(x.numpy().astype(np.float64)):
        fk = float(f[k])
        other = {"brightness": 0.0, "contrast": np_grey(img).mean(),
                 "saturation": np_grey(img)[None]}[op]
        ref = np.clip(fk * img + (1 - fk) * other, 0, 1)
        np.testing.assert_allclose(got[k], ref, atol=1e-5)


def test_hue_matches_colorsys():
    x = images(n=3, size=6)
    shift = torch.tensor([0.1, -0.25, 0.5])
    got = C.adjust_hue(x, shift).numpy()
    for k, img in enumerate(x.numpy()):
        for i in range(6):
            for j in range(6):
                h, s, v = colorsys.rgb_to_hsv(*img[:, i, j])
                ref = colorsys.hsv_to_rgb((h + float(shift[k])) % 1.0, s, v)
                np.testing.assert_allclose(got[k, :, i, j], ref, atol=1e-5)


def test_colour_jitter_draws_a_factor_per_image_in_range_and_repeats_with_its_seed():
    x = images(n=64)
    op = T.ColorJitter(brightness=0.5)
    y, labels = op(x.clone(), torch.arange(64), generator=torch.Generator().manual_seed(3))
    ratio = (y.sum((1, 2, 3)) / x.sum((1, 2, 3))).numpy()     # no clipping below factor 1
    low = ratio[ratio < 1]
    assert low.min() >= 0.5 - 1e-5 and len(np.unique(ratio.round(4))) > 30
    again, _ = op(x.clone(), labels, generator=torch.Generator().manual_seed(3))
    assert torch.equal(y, again) and labels.tolist() == list(range(64))
    same, _ = T.ColorJitter()(x.clone(), labels)
    assert torch.equal(same, x)
    with pytest.raises(ValueError, match="hue=0.7"):
        T.ColorJitter(hue=0.7)
    with pytest.raises(ValueError, match="brightness=-1"):
        T.ColorJitter(brightness=-1)


@pytest.mark.skipif(not cpu.available(), reason="the C kernel is not built")
def test_colour_jitter_kernel_equals_the_torch_ops():
    """float32 on the CPU runs the C kernel, float64 the torch ops: the same definitions."""
    x = images(n=16, size=20, seed=2)
    x[0] = 0.5                              # grey: no hue
    x[1, :, :4] = 1.0                       # saturated: clamped
    op = T.ColorJitter(0.8, 0.8, 0.8, 0.5)
    for seed in range(4):
        a, _ = op(x.clone(), None, generator=torch.Generator().manual_seed(seed))
        b, _ = op(x.double(), None, generator=torch.Generator().manual_seed(seed))
        assert torch.allclose(a.double(), b, atol=2e-5), (a.double() - b).abs().max()
    cl = x.contiguous(memory_format=torch.channels_last)
    a, _ = op(cl, None, generator=torch.Generator().manual_seed(0))
    b, _ = op(x.double(), None, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(a.double(), b, atol=2e-5)
    with pytest.raises(ValueError, match="3 values each"):
        cpu.color_jitter(x.clone(), torch.ones(16, 4), [0], (1.0, 1.0), (0.0, 0.0, 0.0))


_TRITON_CHECK = """
import torch
from fastdata import kernels
from fastdata.kernels import cpu
x = torch.rand(5, 3, 23, 41, generator=torch.Generator().manual_seed(0))
x[0] = 0.5
x[1, :, :4] = 1.0
f = torch.rand(5, 4, generator=torch.Generator().manual_seed(1)) * 1.6 + 0.2
f[:, 3] -= 1.0
for layout in (torch.contiguous_format, torch.channels_last):
    y = x.contiguous(memory_format=layout)
    for order in ([0, 1, 2, 3], [3, 2, 1, 0], [1], [2, 3], [3, 1, 0], []):
        for affine in ((), ((2.0, 3.0, 4.0), (-1.0, 0.0, 1.0))):
            a, b = y.clone(memory_format=layout), y.clone()
            kernels.triton().color_jitter(a, f, order, *affine)
            cpu.color_jitter(b, f, order, *affine)
            assert torch.allclose(a, b, atol=1e-5), (order, affine, (a - b).abs().max())
from fastdata import transforms as T
op = T.RandomErasing(0.7, value=(0.1, 0.2, 0.3))
boxes = op.boxes(5, 23, 41, x, torch.Generator().manual_seed(2))
ref, _ = op(x.clone(), None, generator=torch.Generator().manual_seed(2))   # the CPU's path
assert (ref != x).any() and boxes[:, 2].min() == 0
for layout in (torch.contiguous_format, torch.channels_last):
    a = x.contiguous(memory_format=layout)
    kernels.triton().erase(a, boxes, torch.tensor([0.1, 0.2, 0.3]))
    assert torch.equal(a, ref), layout
from fastdata.ops.crop import resample_weights
start, length = torch.tensor([0, 3, 10, 0, 5]), torch.tensor([41, 7, 30, 1, 36])
for flips in (None, torch.tensor([False, True, True, False, True])):
    for out, dtype, tol in ((16, torch.float32, 1e-6), (50, torch.float16, 1e-3)):
        a = kernels.triton().resample_weights(start, length, 41, out, flips, dtype)
        b = resample_weights(start, length, 41, out, flips, dtype)     # torch's, on the CPU
        assert a.dtype == b.dtype and torch.allclose(a.float(), b.float(), atol=tol)
print("same")
"""


def test_gpu_kernels_equal_the_cpu_paths_in_tritons_interpreter():
    """The Triton kernels that run ColorJitter, RandomErasing and the crop's resampling
    weights on CUDA, run by Triton's interpreter on the CPU: the same arithmetic as the C
    kernel, for every kind of order and both layouts, the same boxes erased as on the CPU,
    the same weights as torch's operations (flipped or not, down- and upscaled)."""
    pytest.importorskip("triton")
    if not cpu.available():
        pytest.skip("the C kernel is not built")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", _TRITON_CHECK], env=env, capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0 and out.stdout.strip() == "same", out.stderr[-2000:]


def test_random_grayscale():
    x = images(n=8)
    y, _ = T.RandomGrayscale(p=1.0)(x.clone(), None)
    grey = torch.from_numpy(np.stack([np_grey(i) for i in x.numpy()])).float()
    assert torch.allclose(y, grey[:, None].expand(-1, 3, -1, -1), atol=1e-6)
    assert torch.equal(T.RandomGrayscale(p=0.0)(x, None)[0], x)
    with pytest.raises(ValueError, match="p=2"):
        T.RandomGrayscale(p=2)


def test_random_erasing_boxes_follow_torchvision_sampling():
    x = images(n=200, size=32) + 1          # never 0: what is 0 afterwards was erased
    op = T.RandomErasing(p=0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0)
    y, _ = op(x.clone(), None, generator=torch.Generator().manual_seed(1))
    erased = 0
    for k in range(200):
        zero = (y[k] == 0).all(0).numpy()
        if not zero.any():
            assert torch.equal(y[k], x[k])
            continue
        erased += 1
        rows, cols = np.flatnonzero(zero.any(1)), np.flatnonzero(zero.any(0))
        h, w = rows[-1] - rows[0] + 1, cols[-1] - cols[0] + 1
        assert zero.sum() == h * w                          # one rectangle
        area = 32 * 32
        # h, w rounded from sqrt(area * scale * ratio): loose by the rounding
        assert 0.02 * area * 0.7 <= h * w <= 0.33 * area * 1.3, (h, w)
        assert 0.3 / 1.5 <= h / w <= 3.3 * 1.5
        assert (y[k][:, ~torch.from_numpy(zero)] == x[k][:, ~torch.from_numpy(zero)]).all()
    assert 70 <= erased <= 130              # p = 0.5 of 200
    for value in ((0.1, 0.2, 0.3), np.array([0.1, 0.2, 0.3])):
        y, _ = T.RandomErasing(p=1.0, value=value)(x.clone(), None)
        filled = (y != x).all(1)
        assert filled.any() and torch.allclose(y[0][:, filled[0]].T,
                                               torch.tensor([0.1, 0.2, 0.3]))
    for bad in ("randn", None, float("nan"), (0.1, 0.2)):
        with pytest.raises(ValueError, match="value="):
            T.RandomErasing(value=bad)


def test_mixup_blends_images_and_one_hot_targets_by_one_lambda():
    x, labels = images(n=6), torch.tensor([0, 1, 2, 0, 1, 2])
    y, soft = T.MixUp(alpha=0.4, num_classes=3)(x.clone(), labels, generator=torch.Generator()
                                                 .manual_seed(0))
    assert soft.shape == (6, 3) and soft.dtype == torch.float32
    assert torch.allclose(soft.sum(1), torch.ones(6))
    lam = float(soft[0, 0])                     # sample 0 is class 0, its partner class 2
    assert 0 <= lam <= 1 and math.isclose(float(soft[0, 2]), 1 - lam, abs_tol=1e-6)
    assert torch.allclose(y, lam * x + (1 - lam) * x.roll(1, 0), atol=1e-6)
    lams = {round(float(T.MixUp(alpha=0.4, num_classes=3)(x, labels, generator=torch.Generator()
                                                          .manual_seed(s))[1][0, 0]), 6)
            for s in range(40)}
    # Beta(0.4, 0.4) puts most of its mass near 0 and 1
    assert len(lams) == 40 and sum(v < 0.2 or v > 0.8 for v in lams) > 20


def test_cutmix_pastes_one_box_and_mixes_targets_by_its_area():
    x, labels = images(n=5, size=20), torch.tensor([0, 1, 2, 3, 4])
    for seed in range(10):
        y, soft = T.CutMix(alpha=1.0, num_classes=5)(x.clone(), labels, generator=torch.Generator()
                                                      .manual_seed(seed))
        moved = (y == x.roll(1, 0)).all(1) & (x != x.roll(1, 0)).any(1)   # (B, H, W)
        box = moved[0].numpy()
        assert (moved == moved[0]).all()                # the same box in every image
        kept = 1 - box.sum() / 400
        if box.any():
            rows, cols = np.flatnonzero(box.any(1)), np.flatnonzero(box.any(0))
            assert box.sum() == len(rows) * len(cols)   # a rectangle
        assert np.isclose(float(soft[0, 0]), kept) and np.isclose(float(soft[0, 4]), 1 - kept)
        unmoved = torch.from_numpy(~box)
        assert torch.equal(y[:, :, unmoved], x[:, :, unmoved])


def test_compose_and_random_choice():
    x, labels = images(n=4), torch.tensor([0, 1, 2, 3])
    mix = T.MixUp(1.0, num_classes=4)
    cut = T.CutMix(1.0, num_classes=4)
    picks = set()
    for s in range(30):
        g = torch.Generator().manual_seed(s)
        y, soft = T.RandomChoice([mix, cut], p=[0.5, 0.5])(x.clone(), labels, generator=g)
        picks.add("cut" if ((y == x) | (y == x.roll(1, 0))).all() else "mix")
        assert soft.shape == (4, 4)
    assert picks == {"cut", "mix"}
    seq = T.Compose([T.RandomGrayscale(1.0), lambda im, lb: (im * 0.5, lb + 1)])
    y, lb = seq(x.clone(), labels)
    assert torch.allclose(y, T.RandomGrayscale(1.0)(x.clone(), labels)[0] * 0.5)
    assert lb.tolist() == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="p="):
        T.RandomChoice([mix, cut], p=[1.0])
    with pytest.raises(TypeError, match="must return"):
        T.Compose([lambda im, lb: im])(x, labels)


def foldable(classes: int) -> T.Compose:
    """A recipe the loader's normalisation folds into (ColorJitter's pass)."""
    return T.Compose([T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.RandomGrayscale(0.5),
                      T.RandomErasing(0.7, value=0.3),
                      T.RandomErasing(0.7, value="random"),
                      T.RandomChoice([T.MixUp(0.8, num_classes=classes),
                                      T.CutMix(1.0, num_classes=classes)])])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])    # C kernel, torch ops
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
def test_normalisation_folded_into_a_recipe_gives_the_same_batches(dtype, layout):
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    norm = Normalize(mean, std, torch.float32, layout)
    recipe = foldable(4)
    assert recipe.fold_normalization(norm.scale, norm.shift) is not None
    x = images(n=6, size=16).to(dtype).contiguous(memory_format=layout)
    labels = torch.arange(6) % 4
    m, s = (torch.tensor(v, dtype=torch.float64).view(3, 1, 1) for v in (mean, std))
    for seed in range(6):
        got, y = BatchHook(recipe, norm)(x.clone(memory_format=layout), labels, seed)
        ref, ry = call(recipe, x.clone(memory_format=layout), labels,
                         batch_generator(seed, x.device))
        assert got.dtype == torch.float32 and got.is_contiguous(memory_format=layout)
        assert torch.allclose(got.double(), (ref.double() - m) / s, atol=1e-4)
        assert torch.equal(y, ry)


def test_the_normalisation_after_a_transform():
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    x = images(n=5, size=9)
    ref = (x.double() - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1)
    for layout in (torch.contiguous_format, torch.channels_last):     # the C kernel's pass
        for dtype in (torch.float32, torch.bfloat16):
            norm = Normalize(mean, std, dtype, layout)
            y = norm(x.clone(memory_format=layout))     # in place: the batch is the loader's
            assert y.dtype == dtype and y.is_contiguous(memory_format=layout)
            assert torch.allclose(y.double(), ref, atol=1e-5 if dtype == torch.float32 else 0.02)
    wide = torch.zeros(5, 3, 9, 12)
    wide[..., :9] = x
    part = wide[..., :9]                    # strided: torch's multiply-add
    assert torch.allclose(Normalize(mean, std, torch.float32, torch.contiguous_format)(
        part).double(), ref, atol=1e-5)


def test_normalisation_is_not_folded_where_an_op_after_the_fold_would_change():
    scale, shift = (2.0, 3.0, 4.0), (0.0, 1.0, 2.0)
    for fn in (T.Compose([T.ColorJitter(0.4), T.TrivialAugment()]),    # it cannot follow
               T.RandomGrayscale(0.5), T.MixUp(1.0, num_classes=3)):      # nothing to fold
        assert fn.fold_normalization(scale, shift) is None
    folded = T.Compose([T.ColorJitter(0.4), T.RandomErasing()]).fold_normalization(scale, shift)
    assert folded.transforms[1]._affine == (scale, shift)
    assert T.Compose([T.ColorJitter(0.4), lambda im, lb: (im, lb)]).fold_normalization(
        scale, shift) is None       # a user's function sees values in [0, 1]

    class Mine(T.ColorJitter):      # its own __call__, which need not honour a fold
        def __call__(self, images, labels, generator=None):
            return images, labels

    class Honest(Mine):             # its own __call__ and its own fold
        def fold_normalization(self, scale, shift):
            return "folded"

    assert ask(Mine(0.4), "fold_normalization", scale, shift) is None
    assert ask(Honest(0.4), "fold_normalization", scale, shift) == "folded"
    assert T.Compose([Mine(0.4), T.MixUp(1.0, num_classes=3)]).fold_normalization(
        scale, shift) is None
    assert ask(T.ColorJitter(0.4), "fold_normalization", scale, shift) is not None


def pil_of(x: torch.Tensor) -> Image.Image:
    return Image.fromarray((x.permute(1, 2, 0) * 255).round().byte().numpy())


def levels(x: torch.Tensor) -> np.ndarray:
    return (x.permute(1, 2, 0) * 255).round().byte().numpy().astype(int)


def test_trivial_augment_operations_match_pil():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (1, 3, 16, 16), generator=g).float() / 255
    img, one, zero = pil_of(x[0]), torch.ones(1), torch.zeros(1)
    cases = [
        (C.posterize(x, 3 * one), ImageOps.posterize(img, 3), 0),
        (C.solarize(x, 128 / 255 * one), ImageOps.solarize(img, 128), 0),
        (C.equalize(x), ImageOps.equalize(img), 0),
        (C.autocontrast(x), ImageOps.autocontrast(img), 1),       # PIL rounds its table
        (G.affine(x, 30 * one, zero, zero, zero, zero), img.rotate(30, Image.NEAREST), 0),
        (G.affine(x, zero, one * math.degrees(math.atan(0.3)), zero, zero, zero),
         img.transform(img.size, Image.AFFINE, (1, 0.3, 0, 0, 1, 0), Image.NEAREST), 0),
        (G.affine(x, zero, zero, zero, 5 * one, zero),
         img.transform(img.size, Image.AFFINE, (1, 0, -5, 0, 1, 0), Image.NEAREST), 0),
    ]
    for k, (ours, ref, tol) in enumerate(cases):
        assert np.abs(levels(ours[0]) - np.asarray(ref)).max() <= tol, k
    assert torch.equal(G.affine(x, 90 * one, zero, zero, zero, zero), torch.rot90(x, 1, (-2, -1)))


def test_trivial_augment_draws_an_operation_per_image_the_same_on_either_path():
    x = images(n=64, size=16, seed=1)
    op = T.TrivialAugment()
    kinds, mags = op.draw(64, torch.Generator().manual_seed(5))
    assert len(set(kinds.tolist())) > 8 and mags.abs().max() <= 135
    a = op.grouped(x.clone(), kinds, mags)
    b = op.by_operation(x.clone(), kinds, mags)
    assert torch.allclose(a, b, atol=1e-6)
    for k in range(64):         # each image is its own operation's result
        fn = T.TRIVIAL_OPS[op.ops[int(kinds[k])]][2]
        assert torch.allclose(a[k], fn(x[k:k + 1], mags[k:k + 1])[0], atol=1e-6)
    y, _ = op(x.clone(), None, generator=torch.Generator().manual_seed(5))
    assert torch.equal(y, a)
    # as the loader hands it on CUDA: channels_last
    cl = x.contiguous(memory_format=torch.channels_last)
    assert torch.allclose(op.grouped(cl.clone(memory_format=torch.channels_last), kinds, mags),
                          a, atol=1e-6)
    assert torch.allclose(op.by_operation(cl, kinds, mags), a, atol=1e-6)
    sub = T.TrivialAugment(ops=["contrast", "rotate", "identity", "solarize"])
    kinds, mags = sub.draw(64, torch.Generator().manual_seed(6))
    assert torch.allclose(sub.grouped(x.clone(), kinds, mags),
                          sub.by_operation(x.clone(), kinds, mags), atol=1e-6)
    only = T.TrivialAugment(ops=["solarize"])
    assert set(only.draw(8, None)[0].tolist()) == {0}
    with pytest.raises(ValueError, match="ops="):
        T.TrivialAugment(ops=["blur"])


# ---- the loader hooks ----
def flip_some(image, rng):
    """A sample transform: mirror with probability 1/2, from its generator."""
    return image[:, ::-1] if rng.random() < 0.5 else image


def wrong_shape(image, rng):
    return image[:8]


RECIPE = T.Compose([T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.RandomGrayscale(0.2), T.RandomErasing(),
                    T.RandomChoice([T.MixUp(0.8, num_classes=3), T.CutMix(1.0, num_classes=3)])])


def run(path, **kw):
    args = dict(batch_size=5, size=32, crop=24, device="cpu", seed=4)
    if not isinstance(kw.get("backend"), fastdata.Backend):     # an instance has its own
        args["num_workers"] = 2
    return list(fastdata.Loader(path, **{**args, **kw}))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_an_identity_batch_transform_changes_nothing(shards, device):
    # bfloat16: the built-in path rounds to uint8 after the resize (a grey level is 0.017
    # after normalising) and bfloat16 holds 8 bits (0.016 at 2); on CUDA both resize with
    # float16 products
    for kw, tol in (({}, 1e-4), ({"dtype": "bfloat16", "channels_last": True}, 0.05)):
        plain = run(shards["hdf5"], device=device, **kw)
        hooked = run(shards["hdf5"], batch_transform=lambda x, y: (x, y), device=device, **kw)
        for (a, la), (b, lb) in zip(plain, hooked):
            assert a.dtype == b.dtype and a.stride() == b.stride()
            assert torch.allclose(a.float(), b.float(), atol=tol) and torch.equal(la, lb)


def test_a_batch_transform_may_return_a_view_that_cannot_be_written_in_place(shards):
    """An expanded tensor (one grey plane seen as three channels) is normalised into a new
    tensor: in place, it raised."""
    def grey(x, y):
        return x.mean(1, keepdim=True).expand_as(x), y
    for kw, tol in (({}, 1e-5), ({"channels_last": True, "dtype": "bfloat16"}, 0.02)):
        got = run(shards["hdf5"], batch_transform=grey, **kw)
        want = run(shards["hdf5"], batch_transform=lambda x, y: (grey(x, y)[0].clone(), y), **kw)
        for (a, la), (b, lb) in zip(got, want):
            assert torch.allclose(a.float(), b.float(), atol=tol) and torch.equal(la, lb)
            assert a.dtype == b.dtype and a.stride() == b.stride()


@pytest.mark.parametrize("bad,match", [
    (lambda x, y: (x[:, :1], y), r"shape \(5, 1, 24, 24\)"),
    (lambda x, y: (x[1:], y), r"shape \(4, 3, 24, 24\)"),
    (lambda x, y: ((x * 255).to(torch.uint8), y), r"shape \(5, 3, 24, 24\), torch.uint8"),
    (lambda x, y: (x[0], y), r"shape \(3, 24, 24\)")])
def test_a_batch_transform_that_breaks_the_batch_is_named(shards, bad, match):
    with pytest.raises(ValueError, match=f"batch_transform returned images of {match}"):
        run(shards["hdf5"], batch_transform=bad, num_workers=0)


@pytest.mark.parametrize("bad,match", [
    (lambda x, y: (x, y[:2]), r"labels of shape \(2,\)"),
    (lambda x, y: (x, y[0]), r"labels of shape \(\)"),
    (lambda x, y: (x, y.tolist()), r"labels of type list")])
def test_a_batch_transform_whose_labels_do_not_fit_the_batch_is_named(shards, bad, match):
    """Labels of another batch size than the images were accepted, and failed in the loss."""
    with pytest.raises(ValueError, match=f"batch_transform returned {match}.* a tensor of 5 "
                                         f"labels"):
        run(shards["hdf5"], batch_transform=bad, num_workers=0)


def test_a_mix_with_too_few_classes_for_the_set_is_refused(shards):
    """The set has 3 classes: a one-hot target of 2 columns would fail inside a kernel on a
    GPU (taking the CUDA context with it); refused when the loader is made."""
    nested = T.Compose([T.ColorJitter(0.4), T.RandomChoice([T.MixUp(num_classes=3),
                                                            T.CutMix(num_classes=2)])])
    with pytest.raises(ValueError, match=r"CutMix\(num_classes=2\) .* 3 classes"):
        fastdata.Loader(shards["hdf5"], batch_size=4, batch_transform=nested)
    fastdata.Loader(shards["hdf5"], batch_size=4, batch_transform=T.MixUp(num_classes=5))


def test_a_loader_folds_its_normalisation_into_a_recipe_with_the_same_batches(shards):
    recipe = foldable(3)
    folded = run(shards["hdf5"], batch_transform=recipe, channels_last=True)
    plain = run(shards["hdf5"], batch_transform=lambda x, y, generator: recipe(
        x, y, generator=generator), channels_last=True)      # not a BatchTransform: unfolded
    for (a, la), (b, lb) in zip(folded, plain):
        assert torch.allclose(a, b, atol=1e-4) and torch.equal(la, lb)
        assert a.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("workers", [(0, "thread"), (2, "process")])
def test_hooks_give_the_same_batches_whatever_the_workers(shards, workers):
    kw = dict(sample_transform=flip_some, batch_transform=RECIPE)
    a = run(shards["lmdb"], num_workers=2, **kw)
    b = run(shards["lmdb"], backend=fastdata.TorchBackend(num_workers=workers[0],
                                                          workers=workers[1]), **kw)
    assert len(a) == len(b) == 4
    for (x, y), (u, v) in zip(a, b):
        assert x.shape == (5, 3, 24, 24) and y.shape == (5, 3) and y.dtype == torch.float32
        assert torch.equal(x, u) and torch.equal(y, v)
    plain = run(shards["lmdb"], batch_transform=RECIPE)
    assert any(not torch.equal(x, u) for (x, _), (u, _) in zip(a, plain))  # the flips count


def test_sample_transform_sees_the_stored_image_before_the_crop(shards):
    seen = []

    def record(image, rng):
        seen.append(image.shape)
        return 255 - image
    loader = fastdata.Loader(shards["hdf5"], batch_size=4, size=16, dtype="uint8",
                             augment=False, shuffle=False, device="cpu", num_workers=0,
                             sample_transform=record)
    x, _ = next(iter(loader))
    stored = loader.dataset.read_batch(range(4), size=16)
    assert seen[:4] == [(16, 16, 3)] * 4
    assert np.array_equal(x.permute(0, 2, 3, 1).numpy(), 255 - stored)


def test_hook_errors_name_the_problem(shards):
    with pytest.raises(ValueError, match="shape"):
        run(shards["hdf5"], sample_transform=wrong_shape)
    with pytest.raises(ValueError, match="cannot be sent to worker processes"):
        fastdata.Loader(shards["hdf5"], batch_size=4,
                        backend=fastdata.TorchBackend(workers="process"),
                        sample_transform=lambda im, rng: im)
    with pytest.raises(ValueError, match="float dtype"):
        fastdata.Loader(shards["hdf5"], batch_size=4, dtype="uint8",
                        batch_transform=RECIPE)
    with pytest.raises(TypeError, match="callable"):
        fastdata.Loader(shards["hdf5"], batch_size=4, batch_transform="mixup")


def test_both_backends_give_the_same_labels_with_a_batch_transform(shards):
    pytest.importorskip("nvidia.dali", reason="DALI not installed")
    kw = dict(sample_transform=flip_some, batch_transform=RECIPE)
    torch_ = run(shards["lmdb"], **kw)
    dali = run(shards["lmdb"], backend="dali", **kw)
    assert len(torch_) == len(dali)
    for (x, y), (u, v) in zip(torch_, dali):
        assert x.shape == u.shape and x.dtype == u.dtype
        assert torch.allclose(y, v)


# ---- soft targets in training ----
def test_train_step_takes_soft_targets_and_label_smoothing():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    x = torch.randn(4, 3, 2, 2)
    labels = torch.tensor([0, 1, 2, 1])
    soft = T.MixUp(1.0, num_classes=3)(x, labels, generator=torch.Generator().manual_seed(0))[1]
    step = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.0), precision="fp32")
    logits = model(x)
    expected = -(soft * logits.log_softmax(1)).sum(1).mean()
    assert torch.allclose(step(x, soft), expected, atol=1e-6)
    smooth = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.0), precision="fp32",
                       label_smoothing=0.1)
    target = T.soft_targets(labels, 3) * 0.9 + 0.1 / 3
    expected = -(target * logits.log_softmax(1)).sum(1).mean()
    assert torch.allclose(smooth(x, labels), expected, atol=1e-6)
    with pytest.raises(ValueError, match="label_smoothing=1.5"):
        TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.0), label_smoothing=1.5)


@pytest.mark.gpu
def test_each_transform_of_a_cuda_batch_draws_its_own_values():
    """A CUDA batch's per-batch values are drawn on the host (no device value read): each
    transform from a stream of its own, and the same streams again from the same seed."""
    def draws(seed):
        g = torch.Generator("cuda").manual_seed(seed)
        return [torch.rand(4, generator=host_generator(g)) for _ in range(3)]
    a, b = draws(7), draws(7)
    assert all(torch.equal(p, q) for p, q in zip(a, b))
    assert not torch.equal(a[0], a[1]) and not torch.equal(a[1], a[2])
    assert torch.equal(a[0], torch.rand(4, generator=torch.Generator().manual_seed(7)))


@pytest.mark.gpu
def test_operations_on_cuda_match_the_cpu():
    x = images(n=32, size=24, seed=4)
    f = torch.rand(32, generator=torch.Generator().manual_seed(1)).view(32, 1, 1, 1) * 2
    for fn in (C.adjust_brightness, C.adjust_contrast, C.adjust_saturation, C.adjust_sharpness):
        assert torch.allclose(fn(x.cuda(), f.cuda()).cpu(), fn(x.clone(), f), atol=1e-5)
    assert torch.allclose(C.adjust_hue(x.cuda(), f.view(-1).cuda() - 1).cpu(),
                          C.adjust_hue(x, f.view(-1) - 1), atol=1e-5)
    jitter = T.ColorJitter(0.8, 0.8, 0.8, 0.5)   # float32: the Triton kernel, where it imports
    for seed in range(4):
        for layout in (torch.contiguous_format, torch.channels_last):
            fused, _ = jitter(x.cuda().contiguous(memory_format=layout), None,
                              generator=torch.Generator("cuda").manual_seed(seed))
            ops, _ = jitter(x.cuda().double(), None,
                            generator=torch.Generator("cuda").manual_seed(seed))
            assert torch.allclose(fused.double(), ops, atol=2e-5)
    erase = T.RandomErasing(0.7, value=(0.1, 0.2, 0.3))    # the Triton kernel, where it imports
    for layout in (torch.contiguous_format, torch.channels_last):
        got, _ = erase(x.cuda().contiguous(memory_format=layout), None,
                       generator=torch.Generator("cuda").manual_seed(5))
        boxes = erase.boxes(32, 24, 24, x.cuda(), torch.Generator("cuda").manual_seed(5))
        ref = x.clone()
        for k, (t, l, h, w) in enumerate(boxes.tolist()):
            ref[k, :, t:t + h, l:l + w] = torch.tensor([0.1, 0.2, 0.3]).view(3, 1, 1)
        assert torch.equal(got.cpu(), ref) and not torch.equal(ref, x)
    labels = torch.arange(32) % 5
    for mix in (T.MixUp(0.8, num_classes=5), T.CutMix(1.0, num_classes=5)):
        a, ya = mix(x.cuda(), labels.cuda(), generator=torch.Generator("cuda").manual_seed(3))
        b, yb = mix(x.clone(), labels, generator=torch.Generator().manual_seed(3))
        assert torch.allclose(a.cpu(), b, atol=1e-6) and torch.allclose(ya.cpu(), yb)
    op = T.TrivialAugment()
    kinds, mags = op.draw(32, torch.Generator().manual_seed(2))
    on_gpu = op.by_operation(x.cuda(), kinds, mags).cpu()
    assert torch.allclose(on_gpu, op.grouped(x.clone(), kinds, mags), atol=1e-4)
