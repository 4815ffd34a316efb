"""torchvision's own transforms (v1 and v2) as batch and sample transforms, against the same
transforms applied by hand. Skipped where torchvision does not import beside this torch
(``.ci/torchvision`` runs them in a virtual environment of their own)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fastdata
from fastdata import transforms as T

try:
    import torchvision  # noqa: F401
    from torchvision import transforms as v1
    from torchvision.transforms import v2
except Exception as e:  # noqa: BLE001 - a torchvision built for another torch fails in many ways
    pytest.skip(f"torchvision does not import here: {type(e).__name__}: {e}",
                allow_module_level=True)

UNIT = dict(mean=(0.0,) * 3, std=(1.0,) * 3)


def run(path, **kw):
    args = dict(batch_size=4, size=32, crop=24, device="cpu", seed=5, **UNIT)
    if not isinstance(kw.get("backend"), fastdata.Backend):     # an instance has its own
        args["num_workers"] = 0
    return list(fastdata.Loader(path, **{**args, **kw}))


@pytest.mark.parametrize("make", [
    lambda: v2.ColorJitter(0.4, 0.4, 0.4, 0.1),
    lambda: v2.Compose([v2.RandomGrayscale(0.5), v2.ColorJitter(brightness=0.5)]),
    lambda: v1.ColorJitter(0.4, 0.4, 0.4, 0.1),
    lambda: v1.Compose([v1.RandomGrayscale(0.5), v1.GaussianBlur(3)]),
    lambda: v2.MixUp(num_classes=3),
    lambda: v2.CutMix(num_classes=3),
    lambda: v2.RandomChoice([v2.MixUp(num_classes=3), v2.CutMix(num_classes=3)])],
    ids=["v2-jitter", "v2-compose", "v1-jitter", "v1-compose", "v2-mixup", "v2-cutmix",
         "v2-choice"])
def test_a_torchvision_transform_gives_what_it_gives_by_hand(shards, make):
    """The loader's batches equal the transform applied by hand to the untransformed batches,
    with torch's global generator seeded alike (the loader draws nothing from it)."""
    unit = run(shards["hdf5"])
    t = make()
    torch.manual_seed(0)
    want = [t(x, y) if not isinstance(t, (v1.ColorJitter, v1.Compose)) else (t(x), y)
            for x, y in unit]
    torch.manual_seed(0)
    got = run(shards["hdf5"], batch_transform=make())
    assert len(got) == len(want) > 0
    for (a, la), (b, lb) in zip(got, want):
        assert torch.allclose(a, b, atol=1e-6) and torch.allclose(la.float(), lb.float())
    if "num_classes" in repr(t) or isinstance(t, v2.RandomChoice):
        assert got[0][1].shape == (4, 3) and got[0][1].dtype == torch.float32


@pytest.mark.parametrize("kw", [{"num_workers": 2},
                                {"backend": fastdata.TorchBackend(workers="process",
                                                                  num_workers=2)}])
def test_torchvision_transforms_run_in_reader_workers(shards, kw):
    recipe = v2.Compose([v2.ColorJitter(0.4, 0.4), v2.RandomChoice([v2.MixUp(num_classes=3),
                                                                     v2.CutMix(num_classes=3)])])
    got = run(shards["lmdb"], batch_transform=recipe, sample_transform=v2.RandomRotation(10),
              **kw)
    assert len(got) > 0
    for images, labels in got:
        assert images.shape == (4, 3, 24, 24) and labels.shape == (4, 3)
        assert torch.allclose(labels.sum(1), torch.ones(4))


def test_on_the_dali_backend(shards):
    pytest.importorskip("nvidia.dali", reason="DALI not installed")
    got = run(shards["lmdb"], backend="dali", batch_transform=v2.MixUp(num_classes=3))
    assert got and all(y.shape == (4, 3) for _, y in got)


def test_a_v2_transform_draws_once_a_batch_and_per_image_with_per_image(shards):
    """Given the batch, v2's ColorJitter scales every image by one brightness factor; through
    ``PerImage`` each image draws its own."""
    unit = run(shards["hdf5"], augment=False, crop=None)
    jitter = v2.ColorJitter(brightness=(0.3, 0.7))     # no clamp: every pixel x * factor

    def factors(images):
        return [float(a.sum() / b.sum()) for a, b in zip(images, unit[0][0])]
    torch.manual_seed(1)
    once = factors(run(shards["hdf5"], augment=False, crop=None, batch_transform=jitter)[0][0])
    torch.manual_seed(1)
    each = factors(run(shards["hdf5"], augment=False, crop=None,
                       batch_transform=T.PerImage(jitter))[0][0])
    assert max(once) - min(once) < 1e-4
    assert max(each) - min(each) > 1e-3 and all(0.3 - 1e-4 <= f <= 0.7 + 1e-4 for f in each)


def test_a_torchvision_transform_as_a_sample_transform(shards):
    """It gets (3, S, S) uint8 tensors: a certain flip mirrors each stored image."""
    loader = fastdata.Loader(shards["hdf5"], batch_size=4, size=32, dtype="uint8",
                             augment=False, shuffle=False, device="cpu", num_workers=0,
                             sample_transform=v2.RandomHorizontalFlip(p=1.0))
    x, _ = next(iter(loader))
    stored = fastdata.open(shards["hdf5"]).read_batch(range(4), size=32)
    assert np.array_equal(x.permute(0, 2, 3, 1).numpy(), stored[:, :, ::-1])


def test_too_few_classes_in_a_torchvision_mixup_are_refused(shards):
    with pytest.raises(ValueError, match=r"MixUp\(num_classes=2\) .* 3 classes"):
        fastdata.Loader(shards["hdf5"], batch_size=4,
                        batch_transform=v2.Compose([v2.MixUp(num_classes=2)]))
