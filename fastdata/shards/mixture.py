"""``Mixture``: several shard sets read as one, each epoch drawing from each set its share.

* Samples: the sets' samples one after another (set ``k``'s sample ``i`` is index
  ``starts[k] + i``); ``read_batch``, ``labels`` and the other ``ShardSet`` reads take those
  indices, so every backend reads a mixture as it reads a set.
* An epoch (``epoch_size`` samples, by default all the sets' together) holds
  ``round(epoch_size * weight)`` samples of each set (largest remainders: the counts add up).
  Without replacement a set's samples come from an endless series of permutations of it, taken
  in turn over the epochs: a set drawn below its size shows every sample before any repeats,
  one drawn above it repeats each at most once more than any other. With replacement, each
  draw is uniform over the set. Training shuffles the epoch's samples together; evaluation
  (no shuffle) reads set after set, each from its start (cycled where its count is larger).
* Everything is drawn from ``(seed, epoch)``: the same on every rank, backend and layout, so
  the ``Order``'s partition and resume rules hold unchanged.
* Classes: ``"offset"`` puts set ``k``'s classes after those of the sets before it (class
  ``c`` of set ``k`` is ``offsets[k] + c``; ``classes`` lists them all, set after set);
  ``"union"`` joins them by name (the sorted names of all sets: a class two sets share is one
  class). Multi-label and regression sets mix only with sets of the same kind and columns.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence

import numpy as np

from fastdata.checks import choice, flag, integer
from fastdata.env import check_fits
from fastdata.format import SPATIAL_KINDS
from fastdata.shards.mapped import guard_faults
from fastdata.shards.set import (
    ShardSet,
    batch_buffer,
    moved_part,
    sample_indices,
    stored_size,
)

CLASS_RULES = ("offset", "union")


def _check_distinct(sets: list[ShardSet]) -> None:
    """Refuse a set given twice: its images would be two samples of two classes."""
    seen: dict[str, int] = {}
    for k, s in enumerate(sets):
        where = s.url or os.path.realpath(s.root)
        if where in seen:
            raise ValueError(f"sets[{k}] is sets[{seen[where]}] again ({s.location}): give each "
                             f"set once, and a larger weight to read it more often")
        seen[where] = k


def _fields(ds) -> str:
    """A set's fields, for a message."""
    return ", ".join(f"{n} ({k.kind})" for n, k in ds.fields.items()) or "no fields"


def _counts(weights: np.ndarray, total: int) -> np.ndarray:
    """``total`` split by ``weights`` (which add up to 1), largest remainders first."""
    exact = weights * total
    counts = np.floor(exact).astype(np.int64)
    short = total - int(counts.sum())
    counts[np.argsort(-(exact - counts), kind="stable")[:short]] += 1
    return counts


