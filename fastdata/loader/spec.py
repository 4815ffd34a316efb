"""What the loader facade hands a backend: ``Spec``, the settings of one pass, and the
``Backend`` base every backend implements."""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
from collections import deque
from collections.abc import Callable, Iterator

import numpy as np
import torch

from fastdata.ops.batch import BatchHook
from fastdata.ops.crop import CropStage
from fastdata.ops.targets import Targets
from fastdata.order import Order
from fastdata.shards import Mixture, ShardSet


def ordered(pool, fn, jobs, depth: int, timeout: float | None = None,
            late: Callable[[tuple], BaseException] | None = None):
    """``fn(*job)`` for each job on ``pool``, results in job order, at most ``depth`` in flight
    (the read-ahead of both backends' reader threads). ``timeout``: seconds to wait for each
    result once it is the next one; past it, ``late(job)`` is raised."""
    window: deque = deque()

    def take():
        job, future = window.popleft()
        try:
            return future.result(timeout=timeout)
        except cf.TimeoutError:
            raise (late(job) if late is not None else TimeoutError(job)) from None

    for job in jobs:
        window.append((job, pool.submit(fn, *job)))
        if len(window) >= depth:
            yield take()
    while window:
        yield take()


def past_deadline(spec, indices, where: str = "") -> TimeoutError:
    """The error of the batch ``indices`` past its deadline (``Spec.timeout``): ``where``
    says what has not finished; by default, naming the batch's first sample."""
    if not where:
        where = (f"reading, decoding or sample_transform has not finished (its first "
                 f"sample: {spec.dataset.sample_names(indices)(0)})")
    return TimeoutError(f"a batch of {len(indices)} samples took more than "
                        f"{spec.batch_timeout:g} s (timeout={spec.timeout:g} s an image): "
                        f"{where}")


@dataclasses.dataclass(frozen=True, eq=False)
class Spec:
    """What a backend reads of its loader, fixed for one pass (``Loader`` makes one at the
    start of each): the backends hold no loader, and a pass in flight keeps the settings it
    started with when the loader's size or crop changes."""

    dataset: ShardSet | Mixture
    order: Order
    device: torch.device
    size: int
    crop: int | None
    #: the built-in crop, flip, resize and normalisation (its settings also where it is idle)
    crop_stage: CropStage
    #: False where batches go out exactly as stored (uint8, no crop, no augmentation)
    needs_crop_stage: bool
    #: the user's ``sample_transform``, per stored image in the reader workers
    sample_hook: Callable | None
    #: the user's ``batch_transform`` with the normalisation after it
    batch_hook: BatchHook | None
    num_workers: int
    workers: str
    prefetch: int
    mp_context: str | None
    jpeg_decode: str
    #: seconds an image may take to be read, decoded and hooked (None: no limit)
    timeout: float | None = None
    #: how a detection set's targets come out (their form, the boxes a crop keeps)
    targets: Targets = Targets()

    @property
    def batch_timeout(self) -> float | None:
        """The seconds a batch may take (``timeout`` times the batch size), or None."""
        return None if self.timeout is None else self.timeout * self.order.batch_size


class Backend:
    """Base of loader backends: ``iterate(spec, ...)`` yields ``(images, labels)`` per batch."""

    name = ""

    def __init__(self, spec: Spec):
        """``spec``: the loader's settings when it was made (threads, devices)."""

    def iterate(self, spec: Spec, batches: list[np.ndarray], seeds: Iterator[int]):
        """``batches``: this rank's batches of sample indices still to read in the epoch;
        ``seeds``: each one's seed (``Order.batch_seed``), drawn as they are read."""
        raise NotImplementedError

    def close(self) -> None:
        pass
