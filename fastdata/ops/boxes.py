"""Crop boxes drawn for a batch: torchvision's RandomResizedCrop sampling, the centre crop,
and their packing for one copy to a device."""
from __future__ import annotations

import math

import numpy as np
import torch

ATTEMPTS = 10


def attempts(n: int, height: int, width: int, scale, ratio, generator) -> tuple:
    """torchvision's draws of a box: ``ATTEMPTS`` per image of an area (``scale`` of the
    image's) and an aspect ratio (log-uniform in ``ratio``), each ``(n, ATTEMPTS)`` float32."""
    area = height * width * torch.empty(n, ATTEMPTS).uniform_(scale[0], scale[1],
                                                              generator=generator)
    log_ratio = torch.empty(n, ATTEMPTS).uniform_(math.log(ratio[0]), math.log(ratio[1]),
                                                  generator=generator)
    return area, torch.exp(log_ratio)


def first_fit(h: torch.Tensor, w: torch.Tensor, ok: torch.Tensor) -> tuple:
    """Each row's first attempt where ``ok``: ``(h, w, found)``, each ``(n,)`` (the first
    attempt's sides where none is ``ok``)."""
    first = ok.to(torch.float32).argmax(1, keepdim=True)
    return h.gather(1, first)[:, 0], w.gather(1, first)[:, 0], ok.any(1)


def place(height: int, width: int, h: torch.Tensor, w: torch.Tensor, generator) -> tuple:
    """``(top, left)`` of boxes of sides ``h``, ``w``, uniform over where they fit."""
    u = torch.rand(len(h), 2, generator=generator)
    return (u[:, 0] * (height - h + 1)).long(), (u[:, 1] * (width - w + 1)).long()


def random_resized_crop_boxes(n: int, height: int, width: int, *, scale=(0.08, 1.0),
                              ratio=(3 / 4, 4 / 3), generator=None) -> torch.Tensor:
    """``(n, 4)`` int64 boxes (top, left, h, w), torchvision's RandomResizedCrop.get_params.

    The draws and square roots are torch's; the rest is NumPy, in float32 as torch computes it
    (the same boxes): each small torch op would release and retake the GIL, a thread switch
    where reader threads share it."""
    area_t, aspect_t = attempts(n, height, width, scale, ratio, generator)
    area, aspect = area_t.numpy(), aspect_t.numpy()
    # torch's square root, as before (its float32 one is not always NumPy's, to the last bit)
    w = np.rint(torch.from_numpy(area * aspect).sqrt_().numpy()).astype(np.int64)
    h = np.rint(torch.from_numpy(area / aspect).sqrt_().numpy()).astype(np.int64)
    ok = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first, rows = ok.argmax(1), np.arange(n)        # each row's first fit (0 where none)
    r = width / height                                   # fallback: whole image, ratio clamped
    if r < ratio[0]:
        fh, fw = int(round(width / ratio[0])), width
    elif r > ratio[1]:
        fh, fw = height, int(round(height * ratio[1]))
    else:
        fh, fw = height, width
    found = ok.any(1)
    bh, bw = np.where(found, h[rows, first], fh), np.where(found, w[rows, first], fw)
    u = torch.rand(n, 2, generator=generator).numpy()
    top = (u[:, 0] * (height - bh + 1).astype(np.float32)).astype(np.int64)
    left = (u[:, 1] * (width - bw + 1).astype(np.float32)).astype(np.int64)
    return torch.from_numpy(np.stack([top, left, bh, bw], 1))


def center_boxes(n: int, height: int, width: int, ratio: float) -> torch.Tensor:
    bh, bw = max(1, round(height * ratio)), max(1, round(width * ratio))
    box = torch.tensor([(height - bh) // 2, (width - bw) // 2, bh, bw])
    return box.expand(n, 4).clone()


def packed_params(boxes: torch.Tensor, flips, out: torch.Tensor | None = None) -> torch.Tensor:
    """A batch's crop parameters as one (B, 5) int64 tensor, ``[top, left, h, w, flip]`` per
    row (written into ``out`` if given, e.g. a pinned buffer), so they cross to a device in
    one copy; ``p[:, :4], p[:, 4]`` gives them back. Written through NumPy (CPU tensors): no
    torch op, as in ``random_resized_crop_boxes``."""
    if out is None:
        out = torch.empty((len(boxes), 5), dtype=torch.int64)
    p = out.numpy()
    p[:, :4] = boxes.numpy() if isinstance(boxes, torch.Tensor) else boxes
    p[:, 4] = flips
    return out