class Mixture:
    """Shard sets read as one, each epoch drawing each set's share (module docstring).

    Args:
        sets: the shard sets (paths or ``ShardSet``), at least one; of one encoding.
        weights: each set's share of an epoch (positive; normalised). Default: each set's
            share of all the samples (the sets concatenated).
        epoch_size: samples in an epoch (default: all the sets' together).
        replacement: draw each set's samples with replacement (default: without, as far as
            the set's size allows).
        classes: ``"offset"`` or ``"union"`` (how the sets' class indices map to one space).
        cache_dir: the node cache of the sets given as URLs (``fastdata.open``'s).
        cache_limit: the most bytes of shards that cache keeps (None: no limit).

    Raises:
        ValueError: no set, a bad weight (named), sets of different encodings, sizes or
            label kinds, or a class rule not in ``CLASS_RULES``.
    """

    def __init__(self, sets: Sequence[str | os.PathLike | ShardSet], *,
                 weights: Sequence[float] | None = None, epoch_size: int | None = None,
                 replacement: bool = False, classes: str = "offset",
                 cache_dir: str | os.PathLike | None = None, cache_limit: int | None = None):
        if isinstance(sets, (str, os.PathLike, ShardSet)) or not len(sets):
            raise ValueError("a Mixture needs a list of one or more shard sets")
        self.sets = [s if isinstance(s, ShardSet) else
                     ShardSet(s, cache_dir=cache_dir, cache_limit=cache_limit) for s in sets]
        _check_distinct(self.sets)
        self.class_rule = choice("classes", classes, CLASS_RULES)
        self.replacement = flag("replacement", replacement)
        self.sizes_of = np.array([len(s) for s in self.sets], np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.sizes_of)[:-1]]).astype(np.int64)
        self._total = int(self.sizes_of.sum())
        self.epoch_size = integer("epoch_size", self._total if epoch_size is None
                                  else epoch_size, 1)
        # an epoch's order: its indices, drawn and shuffled (three arrays of them at once)
        check_fits(f"epoch_size={self.epoch_size}", 24 * self.epoch_size,
                   "give a smaller epoch_size")
        self.weights = self._weights(weights)
        self.counts = _counts(self.weights, self.epoch_size)
        empty = [s.location for s, c, n in zip(self.sets, self.counts, self.sizes_of)
                 if c and not n]
        if empty:
            raise ValueError(f"{empty[0]} holds no sample but is given a weight")
        self._check_alike()
        self.classes, self.offsets, self._maps = self._class_space()
        self.size = max(self.sizes)
        self._labels: np.ndarray | None = None

    # ---- what the sets must share ----
    def _weights(self, weights) -> np.ndarray:
        if weights is None:
            return self.sizes_of / max(self._total, 1)
        w = np.asarray(weights, np.float64).reshape(-1)
        if len(w) != len(self.sets):
            raise ValueError(f"weights={list(weights)} gives {len(w)} weight(s) for "
                             f"{len(self.sets)} sets")
        if not np.all(np.isfinite(w)) or np.any(w < 0) or w.max() <= 0:
            raise ValueError(f"weights={list(weights)} is not valid; use finite weights >= 0, "
                             f"not all 0")
        w = w / w.max()         # first: a sum of weights near the largest float is infinite
        return w / w.sum()

    def _check_alike(self) -> None:
        first = self.sets[0]
        if any(s.label_kind in SPATIAL_KINDS for s in self.sets):
            raise ValueError("detection and segmentation sets are read one at a time: a "
                             "Mixture mixes class, multi-label and regression sets")
        for other in self.sets[1:]:
            for what in ("encoding", "label_kind"):
                if getattr(other, what) != getattr(first, what):
                    raise ValueError(f"cannot mix {first.root} ({what} "
                                     f"{getattr(first, what)}) with {other.root} "
                                     f"({getattr(other, what)})")
            if other.fields != first.fields:
                raise ValueError(f"cannot mix sets of other fields: {first.root} has "
                                 f"{_fields(first)}, {other.root} {_fields(other)}")
            if first.label_kind != "class" and other.classes != first.classes:
                raise ValueError(f"cannot mix {first.label_kind} targets of other columns: "
                                 f"{first.root} has {first.classes}, {other.root} "
                                 f"{other.classes}")
        common = set.intersection(*(set(s.sizes) for s in self.sets))
        if not common:
            raise ValueError(f"the sets store no size in common: "
                             f"{'; '.join(f'{s.root}: {list(s.sizes)}' for s in self.sets)}")
        self.sizes: tuple[int, ...] = tuple(sorted(common))
        self.encoding, self.label_kind = first.encoding, first.label_kind
        self.fields = first.fields
        self.container = "mixture"

    def _class_space(self) -> tuple[list[str], np.ndarray, list[np.ndarray] | None]:
        """The classes, each set's offset into them, and (``"union"``) each set's map."""
        if self.label_kind != "class":
            return list(self.sets[0].classes), np.zeros(len(self.sets), np.int64), None
        if self.class_rule == "offset":
            sizes = [len(s.classes) for s in self.sets]
            offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
            return [c for s in self.sets for c in s.classes], offsets, None
        names = sorted({c for s in self.sets for c in s.classes})
        where = {c: k for k, c in enumerate(names)}
        maps = [np.array([where[c] for c in s.classes], np.int64) for s in self.sets]
        return names, np.zeros(len(self.sets), np.int64), maps

    # ---- the order ----
    @property
    def rule(self) -> str:
        """What decides the epoch's order, as a loader's state records it (a resume must
        draw the same: the same sets' sizes, their counts and the replacement rule)."""
        sets = ", ".join(f"{c} of {n}" for c, n in zip(self.counts.tolist(),
                                                        self.sizes_of.tolist()))
        return f"a mixture ({sets}{', with replacement' if self.replacement else ''})"

    def draw(self, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
        """The indices of epoch ``epoch``: each set's count, drawn as the docstring says."""
        parts = [self._picks(seed, epoch, k, shuffle) + self.starts[k]
                 for k in range(len(self.sets))]
        order = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        if shuffle:
            order = order[np.random.default_rng([seed, epoch, 1]).permutation(len(order))]
        return order

    def _picks(self, seed: int, epoch: int, k: int, shuffle: bool) -> np.ndarray:
        """Set ``k``'s samples (its own indices) in epoch ``epoch``."""
        n, c = int(self.sizes_of[k]), int(self.counts[k])
        if not c:
            return np.zeros(0, np.int64)
        if self.replacement and shuffle:
            return np.random.default_rng([seed, epoch, 2, k]).integers(0, n, c, dtype=np.int64)
        # its place in the set's endless series of permutations; evaluation: from the start
        first = epoch * c if shuffle else 0
        series = np.concatenate([
            np.random.default_rng([seed, 3, k, r]).permutation(n) if shuffle else np.arange(n)
            for r in range(first // n, (first + c - 1) // n + 1)])
        start = first - (first // n) * n
        return series[start:start + c].astype(np.int64)

    # ---- the ShardSet reads, by member ----
    @property
    def root(self) -> str:
        return " + ".join(s.root for s in self.sets)

    @property
    def location(self) -> str:
        """Where the sets are, for messages."""
        return " + ".join(s.location for s in self.sets)

    @property
    def shards(self) -> list:
        return [sh for s in self.sets for sh in s.shards]

    def __len__(self) -> int:
        """The samples of all the sets (the index space; an epoch has ``epoch_size``)."""
        return self._total

    def __repr__(self) -> str:
        shares = ", ".join(f"{s.root}: {c}" for s, c in zip(self.sets, self.counts))
        return (f"Mixture({len(self.sets)} sets, {self.epoch_size} samples an epoch "
                f"({shares}), replacement={self.replacement}, classes={self.class_rule!r})")

    def stored_size(self, size) -> int:
        """``size`` as an int, or a ValueError naming the sizes every set stores."""
        return stored_size(size, self.sizes,
                           "in every set of the mixture; sizes they all store")

    def source_of(self, indices) -> np.ndarray:
        """Which set (its place in ``sets``) each of ``indices`` is from."""
        idx = np.asarray(indices, np.int64).reshape(-1)
        return np.searchsorted(self.starts, idx, side="right") - 1

    def _split(self, indices):
        """``(k, positions in indices, local indices)`` for each set ``sets[k]`` among
        ``indices``."""
        idx = sample_indices(indices, self._total)
        src = self.source_of(idx)
        for k in np.unique(src).tolist():
            where = np.flatnonzero(src == k)
            yield k, where, idx[where] - self.starts[k]

    def _in_space(self, k: int, y: np.ndarray) -> np.ndarray:
        """Set ``k``'s class labels ``y`` in the mixture's class space."""
        return self._maps[k][y] if self._maps is not None else y + self.offsets[k]

    #: a mixture of detection or segmentation sets is refused: it has no targets
    annotations = label_field = None

    @property
    def labels(self) -> np.ndarray:
        """Each sample's label in the mixture's class space."""
        if self._labels is None:
            parts = []
            for k, s in enumerate(self.sets):
                parts.append(self._in_space(k, s.labels) if self.label_kind == "class"
                             else s.labels)
            self._labels = np.concatenate(parts)
        return self._labels

    def labels_of(self, indices) -> np.ndarray:
        """``labels[indices]`` (each set's ``labels_of``: a remote one fetches no other shard)."""
        if self._labels is not None or self.label_kind != "class" or all(
                s.url is None for s in self.sets):
            return self.labels[indices]
        out = np.empty(len(np.asarray(indices).reshape(-1)), np.int64)
        for k, where, local in self._split(indices):
            out[where] = self._in_space(k, self.sets[k].labels_of(local))
        return out

    def field_values(self, name: str, indices, moved: tuple | None = None
                     ) -> list | np.ndarray:
        """Field ``name``'s values of ``indices`` (``ShardSet.field_values``, ``moved`` too),
        in that order."""
        kind = self.fields.get(name)
        if kind is None:
            raise KeyError(f"the mixture has no field {name!r}; its fields: "
                           f"{', '.join(self.fields) or 'none'}")
        n = len(np.asarray(indices).reshape(-1))
        out: list | np.ndarray = (np.empty((n, *kind.shape), kind.dtype) if kind.fixed
                                  else [None] * n)
        for k, where, local in self._split(indices):
            values = self.sets[k].field_values(name, local, moved_part(moved, where))
            if kind.fixed:
                out[where] = values
            else:
                for w, v in zip(where.tolist(), values):
                    out[w] = v
        return out

    def fetch_ahead(self, indices, in_flight: int | None = None, processes: int = 1,
                    ranks: int = 1) -> _FetchesAhead | None:
        """Each remote set's ``fetch_ahead`` of its share of ``indices`` (None if none is
        remote)."""
        if all(s.url is None for s in self.sets):
            return None
        parts = []
        for k, where, local in self._split(indices):
            mine = np.zeros(len(np.asarray(indices).reshape(-1)) + 1, np.int64)
            mine[where + 1] = 1
            parts.append((self.sets[k].fetch_ahead(local, in_flight, processes, ranks),
                          np.cumsum(mine)))
        return _FetchesAhead([(p, c) for p, c in parts if p is not None])

    def read_batch(self, indices, size: int | None = None, out: np.ndarray | None = None
                   ) -> np.ndarray:
        """Samples ``indices`` (in that order) as one ``(B, S, S, 3)`` uint8 array."""
        s = self.size if size is None else self.stored_size(size)
        out = batch_buffer(len(np.asarray(indices).reshape(-1)), s, out)
        faults = guard_faults()
        for k, where, local in self._split(indices):
            self.sets[k].read_into(local, s, out, where)
        if guard_faults() != faults:
            self.check_intact(indices)
        return out

    def check_intact(self, indices) -> None:
        """``ShardSet.check_intact`` of the sets among ``indices``."""
        for k, _, local in self._split(indices):
            self.sets[k].check_intact(local)

    def _gather(self, indices, fetch: Callable) -> list | None:
        out: list = [None] * len(np.asarray(indices).reshape(-1))
        for k, where, local in self._split(indices):
            got = fetch(self.sets[k], local)
            if got is None:
                return None
            for w, v in zip(where.tolist(), got):
                out[w] = v
        return out

    def raw_views(self, indices, size: int | None = None,
                  hold: contextlib.ExitStack | None = None) -> list[np.ndarray] | None:
        """``ShardSet.raw_views`` over the sets (None where one of them cannot give them)."""
        s = self.size if size is None else self.stored_size(size)
        return self._gather(indices, lambda m, local: m.raw_views(local, s, hold))

    def read_encoded(self, indices, size: int | None = None) -> list:
        """The stored payloads of ``indices``, in that order."""
        s = self.size if size is None else self.stored_size(size)
        return self._gather(indices, lambda m, local: m.read_encoded(local, s)) or []

    def sample_names(self, indices) -> Callable[[int], str]:
        """``name(k)``: which set and sample ``indices[k]`` is, for messages."""
        def name(k: int) -> str:
            i = int(np.asarray(indices).reshape(-1)[k])
            (k, _, local), = self._split([i])
            return f"{self.sets[k].sample_names(local)(0)} of {self.sets[k].root}"
        return name

    def __getitem__(self, i: int):
        image = self.read_batch([i])[0]
        label = self.labels[i]
        return image, int(label) if label.ndim == 0 else label

    def close(self) -> None:
        """Close every set's shards."""
        for s in self.sets:
            s.close()


class _FetchesAhead:
    """The remote sets' ``FetchAhead`` of a mixture's pass: ``advance(n)`` tells each how many
    of its samples are among the pass's first ``n``."""

    def __init__(self, parts: list):
        self.parts = parts          # (FetchAhead, cumulative count of its samples)

    def advance(self, n: int) -> None:
        for p, counts in self.parts:
            p.advance(int(counts[min(n, len(counts) - 1)]))

    def stop(self) -> None:
        for p, _ in self.parts:
            p.stop()
