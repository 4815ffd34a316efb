"""How a loader calls users' transforms: a ``torch.nn.Module`` or any callable as a batch
transform, taking the labels or the images alone, with a generator only where it names one;
a module as a sample transform, on (3, S, S) uint8 tensors as torchvision's take them."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import fastdata
from fastdata.ops.batch import call, takes_generator, takes_labels
from fastdata.ops.sample import takes_tensor


class Darken(nn.Module):
    """A module whose forward takes the images and the labels, as a MixUp's does."""

    def forward(self, images, labels):
        return images * 0.5, labels + 1


class Invert(nn.Module):
    """A module whose forward takes the images alone, as torchvision's v1 transforms."""

    def forward(self, images):
        return images.flip(-1) if images.dtype == torch.uint8 else 1 - images


class AnyInputs(nn.Module):
    """``forward(*inputs)``, as torchvision's v2 transforms: the structure given comes back."""

    def forward(self, *inputs):
        return inputs[0] * 2, inputs[1]


def open_kwargs(images, labels, **kwargs):
    """A function with ``**kwargs``: it names no generator and is given none."""
    assert "generator" not in kwargs, kwargs
    return images, labels


def run(path, **kw):
    args = dict(batch_size=4, size=16, crop=16, device="cpu", seed=3, augment=False,
                shuffle=False)
    if not isinstance(kw.get("backend"), fastdata.Backend):     # an instance has its own
        args["num_workers"] = 2
    return list(fastdata.Loader(path, **{**args, **kw}))


def test_how_each_kind_of_callable_is_called():
    x, y = torch.rand(2, 3, 4, 4), torch.tensor([0, 1])
    g = torch.Generator().manual_seed(0)
    assert takes_labels(Darken()) and not takes_generator(Darken())
    assert not takes_labels(Invert()) and takes_labels(AnyInputs())
    assert not takes_generator(open_kwargs) and takes_labels(open_kwargs)
    assert takes_generator(lambda a, b, generator=None: (a, b))
    images, labels = call(Invert(), x, y, g)
    assert torch.equal(images, 1 - x) and labels is y
    images, labels = call(AnyInputs(), x, y, g)
    assert torch.equal(images, 2 * x) and labels is y
    assert call(open_kwargs, x, y, g)[0] is x
    with pytest.raises(TypeError, match="takes the images alone and returned tuple"):
        call(lambda a: (a, a), x, y, g)
    assert takes_tensor(Invert()) and not takes_tensor(lambda image, rng: image)


@pytest.mark.parametrize("kw", [{}, {"backend": fastdata.TorchBackend(workers="process")},
                                {"num_workers": 0}])
def test_a_module_is_a_batch_transform_on_every_worker_kind(shards, kw):
    plain = run(shards["hdf5"])
    for module, check in ((Darken(), lambda a, b, la, lb: (torch.equal(lb, la + 1),
                                                             torch.allclose(b, a * 0.5))),
                          (Invert(), lambda a, b, la, lb: (torch.equal(lb, la),
                                                           torch.allclose(b, 1 - a)))):
        hooked = run(shards["hdf5"], batch_transform=module, mean=(0.0,) * 3,
                     std=(1.0,) * 3, **kw)
        unit = run(shards["hdf5"], mean=(0.0,) * 3, std=(1.0,) * 3)
        assert len(hooked) == len(plain) == len(unit) > 0
        for (a, la), (b, lb) in zip(unit, hooked):
            assert all(check(a, b, la, lb)), type(module).__name__


def test_a_module_is_a_batch_transform_on_the_dali_backend(shards):
    pytest.importorskip("nvidia.dali", reason="DALI not installed")
    args = dict(mean=(0.0,) * 3, std=(1.0,) * 3)
    unit = run(shards["lmdb"], backend="dali", **args)
    hooked = run(shards["lmdb"], backend="dali", batch_transform=Darken(), **args)
    for (a, la), (b, lb) in zip(unit, hooked):
        assert torch.allclose(b, a * 0.5) and torch.equal(lb, la + 1)


@pytest.mark.parametrize("kw", [{}, {"backend": fastdata.TorchBackend(workers="process")}])
def test_a_module_is_a_sample_transform_on_chw_uint8_tensors(shards, kw):
    """A module gets each stored image as torchvision's transforms take one, (3, S, S)
    uint8: ``Invert`` mirrors it along its last axis, the image's width."""
    x, _ = run(shards["hdf5"], dtype="uint8", crop=None, sample_transform=Invert(), **kw)[0]
    stored = fastdata.open(shards["hdf5"]).read_batch(range(4), size=16)
    assert np.array_equal(x.permute(0, 2, 3, 1).numpy(), stored[:, :, ::-1])
