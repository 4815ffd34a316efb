"""Distributed set-up from torchrun's environment: nccl on CUDA, gloo on CPU.

``info = setup()`` reads ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` (when called, never at import),
joins the process group when the world has more than one process, binds CUDA rank ``r`` to
``cuda:LOCAL_RANK``; ``wrap(model, info)`` puts a model into DDP when needed; ``teardown()``
leaves the group. Loaders pick rank/world up from ``torch.distributed`` once it is initialised.
"""
from __future__ import annotations

import dataclasses
import os
import time

import torch
import torch.distributed as dist
from torch import nn

from fastdata.env import resolve_device


@dataclasses.dataclass(frozen=True)
class DistInfo:
    """This process's place in the run: rank, world size, local rank and device."""
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0 (the one that logs and saves)."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """Whether more than one process trains."""
        return self.world_size > 1


def setup(device: str | None = None, backend: str | None = None) -> DistInfo:
    """Join the torchrun process group (if any) and pick this process's device."""
    env = os.environ
    rank, world = int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1))
    local = int(env.get("LOCAL_RANK", 0))
    dev = resolve_device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", local if dev.index is None else dev.index)
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        backend = backend or ("nccl" if dev.type == "cuda" else "gloo")
        dist.init_process_group(backend, rank=rank, world_size=world,
                                device_id=dev if dev.type == "cuda" else None)
    if dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    return DistInfo(rank, world, local, dev)


def wrap(model: nn.Module, info: DistInfo, *, channels_last: bool | None = None,
         **ddp_kwargs) -> nn.Module:
    """``model`` on ``info.device``, inside DistributedDataParallel when the world is > 1.

    ``channels_last`` (default: on CUDA, as ``TrainStep``) converts the model first: DDP lays
    out its gradient buckets by the parameters' strides when it is built, and a model converted
    afterwards copies every gradient into mismatched buckets (torch warns "Grad strides do not
    match bucket view strides").
    """
    if channels_last is None:
        channels_last = info.device.type == "cuda"
    fmt = torch.channels_last if channels_last else torch.preserve_format
    model = model.to(info.device, memory_format=fmt)  # type: ignore[call-overload]
    if not info.distributed:
        return model
    ids = [info.device.index] if info.device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=ids, **ddp_kwargs)


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum over ranks in place (no-op outside a process group); returns ``t``."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t)
    return t


def cpu_group():
    """A gloo group over all ranks for small CPU tensors that must not wait on the GPU
    (the default group when it is gloo; ``None`` outside a process group). Collective: every
    rank calls it."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_backend() == "gloo":
        return None
    return dist.new_group(backend="gloo")


def any_rank(flag: bool, group=None) -> bool:
    """Whether ``flag`` is true on any rank: one all-reduce of a CPU int over ``group``
    (``cpu_group()``), no host-device sync; ``flag`` itself outside a process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return flag
    t = torch.tensor([int(flag)])
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return bool(t.item())


def barrier() -> None:
    """Wait for every rank (nothing without a process group)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def teardown() -> None:
    """Leave the group, after releasing the GIL for a moment. Gloo's worker threads outlive
    ``destroy_process_group``, and one that is freeing a finished collective's tensor needs
    the GIL for it (the tensor's Python object); still waiting for it when the interpreter
    exits, it aborts the process ("terminate called without an active exception": 4 of 30
    two-rank ``fastdata train`` runs on CPU, seen in a core dump; 0 of 80 with the sleep)."""
    if dist.is_available() and dist.is_initialized():
        time.sleep(0.05)
        dist.destroy_process_group()
