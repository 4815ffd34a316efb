"""``fastdata.Loader``: one constructor, interchangeable backends (``BACKENDS`` by name, or a
``Backend`` instance with its own options).

The facade validates the arguments, owns the ``Order`` (the one order and partition of both
backends) and the stages (the built-in crop stage, the users' hooks); a backend only turns this
rank's batches of indices into ``(images, labels)`` on the device (``docs/format.md``, "The
batch contract").
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence

import numpy as np
import torch

from fastdata.checks import choice, flag, integer, positive
from fastdata.env import check_fits, local_world_size, resolve_device
from fastdata.loader.dali_backend import DaliBackend
from fastdata.loader.fields import batch_fields
from fastdata.loader.spec import Backend, Spec
from fastdata.loader.torch_backend import TorchBackend
from fastdata.ops.batch import BatchHook, takes_generator
from fastdata.ops.crop import CropStage
from fastdata.ops.normalize import IMAGENET_MEAN, IMAGENET_STD, Normalize
from fastdata.ops.targets import Targets
from fastdata.order import Draw, Order, ShardWindows
from fastdata.shards import Mixture, SampleSource, ShardSet
from fastdata.transforms import check_classes

#: the backends a name picks (``Loader(backend="torch")``, ``fastdata train --backend``)
BACKENDS: dict[str, Callable[..., Backend]] = {"torch": TorchBackend, "dali": DaliBackend}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "uint8": torch.uint8}


def _dist_rank_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _hooks(dataset: SampleSource, crop_stage: CropStage, sample_transform, batch_transform,
           train: bool) -> tuple[CropStage, BatchHook | None]:
    """Check the users' transforms. With a batch transform, the built-in stage stops at float32
    values in [0, 1] and the normalisation follows the transform: returns the crop stage to
    run and the batch hook (None without a batch transform). An evaluation loader (``train``
    False) given a random batch transform says so."""
    for name, fn in (("sample_transform", sample_transform),
                     ("batch_transform", batch_transform)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be callable or None, not {type(fn).__name__}")
    if batch_transform is None:
        return crop_stage, None
    if dataset.label_kind == "class":
        check_classes(batch_transform, len(dataset.classes))
    if not train and takes_generator(batch_transform):
        warnings.warn(f"batch_transform={batch_transform!r} draws random values (it takes a "
                      f"generator) on an evaluation loader (train=False): its results then "
                      f"depend on the draws; augmentation belongs to the training loader",
                      UserWarning, stacklevel=3)
    t = crop_stage
    if t.dtype == torch.uint8:
        raise ValueError("batch_transform needs a float dtype (it sees values in [0, 1], "
                         "normalised after it); dtype=uint8 skips normalisation")
    norm = Normalize(t.mean, t.std, t.dtype, t.memory_format)
    return t.to_unit(), BatchHook(batch_transform, norm)


def _backend(backend, num_workers, prefetch) -> Backend:
    """The backend ``Loader(backend=...)`` names, with the shorthand options of a name."""
    if isinstance(backend, Backend):
        given = [k for k, v in (("num_workers", num_workers), ("prefetch", prefetch))
                 if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)} given beside backend={backend!r}: give "
                             f"them to the backend (e.g. TorchBackend(num_workers=4))")
        return backend
    cls = BACKENDS[choice("backend", backend, BACKENDS)]
    return cls(num_workers=num_workers, **({} if prefetch is None else {"prefetch": prefetch}))


def _dataset(path, weights, cache: dict) -> SampleSource:
    """What ``Loader(path, weights=...)`` reads."""
    if isinstance(path, (list, tuple)):
        return Mixture(path, weights=weights, **cache)
    if weights is not None:
        raise ValueError("weights= mixes a list of sets: pass path=[set_a, set_b, ...] (or "
                         "a fastdata.Mixture)")
    # an open set, a mixture or any other SampleSource is read as it is
    return ShardSet(path, **cache) if isinstance(path, (str, os.PathLike)) else path


class Loader:
    """Iterate a shard set as ``(images, labels)`` batches on a device.

    ``for images, labels in loader``: ``images`` is ``(B, 3, crop, crop)`` in ``dtype`` and the
    memory format asked for, normalised with ``mean``/``std`` (uint8 as stored with
    ``dtype=torch.uint8``); ``labels`` int64 ``(B,)``, or float32 ``(B, K)`` for multi-label and
    regression sets and after MixUp/CutMix. Both backends give the same samples in the same
    order for the same arguments. ``len(loader)``: batches per epoch for this rank.

    Args:
        path: the shard set's folder or URL (``s3://``, ``gs://``, ``az://``,
            ``http(s)://``, ``file://``: ``docs/loading.md``, "Shard sets in an object
            store"), an open ``ShardSet``, a ``Mixture``, or a list of sets to mix (with
            ``weights``; "Mixing sets").
        backend: ``"torch"`` (reader threads or processes, augmentation on the device),
            ``"dali"`` (an NVIDIA DALI pipeline fed by the same order), or a backend with its
            own options: ``fastdata.TorchBackend(workers="process", mp_context=...,
            jpeg_decode=...)``, ``fastdata.DaliBackend(...)`` or a ``fastdata.Backend`` of
            one's own (``docs/loading.md``, "Backends"). The loader works on its own copy.
        batch_size: samples per batch on this rank.
        train: training order and augmentation (shuffled, full batches, RandomResizedCrop and
            flip), or evaluation (in order, every sample once over the ranks, centre crop).
        size: the stored size to read (default: the largest); may change between epochs.
        crop: the output size (default: the stored size); may change between epochs.
        augment: RandomResizedCrop + flip (default: ``train``).
        device: where batches go (default: CUDA when available, else the CPU).
        dtype: float32, bfloat16, float16 or uint8 (a dtype or its name).
        channels_last: the memory format of ``images`` (default: on CUDA).
        mean: per-channel means, of values in [0, 1], subtracted.
        std: per-channel standard deviations divided by.
        scale: RandomResizedCrop's range of the crop's area.
        ratio: RandomResizedCrop's range of the crop's aspect ratio.
        shuffle: shuffle each epoch (default: ``train``).
        shuffle_window: shuffle within windows of this many shards, taken in a random order
            each epoch, instead of over the whole set: a pass reads its shards a window at a
            time (a remote set's first batch needs one window; ``docs/loading.md``, "Shard
            sets in an object store"). None: over the whole set.
        shard_split: cut each epoch's shards (permuted when shuffling) into this many runs
            of equal samples, one a rank (usually the world size): with a world size that
            divides it, each rank reads only its runs' shards, so a node downloads only its
            ranks' share of the set. Keep it when resuming on another world size (the order
            depends on it, not on the layout). None: every rank reads from every shard of a
            window.
        seed: the order's and the augmentation's seed; with the epoch, rank and batch it
            decides every random draw.
        drop_last: drop each epoch's partial batch (default: ``train``).
        rank: this process's rank (default: ``torch.distributed``'s, else 0).
        world_size: the ranks sharing the set (default: ``torch.distributed``'s, else 1).
        num_workers: the backend named by ``backend``'s reader threads (default: the usable
            cores, at most 8); 0 reads in the calling thread. A backend instance takes its own.
        prefetch: batches read ahead of the consumer (default 2; as ``num_workers``).
        sample_transform: ``fn(image, rng) -> image`` per stored image, before the crop, in
            the reader workers; a torchvision transform (any ``nn.Module``) is called as
            ``t(image)`` on (3, S, S) uint8 tensors (``docs/augmentation.md``).
        batch_transform: ``fn(images, labels) -> (images, labels)`` on the whole batch on the
            device, on values in [0, 1] before the normalisation (``fastdata.transforms``,
            or torchvision's: ``fn(images) -> images`` where it takes the images alone).
        weights: each set's share of an epoch where ``path`` is a list of sets (default: by
            their sizes); a ``Mixture`` takes the other options.
        cache_dir: where a remote set's shards are kept on this node (default:
            ``$FASTDATA_CACHE``, else ``~/.cache/fastdata``), one copy for all its processes.
        cache_limit: the most bytes of shards the cache keeps (None: no limit).
        with_source: batches are ``(images, labels, sources)``, ``sources`` int64 ``(B,)``
            on the device: which set of a mixture (its place in the list) each sample is
            from (0 for a single set).
        timeout: seconds an image may take to be read, decoded and passed through
            ``sample_transform`` (a batch gets that times its size), like DataLoader's
            ``timeout``; past it the pass raises a ``TimeoutError`` naming the batch's samples
            (and, with reader threads, the one the hook has not returned on). None: no
            limit. A reader thread cannot be stopped and runs on; worker processes are.
            Without workers (``num_workers=0``) the calling thread reads: no limit.
        targets: the form of a detection set's labels (``docs/format.md``, "Detection and
            segmentation sets"): ``"list"``, a dict per image as torchvision's detection
            models take (``boxes`` x0, y0, x1, y1 in output pixels, ``labels`` = class index
            + 1, ``iscrowd``, ``masks``), moved by each image's crop and flip; or
            ``"padded"``, one dict of tensors padded to the batch's most boxes, with
            ``counts``; or a ``fastdata.Targets`` with its form and which boxes a crop keeps
            (by default, as torchvision's ``SanitizeBoundingBoxes``, every box of which at
            least 1 x 1 output pixels is left). A segmentation set's labels are its class
            maps, int64 (B, H, W).
        fields: batches as dicts of these fields, in this order (``"image"`` among them;
            ``"label"`` the set's label, where it has one; any of its own fields, e.g.
            ``["image", "caption"]``): text as lists of ``str``, fixed-size fields as tensors
            on ``device``, tokens as lists of int64 tensors, boxes and keypoints moved with
            each image's crop and flip, in output pixels (``docs/format.md``, "Batches of
            fields"). None: ``(images, labels)`` batches.
        field_transforms: a function per field (``{"caption": tokenize}``), called on the
            batch's values of that field as collated above (a list of ``str`` for text) in
            the reader workers, off the training thread; its tensors (alone, or in dicts,
            lists or tuples) are moved to ``device`` with the images. Picklable for worker
            processes.

    Raises:
        ValueError: an argument out of its range or choices (the message names the valid
            ones), or a transform that cannot run where it would have to.
        TypeError: a transform that is not callable.
        ShardFormatError: ``path`` is not a readable shard set.
    """

    def __init__(self, path: str | os.PathLike | SampleSource | Sequence,
                 *, backend: str | Backend = "torch",
                 batch_size: int, train: bool = True, size: int | None = None,
                 crop: int | None = None, augment: bool | None = None,
                 device: str | torch.device | None = None,
                 dtype: torch.dtype | str = torch.float32, channels_last: bool | None = None,
                 mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
                 scale: tuple[float, float] = (0.08, 1.0),
                 ratio: tuple[float, float] = (3 / 4, 4 / 3),
                 shuffle: bool | None = None, shuffle_window: int | None = None,
                 shard_split: int | None = None, seed: int = 0, drop_last: bool | None = None,
                 rank: int | None = None, world_size: int | None = None,
                 num_workers: int | None = None, prefetch: int | None = None,
                 sample_transform: Callable | None = None,
                 batch_transform: Callable | None = None,
                 weights: Sequence[float] | None = None,
                 cache_dir: str | os.PathLike | None = None, cache_limit: int | None = None,
                 with_source: bool = False, timeout: float | None = None,
                 targets: str | Targets = "list", fields: Sequence[str] | None = None,
                 field_transforms: dict[str, Callable] | None = None):
        backend = _backend(backend, num_workers, prefetch)
        self.dataset = _dataset(path, weights, {"cache_dir": cache_dir,
                                                "cache_limit": cache_limit})
        self.with_source = flag("with_source", with_source)
        self.targets = Targets.of(targets)
        #: the fields of dict batches (None: ``(images, labels)`` batches)
        self.fields = batch_fields(self.dataset, fields, field_transforms,
                                   with_source=self.with_source)
        if self.fields is None and self.dataset.label_kind == "none":
            raise ValueError(f"{self.dataset.location} has no labels, only fields "
                             f"({', '.join(self.dataset.fields)}): read them as dict batches, "
                             f"e.g. fields=['image', {next(iter(self.dataset.fields))!r}]")
        if isinstance(dtype, str):
            dtype = DTYPES[choice("dtype", dtype, DTYPES)]
        if dtype not in DTYPES.values():
            raise ValueError(f"dtype={dtype!r} is not valid; choose one of {', '.join(DTYPES)}")
        self.device = resolve_device(device)
        self.timeout = None if timeout is None else positive("timeout", timeout)
        if rank is None or world_size is None:
            r, w = _dist_rank_world()
            rank = r if rank is None else rank
            world_size = w if world_size is None else world_size
        ds = self.dataset
        n = ds.epoch_size
        draw: Draw | None = _window_draw(ds, shuffle_window, shard_split, world_size) or ds.draw
        # the epoch's indices, drawn and shuffled: a manifest's count, refused, not an OOM
        check_fits(f"an epoch of {n} samples", 24 * n,
                   f"check the set's manifest with `fastdata verify {ds.location}`")
        self.order = Order(n, batch_size=batch_size, train=train, shuffle=shuffle, seed=seed,
                           rank=rank, world_size=world_size, drop_last=drop_last, draw=draw)
        self._resume, self._iterations = False, 0      # see __iter__
        self._upscale_warned = False
        # a set shared by loaders takes the latest one's order for the shards it opens next
        for reader in self.dataset.shards:
            reader.access = "random" if self.order.shuffle else "sequential"
        self.train = self.order.train
        self._size = self.dataset.size if size is None else self.dataset.stored_size(size)
        self.augment = flag("augment", augment, self.train)
        self.dtype = dtype
        self.channels_last = flag("channels_last", channels_last, self.device.type == "cuda")
        stage = CropStage(train=self.augment, crop=self._checked_crop(crop),
                          dtype=dtype, channels_last=self.channels_last, mean=mean, std=std,
                          scale=scale, ratio=ratio)
        self.crop_stage, self.batch_hook = _hooks(self.dataset, stage, sample_transform,
                                                  batch_transform, self.train)
        self.sample_hook = sample_transform
        self._check_upscale()
        #: this loader's copy of the backend, bound to its settings
        self.backend: Backend = backend.bind(self._spec())

    # ---- the contract ----
    @property
    def size(self) -> int:
        """Stored square size read from the shards; may change between epochs."""
        return self._size

    @size.setter
    def size(self, value) -> None:
        self._size = self.dataset.stored_size(value)
        self._check_upscale()

    @property
    def crop(self) -> int | None:
        """Output square size (None: the stored size); may change between epochs."""
        return self.crop_stage.crop

    @crop.setter
    def crop(self, value) -> None:
        self.crop_stage = self.crop_stage.with_crop(self._checked_crop(value))
        self._check_upscale()

    def _checked_crop(self, crop) -> int | None:
        """``crop`` as an int (or None), refused where one batch of it would not fit in
        memory (a hostile state's crop)."""
        crop = integer("crop", crop, 1, optional=True)
        if crop is not None:
            check_fits(f"crop={crop}", 4 * 3 * self.order.batch_size * crop ** 2,
                       "give a crop of at most a few times the stored size")
        return crop

    def _check_upscale(self) -> None:
        """Warn, once per loader, where the crop is larger than the stored size read: every
        output pixel is then interpolated from fewer stored ones."""
        crop, size = self.crop_stage.crop, self._size
        if crop is None or crop <= size or self._upscale_warned:
            return
        self._upscale_warned = True
        sizes = self.dataset.sizes
        larger = [s for s in sizes if s >= crop]
        fix = (f"read size={larger[0]} instead" if larger else
               f"convert with --size {1 << (crop - 1).bit_length()} to avoid it")
        warnings.warn(f"crop={crop} is larger than the stored size {size} read from "
                      f"{self.dataset.root} (it stores {', '.join(map(str, sizes))}): every "
                      f"image is upsampled; {fix}", UserWarning, stacklevel=3)

    def needs_crop_stage(self) -> bool:
        """False when batches go out exactly as stored (uint8, no crop, no augmentation)."""
        return self.augment or self.crop is not None or self.dtype != torch.uint8

    def _spec(self) -> Spec:
        return Spec(dataset=self.dataset, order=self.order, device=self.device, size=self.size,
                    crop=self.crop, crop_stage=self.crop_stage,
                    needs_crop_stage=self.needs_crop_stage(),
                    sample_hook=self.sample_hook, batch_hook=self.batch_hook,
                    timeout=self.timeout, targets=self.targets, fields=self.fields)

    def __len__(self) -> int:
        """Batches of an epoch on this rank (a resumed epoch's pass may have fewer:
        ``batches_left()``)."""
        return len(self.order)

    def batches_left(self) -> int:
        """Batches the current pass has still to give (or the next pass gives)."""
        return self.order.pass_length() - self.order.position

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose order the next pass reads, as ``DistributedSampler.set_epoch``."""
        self.order.set_epoch(epoch)

    def state_dict(self) -> dict:
        """The loader's position (epoch, batches read, stored size, crop), for
        ``load_state_dict``."""
        return {"order": self.order.state_dict(), "size": self._size, "crop": self.crop}

    def load_state_dict(self, state: dict) -> None:
        """Resume at a ``state_dict()``'s position: the next pass reads exactly the rest of
        that epoch, also on another number of ranks, batch size, number or kind of workers or
        backend (the epoch's remaining samples, each once across the ranks; ``docs/loading.md``,
        "Resuming on another layout").

        Raises:
            ValueError: ``state`` is not a loader's state, or one of a set of another size.
        """
        if not isinstance(state, dict) or "order" not in state or "size" not in state:
            raise ValueError(f"not a Loader.state_dict() (a dict with order, size, crop): "
                             f"{str(state)[:100]}")
        self.order.load_state_dict(state["order"])
        self.size = state["size"]
        self.crop = state.get("crop", self.crop)
        self._resume = True

    def __iter__(self):
        """A pass over the current epoch from its start, like a DataLoader (a batch taken with
        ``next(iter(loader))`` is not missing from the next loop), or from the position given
        by the last ``load_state_dict``. The latest iterator is the one ``state_dict`` follows.
        """
        order = self.order
        if not self._resume:
            order.rewind()
        self._resume = False
        self._iterations += 1
        me = self._iterations
        batches, epoch, start = order.batches(), order.epoch, order.position
        seeds = (order.batch_seed(epoch, start + k) for k in range(len(batches)))
        # a remote set: its shards fetched in the order the pass reads them
        fetch = self.dataset.fetch_ahead(np.concatenate(batches), processes=self.backend.processes,
                                      ranks=self._cache_sharers()) if batches else None
        consumed = 0
        try:
            for k, (images, labels) in enumerate(self.backend.iterate(self._spec(), batches,
                                                                       seeds)):
                if me == self._iterations:
                    order.position += 1
                if fetch is not None:       # the cache's room for what comes next
                    consumed += len(batches[k])
                    fetch.advance(consumed)
                yield self._batch(images, labels, batches[k])
        finally:
            if fetch is not None:
                fetch.stop()
        if me == self._iterations:
            order.rewind()      # a finished epoch repeats its order until set_epoch

    def _batch(self, images, labels, indices):
        """What the loop gets: ``(images, labels[, sources])``, or a dict batch (``fields``:
        ``labels`` then holds its fields but the image)."""
        if self.fields is None:
            return (images, labels, self._sources(indices)) if self.with_source else \
                (images, labels)
        batch = {name: images if name == "image" else labels[name] for name in self.fields.names}
        if self.with_source:
            batch["source"] = self._sources(indices)
        return batch

    def _cache_sharers(self) -> int:
        """The ranks of this node that read other shards than this one's into the same cache:
        with ``shard_split``, the node's ranks (``LOCAL_WORLD_SIZE``), at most one a run; else
        1 (ranks reading the same windows share their shards)."""
        parts = getattr(self.order.draw, "parts", None) or 1
        return min(local_world_size(), self.order.world_size, parts)

    def _sources(self, indices) -> torch.Tensor:
        src = self.dataset.source_of(indices)
        return torch.as_tensor(src, dtype=torch.int64).to(self.device, non_blocking=True)

    def close(self) -> None:
        """Stop the backend's threads and worker processes (a later pass starts them again)."""
        self.backend.close()

    def __repr__(self) -> str:
        where = getattr(self.dataset, "url", None) or self.dataset.root
        return (f"Loader({where!r}, backend={self.backend!r}, "
                f"batch_size={self.order.batch_size}, train={self.train}, size={self._size}, "
                f"crop={self.crop}, device={str(self.device)!r}, {len(self)} batches/epoch)")


def _window_draw(ds, shuffle_window, shard_split, world_size) -> ShardWindows | None:
    """The draw of ``shuffle_window`` / ``shard_split`` (None: neither asked)."""
    window = integer("shuffle_window", shuffle_window, 1, optional=True)
    parts = integer("shard_split", shard_split, 1, optional=True)
    if window is None and parts is None:
        return None
    if ds.draw is not None:
        raise ValueError("shuffle_window and shard_split read one set's shards in their own "
                         "order; a Mixture draws its own: leave them None")
    if parts is not None and parts % integer("world_size", world_size, 1):
        warnings.warn(f"shard_split={parts} is not a multiple of world_size={world_size}: "
                      f"every sample is still read once, but a rank reads from several runs "
                      f"and a node downloads more than its share", stacklevel=3)
    counts = [s["count"] for s in ds.manifest["shards"]]
    return ShardWindows(counts, window or max(len(counts), 1), parts=parts)
