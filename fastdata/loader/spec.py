"""What the loader facade hands a backend: ``Spec``, the settings of one pass, and the
``Backend`` base every backend implements (its options, a copy bound to each loader)."""
from __future__ import annotations

import copy
import dataclasses
import inspect
from collections.abc import Callable, Iterator

import numpy as np
import torch

from fastdata.loader.fields import BatchFields
from fastdata.ops.batch import BatchHook
from fastdata.ops.crop import CropStage
from fastdata.ops.targets import Targets
from fastdata.order import Order
from fastdata.shards import SampleSource


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

    dataset: SampleSource
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
    #: seconds an image may take to be read, decoded and hooked (None: no limit)
    timeout: float | None = None
    #: how a detection set's targets come out (their form, the boxes a crop keeps)
    targets: Targets = Targets()
    #: the fields of dict batches (``Loader(fields=...)``); None: ``(images, labels)``
    fields: BatchFields | None = None

    @property
    def batch_timeout(self) -> float | None:
        """The seconds a batch may take (``timeout`` times the batch size), or None."""
        return None if self.timeout is None else self.timeout * self.order.batch_size


class Backend:
    """Base of loader backends. An instance holds the options of how batches are made (its
    keyword-only constructor validates them); a loader works on its own copy, ``bind(spec)``,
    so that one instance may configure several loaders. ``iterate(spec, ...)`` yields
    ``(images, labels)`` per batch (``docs/format.md``, "The batch contract")."""

    name = ""
    _options: dict = {}

    def _given(self, **options) -> None:
        """Keep the constructor's arguments that differ from its defaults (``options``)."""
        defaults = inspect.signature(type(self).__init__).parameters
        self._options = {k: v for k, v in options.items() if v != defaults[k].default}

    def options(self) -> dict:
        """The constructor's arguments given other than their defaults (for ``repr``)."""
        return dict(self._options)

    def bind(self, spec: Spec) -> Backend:
        """A copy for the loader whose settings ``spec`` gives, checked against them.

        Raises:
            ValueError: an option that cannot apply to this loader (naming why).
            ImportError: what the backend needs is not installed (naming the pip extra).
        """
        bound = copy.copy(self)
        bound.start(spec)
        return bound

    def start(self, spec: Spec) -> None:
        """Check ``spec`` and make this copy's state (threads, pipelines): called on the copy
        ``bind`` makes."""

    @property
    def processes(self) -> int:
        """The processes that read a remote set's shards (its fetch-ahead shares the cache)."""
        return 1

    def iterate(self, spec: Spec, batches: list[np.ndarray], seeds: Iterator[int]):
        """``batches``: this rank's batches of sample indices still to read in the epoch;
        ``seeds``: each one's seed (``Order.batch_seed``), drawn as they are read."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop the threads and processes the backend started (a later pass starts them
        again)."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.options().items())
        return f"{type(self).__name__}({args})"
