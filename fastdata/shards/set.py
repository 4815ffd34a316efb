"""``ShardSet``: one API over a shard set's files, whatever their container and encoding."""
from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
from collections.abc import Callable, Iterator

import numpy as np

from fastdata.env import available_memory
from fastdata.fields import FieldKind
from fastdata.fields.schema import fields_of
from fastdata.format import (
    MANIFEST,
    SPATIAL_KINDS,
    ShardFormatError,
    check_size,
    label_kind,
    read_manifest,
    read_targets,
)
from fastdata.order import Draw
from fastdata.shards.annotations import Annotations, ClassMaps, open_annotations
from fastdata.shards.jpeg import decode_jpeg
from fastdata.shards.mapped import guard_faults, make_room_for_files, page_aligned
from fastdata.shards.reader import READERS, ShardReader
from fastdata.shards.remote import Fetch, fetch_manifest
from fastdata.shards.stores import Store, is_url, open_store
from fastdata.shards.streaming import FetchAhead, OpenShards

log = logging.getLogger("fastdata")


class ShardSet:
    """A shard set on disk: ``len(ds)``, ``ds.classes``, ``ds.labels``, ``ds.label_kind``,
    ``ds.sizes``, ``ds[i] -> (image, label)`` and ``ds.read_batch(indices)``; made by
    ``fastdata.open`` (its arguments and errors). Picklable: a worker process reopens the shards
    it reads."""

    def __init__(self, root: str | os.PathLike, *, size: int | None = None,
                 cache_dir: str | os.PathLike | None = None, cache_limit: int | None = None):
        #: the store's URL of a remote set (without credentials), else None
        self.url: str | None = None
        remote = cache = None
        if is_url(root):
            from fastdata.shards.cache import ShardCache

            remote, cache = open_store(os.fspath(root)), ShardCache(cache_dir, cache_limit)
            self.url = remote.shown
            root = fetch_manifest(remote, cache)
        #: a remote set's store and cache, which fetch its files again where they are damaged
        self._remote, self._cache = remote, cache
        self.root = os.path.abspath(os.fspath(root))
        self.manifest = m = self._fetched(lambda: read_manifest(self.root))
        self.container, self.encoding = m["container"], m["encoding"]
        self.sizes: tuple[int, ...] = tuple(m["sizes"])
        self.classes: list[str] = list(m["classes"])
        #: "class" (``labels`` int64 (N,)), "multi_label" or "regression" (float32 (N, K);
        #: ``classes`` then names the K columns), or "detection" or "segmentation" (the field
        #: ``label``, or at version 3 ``annotations``)
        self.label_kind = label_kind(m)
        stored = fields_of(m, os.path.join(self.location, MANIFEST))
        #: the fields each sample holds beside its image and label (name -> kind, in their
        #: stored order; ``fastdata.fields``)
        self.fields: dict[str, FieldKind] = {k: v for k, v in stored.items() if k != "label"}
        #: the kind of the field that holds the labels (multi-hot rows, regression targets,
        #: boxes or class maps: ``fastdata.format.LABEL_FIELDS``), else None
        self.label_field: FieldKind | None = stored.get("label")
        self._stored = stored
        #: whether ``labels`` are the field's values (multi-hot rows, regression targets)
        self._in_field = self.label_field is not None and self.label_field.fixed
        reader_class = READERS[self.container]
        self.shards = [reader_class(os.path.join(self.root, s["file"]), sizes=self.sizes,
                                    encoding=self.encoding, count=s["count"], start=s["start"],
                                    fields=stored)
                       for s in m["shards"]]
        #: a remote set's readers, closed once the cache's limit needs their shards' room
        self._open: OpenShards | None = None
        if remote is not None:          # read from the node's cache, fetched on first open
            for reader, entry in zip(self.shards, m["shards"]):
                reader.fetch = Fetch(remote, cache, entry, self.container, self.sizes,
                                     self.encoding, stored)
                reader.path = reader.fetch.path
            if cache.limit is not None:  # type: ignore[union-attr]
                # half the limit for the shards readers keep open, half for those still to
                # be read (FetchAhead)
                self._open = OpenShards(self.shards, [s["bytes"] for s in m["shards"]],
                                        cache.limit)  # type: ignore[union-attr]
        self._starts = np.array([s["start"] for s in m["shards"]], np.int64)
        self._n = int(m["num_samples"])
        self._check_files(remote)
        # an open shard keeps a file descriptor per memory map (HDF5: one per size) or LMDB env
        make_room_for_files(len(self.shards) * (len(self.sizes) if self.container == "hdf5"
                                                 else 1))
        self.size = self.sizes[-1] if size is None else self.stored_size(size)
        self._labels: np.ndarray | None = None
        # a remote set's shards' labels as read (a shard the cache has let go is not fetched
        # again for them)
        self._shard_labels_read: dict[int, np.ndarray] = {}
        self._annotations: Annotations | ClassMaps | None = None
        # half the memory available: the rest is room for what the program holds later (its
        # loader's buffers, its model), which the page cache cannot have
        memory = available_memory()
        nbytes = sum(s.get("bytes", 0) for s in m["shards"])
        self.readahead = memory is not None and 2 * nbytes <= memory     # at random
        for reader in self.shards:
            reader.fits = self.readahead

    def _check_files(self, remote: Store | None) -> None:
        """Each shard file that exists must be a regular file inside the set's folder (a link
        within it is fine); no shard may claim more samples than its bytes can hold (labels
        and CRCs at least); a remote shard must be the bytes its manifest says in the store's
        listing (where it lists: not plain HTTP). A damaged or hostile manifest is refused
        here, not read from another set or allocated in TiB (the loader refuses an order that
        does not fit in memory). A missing or damaged local file is left to the read that
        needs it (``verify`` lists them all)."""
        listed = remote.objects() if remote is not None and remote.lists else None
        least = 8 + 4 * len(self.sizes)         # a label and a CRC per size, per sample
        for reader, entry in zip(self.shards, self.manifest["shards"]):
            name, nbytes = entry["file"], entry["bytes"]
            if listed is not None and listed.get(name, nbytes) != nbytes:
                raise ShardFormatError(f"{self.location}/{name} is {listed[name]} bytes in the "
                                       f"store, its manifest says {nbytes}: the set changed "
                                       f"after it was written; convert or upload it again")
            if remote is None:
                self._check_local(reader)
            if int(reader.count or 0) * least > nbytes:
                raise ShardFormatError(f"{self.location}/manifest.json: {name} cannot hold "
                                       f"the {reader.count} samples it is given in {nbytes} "
                                       f"bytes")

    def _check_local(self, reader: ShardReader) -> None:
        """The shard file, where it exists, is a regular file in the set's folder."""
        try:
            st = os.stat(reader.path)
        except FileNotFoundError:
            return
        except OSError as e:
            raise ShardFormatError(f"shard {reader.path}: {e.strerror}") from None
        real = os.path.realpath(reader.path)
        if os.path.dirname(real) != os.path.realpath(self.root):
            raise ShardFormatError(f"shard {reader.path} is a link to {real}, outside the "
                                   f"set's folder: refused")
        if not stat.S_ISREG(st.st_mode):
            raise ShardFormatError(f"shard {reader.path} is not a regular file")

    def _fetched(self, read: Callable):
        """``read()`` of one of the set's files; a remote set's fetched once more where it
        does not check out (damaged on its way), then named by its URL.

        Raises:
            ShardFormatError: the file is damaged (a remote one twice: the store's copy)."""
        try:
            return read()
        except ShardFormatError as e:
            if self._remote is None:
                raise
            log.warning("%s: fetched again", str(e).replace(self.root, self.location))
        fetch_manifest(self._remote, self._cache)
        try:
            return read()
        except ShardFormatError as e:
            what = re.split(r"[;,] convert again", str(e))[0].replace(self.root, self.location)
            raise ShardFormatError(f"{what} (fetched twice: the store's copy is damaged; "
                                   f"upload the set again)") from None

    @property
    def location(self) -> str:
        """Where the set is, for messages: its URL (without credentials), else its folder."""
        return self.url or self.root

    def stored_size(self, size) -> int:
        """``size`` as an int, or a ValueError naming the sizes this set stores."""
        return stored_size(size, self.sizes, f"in {self.location}; stored sizes")

    def __len__(self) -> int:
        return self._n

    #: the epoch's own draw of indices (a ``Mixture``'s); None: each sample once
    draw: Draw | None = None

    @property
    def epoch_size(self) -> int:
        """Samples in an epoch: all of them."""
        return self._n

    def source_of(self, indices) -> np.ndarray:
        """0 for each of ``indices`` (a ``Mixture`` says which of its sets)."""
        return np.zeros(len(np.asarray(indices).reshape(-1)), np.int64)

    def __repr__(self) -> str:
        where = self.location
        return (f"ShardSet({where!r}, {self._n} samples, {len(self.classes)} classes, "
                f"{self.container}/{self.encoding}, sizes={list(self.sizes)})")

    @property
    def labels(self) -> np.ndarray:
        """Each sample's label: int64 ``(N,)`` class indices, or float32 ``(N, K)`` multi-hot
        rows or regression targets (``label_kind``); a detection or segmentation set's are 0
        (its boxes or class maps: ``field_values("label", ...)``, or at version 3
        ``annotations``)."""
        if self._labels is None and self.label_kind == "none":
            self._labels = np.zeros(self._n, np.int64)
        if self._labels is None and self._in_field:
            self._labels = np.asarray(self.field_values("label", np.arange(self._n)))
        if self._labels is None and self.label_kind in ("multi_label", "regression"):
            self._labels = self._fetched(lambda: read_targets(self.root,
                                                              self.manifest["targets"]))
        if self._labels is None:        # each checked: else a loss fails far from here
            parts = [self._shard_labels(sh) for sh in range(len(self.shards))]
            self._labels = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return self._labels

    @property
    def annotations(self) -> Annotations | ClassMaps | None:
        """A detection set's boxes, classes and masks, or a segmentation set's class maps
        (opened and checked on first use, in each process), else None (a set whose labels are
        the field ``label``: ``field_values``)."""
        if self._annotations is None and self.label_kind in SPATIAL_KINDS \
                and self.label_field is None:
            self._annotations = self._fetched(lambda: open_annotations(
                self.root, self.manifest["annotations"], self.label_kind, num_samples=self._n,
                num_classes=len(self.classes), sizes=self.sizes))
        return self._annotations

    def __getstate__(self):
        return {**self.__dict__, "_annotations": None}     # a memory map: reopened where read

    def labels_of(self, indices) -> np.ndarray:
        """``labels[indices]``, reading only the shards of ``indices`` where the labels are
        not all read yet (a remote set fetches no other shard for them, and each shard's
        labels once)."""
        if self._labels is None and self._in_field and self.url is not None:
            return np.asarray(self.field_values("label", indices))
        if self._labels is not None or self.label_kind not in ("class", *SPATIAL_KINDS) \
                or self.url is None:
            return self.labels[indices]
        shard, local = self.locate(indices)
        out = np.empty(len(local), np.int64)
        for sh, rows in _by_shard(shard):
            part = self._shard_labels_read.get(sh)
            if part is None:
                part = self._shard_labels_read[sh] = self._shard_labels(sh)
            out[rows] = part[local[rows]]
        return out

    def _using(self, shards):
        """A context in which the readers of ``shards`` stay open (a remote set's)."""
        return contextlib.nullcontext() if self._open is None else self._open.using(shards)

    def _shard_labels(self, sh: int) -> np.ndarray:
        """Shard ``sh``'s labels, checked against its count and the classes."""
        shard = self.shards[sh]
        with self._using([sh]):
            part = shard.labels()
        if len(part) != shard.count or (part.size and not (
                0 <= part.min() and part.max() < len(self.classes))):
            raise OSError(f"{shard.path}: its labels are damaged (not {shard.count} labels in "
                          f"0..{len(self.classes) - 1}); check the set with `fastdata verify "
                          f"{self.location}`")
        return part

    def fetch_ahead(self, indices, in_flight: int | None = None, processes: int = 1,
                    ranks: int = 1) -> FetchAhead | None:
        """Start fetching a remote set's shards in the background, in the order ``indices``
        first read them (``streaming.FetchAhead``: ``in_flight`` at a time, by default as many
        as keep about 64 MiB in flight), and with a ``cache_limit`` no further ahead than the
        cache holds beside the shards still to be read; None for a local set. A failed fetch
        is left to the read that needs the shard. ``processes``: how many processes read the
        pass (its worker processes), which share the cache's room for open shards; ``ranks``:
        how many passes of the node read other shards into the same cache, each planning on
        its share of the limit."""
        if self.url is None:
            return None
        shard, _ = self.locate(indices)
        if self._open is not None:
            self._open.processes = processes * ranks
        return FetchAhead(self.shards, self.manifest["shards"], shard, in_flight,
                        None if self._open is None else self._open.finish, share=ranks)

    def locate(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """``(shard, index within the shard)`` of each sample of ``indices`` (negative ones count
        from the end).

        Raises:
            TypeError: indices that are not integers.
            ValueError: not one sequence of indices.
            IndexError: an index out of range (named).
        """
        idx = sample_indices(indices, self._n)
        shard = np.searchsorted(self._starts, idx, side="right") - 1
        return shard, idx - self._starts[shard]

    def sample_names(self, indices) -> Callable[[int], str]:
        """``name(k)``: which sample ``indices[k]`` is, for messages (its index, its shard
        file and its place there), worked out only when asked."""
        def name(k: int) -> str:
            i = int(np.asarray(indices).reshape(-1)[k])
            (shard,), (local,) = self.locate([i])
            return (f"sample {i} ({os.path.basename(self.shards[shard].path)}, its sample "
                    f"{int(local)})")
        return name

    def __getitem__(self, i: int) -> tuple[np.ndarray, int | np.ndarray] | dict:
        """Sample ``i``: ``(image, label)``; for a set with fields, a dict of the image, the
        label (where the set has one) and each field's value."""
        image = self.read_batch([i])[0]         # checks i
        label = None if self.label_kind == "none" else self.field_values("label", [i])[0] \
            if self.label_field is not None else self.labels_of([i])[0]
        if isinstance(label, (np.ndarray, np.generic)) and label.ndim == 0:    # a class
            label = int(label)
        if not self.fields and label is not None:
            return image, label
        sample = {"image": image} if label is None else {"image": image, "label": label}
        for name in self.fields:
            sample[name] = self.field_values(name, [i])[0]
        return sample

    def field_values(self, name: str, indices, moved: tuple | None = None
                     ) -> list | np.ndarray:
        """Field ``name``'s values of samples ``indices``, in that order: an array (a
        fixed-size kind's ``(B, *shape)``), else a list (``str`` for text); ``"label"``: the
        labels, where a field holds them (``label_field``). ``moved``: ``(crops, flips,
        stored, out)``, the batch's crops ``(B, 4)`` (top, left, h, w in stored pixels of side
        ``stored``) and flips ``(B,)``, to ``out`` pixels: each value through its own
        (``FieldKind.move_batch``).

        Raises:
            KeyError: the set has no field ``name`` (naming those it has).
            OSError: a stored value that is not of the field's kind (naming its shard).
        """
        kind = self._stored.get(name)
        if kind is None:
            raise KeyError(f"{self.location} has no field {name!r}; its fields: "
                           f"{', '.join(self.fields) or 'none'}")
        shard, local = self.locate(indices)
        parts = {}
        for sh, rows in _by_shard(shard):
            with self._using([sh]):
                parts[sh] = rows, self.shards[sh].field_values(name, local[rows],
                                                               moved_part(moved, rows))
        if kind.fixed:
            out = np.empty((len(local), *kind.shape), kind.dtype)
            for rows, values in parts.values():
                out[rows] = values
            return out
        values_out: list = [None] * len(local)
        for rows, values in parts.values():
            for r, v in zip(rows.tolist(), values):
                values_out[r] = v
        return values_out

    def read_batch(self, indices, size: int | None = None, out: np.ndarray | None = None
                   ) -> np.ndarray:
        """Samples ``indices`` (in that order) as one ``(B, S, S, 3)`` uint8 array."""
        faults = guard_faults()
        out = self._read_batch(indices, size, out)
        if guard_faults() != faults:        # a shard cut short under the copy: which one
            self.check_intact(indices)
        return out

    def check_intact(self, indices) -> None:
        """``ShardReader.check_intact`` of each shard that holds some of ``indices``: after a
        read during which a guarded map faulted (``guard_faults()`` moved), it names the
        shard that was cut short or rewritten."""
        shard, _ = self.locate(indices)
        for sh, _ in _by_shard(shard):
            self.shards[sh].check_intact()

    def _read_batch(self, indices, size, out) -> np.ndarray:
        s = self.size if size is None else self.stored_size(size)
        out = batch_buffer(len(np.asarray(indices).reshape(-1)), s, out)
        self.read_into(indices, s, out, np.arange(len(out)))
        return out

    def read_into(self, indices, s: int, out: np.ndarray, at: np.ndarray) -> None:
        """Sample ``indices[k]`` at the stored size ``s`` into row ``at[k]`` of ``out`` (a
        ``(B, s, s, 3)`` uint8 array), as a ``Mixture`` fills a batch of several sets."""
        shard, local = self.locate(indices)
        with self._using(np.unique(shard).tolist()):
            self._read_shards(shard, local, s, out, at)

    def _read_shards(self, shard, local, s: int, out: np.ndarray, at: np.ndarray) -> None:
        for sh, where in _by_shard(shard):
            rows = at[where]
            local_rows = local[where]
            reader = self.shards[sh]
            reader.check_intact()
            if self.encoding == "raw":
                reader.read_raw(s, local_rows, out, rows)
                continue
            payloads = reader.payloads(s, local_rows)      # an unopenable shard says so
            for r, i, buf in zip(rows.tolist(), local_rows.tolist(), payloads):
                try:
                    decode_jpeg(buf, out[r])
                except Exception as e:      # noqa: BLE001 - damaged data, named below
                    raise OSError(f"{reader.path}: sample {i} (of that shard) at size {s} is "
                                  f"not a readable JPEG ({e}); check the set with "
                                  f"`fastdata verify {self.root}`") from e

    def raw_views(self, indices, size: int | None = None,
                  hold: contextlib.ExitStack | None = None) -> list[np.ndarray] | None:
        """Samples ``indices`` as (S, S, 3) uint8 views of the shards' memory maps, with no
        copy (a transform that crops reads only its crop), valid until ``hold`` closes; None
        where this set cannot give them (JPEG; LMDB without ``hold``, since a value lives only
        as long as its transaction, which ``hold`` keeps open)."""
        if self.encoding != "raw" or (hold is None and not READERS[self.container].zero_copy):
            return None
        if self._open is not None:      # the views live as long as the maps: kept open
            if hold is None:
                return None
            hold.enter_context(self._using(np.unique(self.locate(indices)[0]).tolist()))
        # LMDB: one transaction per shard
        return self._per_shard(indices, size, lambda sh, s, local: sh.raw_views(s, local, hold))

    def read_encoded(self, indices, size: int | None = None) -> list:
        """The stored payloads (JPEG bytes, or raw HWC bytes) of ``indices``, in that order."""
        return self._per_shard(indices, size, lambda sh, s, local: sh.payloads(s, local))

    def _per_shard(self, indices, size, fetch) -> list:
        """``fetch(reader, size, local)`` for each shard's share of ``indices``, in their order."""
        s = self.size if size is None else self.stored_size(size)
        shard, local = self.locate(indices)
        out: list = [None] * len(local)
        for sh, rows in _by_shard(shard):
            with self._using([sh]):
                self.shards[sh].check_intact()
                for r, v in zip(rows.tolist(), fetch(self.shards[sh], s, local[rows])):
                    out[r] = v
        return out

    def close(self) -> None:
        """Drop every shard's handles and memory maps (they reopen on the next read)."""
        for sh in self.shards:
            sh.close()

    def iter_shards(self) -> Iterator[tuple[dict, ShardReader]]:
        """``(manifest entry, reader)`` of each shard, in order."""
        return zip(self.manifest["shards"], self.shards)


def stored_size(size, sizes, where: str) -> int:
    """``size`` as an int, or a ValueError naming ``sizes`` (``where``: "in X; stored sizes")."""
    s = check_size(size)
    if s not in sizes:
        raise ValueError(f"size {size!r} is not stored {where}: {', '.join(map(str, sizes))}")
    return s


def batch_buffer(n: int, s: int, out: np.ndarray | None) -> np.ndarray:
    """``out`` checked to be a uint8 ``(n, s, s, 3)`` batch, or a fresh page-aligned one."""
    if out is None:
        return page_aligned((n, s, s, 3))
    if out.shape != (n, s, s, 3) or out.dtype != np.uint8:
        raise ValueError(f"out must be uint8 {(n, s, s, 3)}, got {out.dtype} {out.shape}")
    return out


def moved_part(moved: tuple | None, where) -> tuple | None:
    """``field_values``' ``moved`` of the batch's samples at positions ``where``: their crops
    and flips, to the same sizes."""
    if moved is None:
        return None
    crops, flips, *sizes = moved
    return (np.asarray(crops).reshape(-1, 4)[where], np.asarray(flips).reshape(-1)[where],
            *sizes)


def sample_indices(indices, n: int) -> np.ndarray:
    """``indices`` as int64 indices into ``n`` samples, negative ones counted from the end (as
    Python and numpy count): the one index rule of sets and mixtures.

    Raises:
        TypeError: indices that are not integers.
        ValueError: not one sequence of indices.
        IndexError: an index out of range (named).
    """
    idx = np.asarray(indices)
    if idx.size and not np.issubdtype(idx.dtype, np.integer):
        raise TypeError(f"sample indices must be integers, got {idx.dtype} "
                        f"(e.g. {idx.reshape(-1)[0]!r})")
    if idx.ndim > 1:        # numpy would give (2, 3, S, S, 3) for (2, 3): not a batch
        raise ValueError(f"sample indices must be one sequence, got shape {idx.shape}")
    idx = idx.astype(np.int64, copy=False).reshape(-1)
    if idx.size and (idx.min() < -n or idx.max() >= n):
        bad = idx[(idx < -n) | (idx >= n)][0]
        raise IndexError(f"sample index {bad} out of range for {n} samples")
    return np.where(idx < 0, idx + n, idx) if idx.size and idx.min() < 0 else idx


def _by_shard(shard: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """``(shard, positions)`` for each shard that ``shard`` (a shard index per sample) names."""
    for sh in np.unique(shard):
        yield int(sh), np.flatnonzero(shard == sh)


def open(root: str | os.PathLike, *, size: int | None = None,  # noqa: A001
         cache_dir: str | os.PathLike | None = None, cache_limit: int | None = None
         ) -> ShardSet:
    """Open the shard set at ``root`` (a directory with ``manifest.json``, or its URL in an
    object store).

    Args:
        root: the set's folder, or a URL: ``s3://``, ``gs://``, ``az://``, ``http(s)://``,
            ``file://`` (``pip install 'fastdata-shards[remote]'``; ``docs/loading.md``,
            "Shard sets in an object store").
        size: the stored size ``ds[i]`` and ``read_batch`` read by default (default: the
            largest).
        cache_dir: where a remote set's shards are kept on this node (default:
            ``$FASTDATA_CACHE``, else ``~/.cache/fastdata``); shared by the node's processes.
        cache_limit: the most bytes of shards kept there (None: no limit).

    Returns:
        The ``ShardSet``; shards open lazily, in the process that reads them.

    Raises:
        ShardFormatError: no manifest (or an unfinished conversion), a manifest of another
            format or version, or a field or shard file that does not check out (named).
        ValueError: ``size`` is not one the set stores, or a bad ``cache_limit``.
        OSError: a remote set's manifest cannot be fetched (the URL and what failed).
        ImportError: a URL without obstore installed (the extra to install).
    """
    return ShardSet(root, size=size, cache_dir=cache_dir, cache_limit=cache_limit)
