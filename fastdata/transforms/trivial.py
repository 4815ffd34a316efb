"""TrivialAugment, batched: an operation and a magnitude per image."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from fastdata.checks import integer
from fastdata.kernels.device import to_device
from fastdata.ops.batch import BatchTransform, host_generator
from fastdata.ops.color import (
    adjust_brightness,
    adjust_contrast,
    adjust_saturation,
    adjust_sharpness,
    autocontrast,
    equalize,
    posterize,
    solarize,
)
from fastdata.ops.geometry import AFFINE_ARGS, affine, affine_args


def _geometric(name: str) -> Callable:
    return lambda x, m: affine(x, *affine_args([name], torch.zeros_like(m), m))


# name -> (largest magnitude, signed, fn(images, magnitudes)); torchvision's TrivialAugmentWide
TRIVIAL_OPS = {
    "identity": (0.0, False, lambda x, m: x),
    "shear_x": (0.99, True, _geometric("shear_x")),
    "shear_y": (0.99, True, _geometric("shear_y")),
    "translate_x": (32.0, True, _geometric("translate_x")),
    "translate_y": (32.0, True, _geometric("translate_y")),
    "rotate": (135.0, True, _geometric("rotate")),
    "brightness": (0.99, True, lambda x, m: adjust_brightness(x, 1 + m.view(-1, 1, 1, 1))),
    "color": (0.99, True, lambda x, m: adjust_saturation(x, 1 + m.view(-1, 1, 1, 1))),
    "contrast": (0.99, True, lambda x, m: adjust_contrast(x, 1 + m.view(-1, 1, 1, 1))),
    "sharpness": (0.99, True, lambda x, m: adjust_sharpness(x, 1 + m.view(-1, 1, 1, 1))),
    "posterize": (6.0, False, lambda x, m: posterize(x, 8 - m.round())),
    "solarize": (1.0, False, lambda x, m: solarize(x, 1 - m)),
    "autocontrast": (0.0, False, lambda x, m: autocontrast(x)),
    "equalize": (0.0, False, lambda x, m: equalize(x)),
}


class TrivialAugment(BatchTransform):
    """torchvision's ``TrivialAugmentWide``, batched: each image gets one operation of
    ``ops`` (all of ``TRIVIAL_OPS`` by default) at a magnitude of ``num_bins`` levels, drawn
    per image, with a random sign where the operation has one. Geometric operations fill with
    black. Each operation runs on the images that drew it; the draws are made on the host, so
    grouping the images by operation reads nothing from a GPU."""

    def __init__(self, num_bins: int = 31, ops: Sequence[str] | None = None):
        self.ops = list(TRIVIAL_OPS) if ops is None else list(ops)
        unknown = [o for o in self.ops if o not in TRIVIAL_OPS]
        if unknown or not self.ops:
            raise ValueError(f"ops={ops!r} is not valid; choose among {', '.join(TRIVIAL_OPS)}")
        self.num_bins = integer("num_bins", num_bins, 2)

    def draw(self, n: int, generator):
        """``(op, magnitude)`` per image, on the host: (B,) int64 indices into ``ops`` and
        (B,) float32."""
        host = host_generator(generator)
        op = torch.randint(len(self.ops), (n,), generator=host)
        level = torch.randint(self.num_bins, (n,), generator=host)
        sign = torch.randint(2, (n,), generator=host) * 2 - 1
        top = torch.tensor([TRIVIAL_OPS[o][0] for o in self.ops], dtype=torch.float32)
        signed = torch.tensor([TRIVIAL_OPS[o][1] for o in self.ops])
        mag = top[op] * level / (self.num_bins - 1)
        return op, torch.where(signed[op], mag * sign, mag)

    def __call__(self, images, labels, generator=None):
        """The batch transformed: ``(images, labels)``."""
        op, mag = self.draw(len(images), generator)
        if images.device.type == "cpu":
            return self.grouped(images, op, mag), labels
        return self.by_operation(images, op, mag), labels

    def grouped(self, images, op, mag):
        """Each operation on the images that drew it, in place, image by image (the CPU's)."""
        for k in torch.unique(op).tolist():
            if self.ops[k] == "identity":
                continue
            idx = (op == k).nonzero()[:, 0]
            # as planes: per-channel and per-image broadcasts run faster on them
            out = TRIVIAL_OPS[self.ops[k]][2](images[idx].contiguous(), mag[idx])
            # back image by image: a plain copy whatever the result's layout (an indexed
            # assignment from another layout is slower)
            for j, i in enumerate(idx.tolist()):
                images[i].copy_(out[j])
        return images

    def by_operation(self, images, op, mag):
        """Each operation on the images that drew it, in place, on the batch sorted by
        operation (a GPU's): one gather and one scatter of the batch, each operation on a
        range of it, the geometric ones on one range as one resampling with each image's own
        matrix. ``op`` and ``mag`` on the host."""
        geometric = [name in AFFINE_ARGS for name in self.ops]
        group = torch.tensor([-1 if g else k for k, g in enumerate(geometric)])[op]
        order = torch.argsort(group, stable=True)
        op, mag = op[order], mag[order]
        idx, mags = to_device(order, images), to_device(mag, images)
        batch = images.index_select(0, idx)
        keys, counts = torch.unique_consecutive(group[order], return_counts=True)
        start = 0
        for key, count in zip(keys.tolist(), counts.tolist()):
            part, start = slice(start, start + count), start + count
            if key < 0:
                batch[part] = affine(batch[part], *affine_args(self.ops, op[part], mag[part]))
            elif self.ops[key] != "identity":
                batch[part] = TRIVIAL_OPS[self.ops[key]][2](batch[part], mags[part])
        return images.index_copy_(0, idx, batch)
