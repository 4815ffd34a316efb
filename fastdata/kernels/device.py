"""Small values moved to a device without making the host wait for it."""
from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=256)
def constant(values: tuple, device: str, dtype: torch.dtype) -> torch.Tensor:
    """``values`` as a tensor on ``device``, made once: a copy from pageable host memory to a
    GPU would make the host wait for the stream's earlier work at every batch."""
    return torch.tensor(values, dtype=dtype).to(device)


def to_device(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Per-batch values drawn on the host, on ``like``'s device in one copy: from pinned
    memory on CUDA, as a copy from pageable memory waits for the stream's earlier work."""
    if values.device == like.device:
        return values
    if like.is_cuda and values.device.type == "cpu":
        values = values.pin_memory()
    return values.to(like.device, non_blocking=True)
