"""Geometric operations on float ``(B, 3, H, W)`` images: torchvision's affine warps, each
image with its own matrix, in one resampling."""
from __future__ import annotations

import torch

from fastdata.kernels.device import to_device


def affine(x: torch.Tensor, angle, shear_x, shear_y, tx, ty) -> torch.Tensor:
    """torchvision's tensor ``affine``/``rotate`` (nearest, black fill), per image: rotate by
    ``angle`` degrees about the centre, shear by ``shear_x``/``shear_y`` degrees about the top
    left corner, translate by ``tx``/``ty`` pixels. Each argument a (B,) tensor, on ``x``'s
    device or on the host (the matrices are then made there and moved in one copy)."""
    n, _, h, w = x.shape
    theta = to_device(_sampling_matrices(angle, shear_x, shear_y, tx, ty, h, w), x)
    xs = torch.linspace(-w * 0.5 + 0.5, w * 0.5 - 0.5, w, device=x.device).view(1, 1, w, 1)
    ys = torch.linspace(-h * 0.5 + 0.5, h * 0.5 - 0.5, h, device=x.device).view(1, h, 1, 1)
    # (x, y, 1) @ theta per pixel, as broadcast products written once into the grid (a batched
    # matmul with an inner size of 3 is slower on a CPU)
    t = theta.view(n, 3, 1, 1, 2)
    grid = torch.add(xs * t[:, 0], ys * t[:, 1]).add_(t[:, 2])
    return torch.nn.functional.grid_sample(x, grid.to(x.dtype), mode="nearest",
                                           padding_mode="zeros", align_corners=False)


def _sampling_matrices(angle, shear_x, shear_y, tx, ty, h: int, w: int) -> torch.Tensor:
    """(B, 3, 2): an output pixel's ``(x, y, 1)`` (from the centre) times its image's matrix is
    where it samples, in ``grid_sample``'s units."""
    # torchvision's _get_inverse_affine_matrix (rotate passes -angle to it)
    rot, sx, sy = (torch.deg2rad(t.to(torch.float32)) for t in (-angle, shear_x, shear_y))
    a = torch.cos(rot - sy) / torch.cos(sy)
    b = -torch.cos(rot - sy) * torch.tan(sx) / torch.cos(sy) - torch.sin(rot)
    c = torch.sin(rot - sy) / torch.cos(sy)
    d = -torch.sin(rot - sy) * torch.tan(sx) / torch.cos(sy) + torch.cos(rot)
    # shears turn about the top left corner, rotations about the centre (TrivialAugment's)
    shear = (shear_x != 0) | (shear_y != 0)
    cx = torch.where(shear, torch.full_like(a, -w * 0.5), torch.zeros_like(a))
    cy = torch.where(shear, torch.full_like(a, -h * 0.5), torch.zeros_like(a))
    tx, ty = tx.to(a.dtype), ty.to(a.dtype)
    m = torch.stack([d, -b, torch.zeros_like(a), -c, a, torch.zeros_like(a)], 1)
    m[:, 2] += m[:, 0] * (-cx - tx) + m[:, 1] * (-cy - ty) + cx
    m[:, 5] += m[:, 3] * (-cx - tx) + m[:, 4] * (-cy - ty) + cy
    theta = m.view(-1, 2, 3).transpose(1, 2)
    return torch.stack([theta[..., 0] / (0.5 * w), theta[..., 1] / (0.5 * h)], -1)


def _degrees_of_slope(m):
    return torch.rad2deg(torch.atan(m))


# the geometric operations: name -> (which of affine's angle, shear_x, shear_y, tx, ty the
# magnitude sets, and how)
AFFINE_ARGS = {"shear_x": (1, _degrees_of_slope), "shear_y": (2, _degrees_of_slope),
                "translate_x": (3, torch.trunc), "translate_y": (4, torch.trunc),
                "rotate": (0, lambda m: m)}


def affine_args(ops: list, op: torch.Tensor, mag: torch.Tensor) -> list:
    """affine's 5 arguments per image: its geometric operation's, zeros for the others."""
    args = [torch.zeros_like(mag) for _ in range(5)]
    for k, name in enumerate(ops):
        if name in AFFINE_ARGS:
            slot, fn = AFFINE_ARGS[name]
            args[slot] = torch.where(op == k, fn(mag), args[slot])
    return args
