"""Which samples each rank reads, in which batches: the one implementation every backend uses.

* Epoch order: a permutation drawn from ``(seed, epoch)`` (identity when ``shuffle=False``), or
  a ``draw`` of its own from the same (a ``Mixture``'s, a shuffle over windows of shards);
  ``set_epoch(e)`` as ``DistributedSampler`` (the order repeats until it is called).
* Partition: rank ``r`` of ``w`` takes every ``w``-th sample of the epoch order from position
  ``r``. Train mode first truncates the order to a multiple of ``w`` so every rank holds the
  same number of samples (DDP must not hang); eval mode keeps all, so every sample is seen
  exactly once across ranks, never padded with duplicates.
* Batching: consecutive chunks of ``batch_size``; ``drop_last`` (default: train) drops each
  rank's final partial batch. In train mode all ranks therefore get the same number of batches.
* Resume: ``state_dict()`` records the seed, the epoch and how many samples of its order the
  ranks have consumed together: after ``p`` batches, rank ``r`` has read positions ``r``,
  ``r + w``, ... of the order, so all ranks together have read its first ``p * batch_size * w``.
  ``load_state_dict`` on any number of ranks, batch size or backend continues the epoch from
  there: the rest of the order, partitioned as above among the new ranks (each remaining sample
  once), then normal epochs. The epoch's order does not depend on the layout; only the tail
  that train mode drops (fewer than ``w * batch_size`` samples) does.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fastdata.checks import flag, integer

#: ``draw(seed, epoch, shuffle) -> indices``: an epoch's order by a rule of its own (a
#: ``Mixture``'s, ``ShardWindows``); the default is a permutation of ``range(n)``. A draw with a
#: ``rule`` attribute has it saved in the state and checked on resume.
Draw = Callable[[int, int, bool], np.ndarray]


class ShardWindows:
    """The draw of a shuffle over windows of shards: each epoch the shards are permuted, taken
    ``window`` at a time, and the samples of each window shuffled among themselves. A pass then
    reads its shards a window at a time (a remote set's cache holds a window, not the set).
    Unshuffled: the set in order.

    With ``parts``, the epoch's permuted shards are cut into ``parts`` runs of equal samples,
    each shuffled over its own windows, and the runs are dealt out in turn (position
    ``i * parts + k`` is run ``k``'s sample ``i``): under the partition every ``w``-th position
    to a rank, a world size ``w`` that divides ``parts`` gives each rank whole runs, so a rank
    (and a node) reads only its runs' shards; other world sizes still read every sample once.

    Args:
        counts: each shard's samples, in shard order.
        window: shards shuffled together (>= 1).
        parts: runs the epoch is cut into (>= 1; usually the world size), or None: one.
    """

    def __init__(self, counts, window: int, *, parts: int | None = None):
        self.counts = np.asarray(counts, np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)
        self.window = integer("window", window, 1)
        self.parts = integer("parts", parts, 1, optional=True)

    @property
    def rule(self) -> str:
        """What decides the order, as a state records it (a resume must draw the same)."""
        return f"windows of {self.window} shards" + (f" in {self.parts} runs" if self.parts else "")

    def __call__(self, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
        n = int(self.counts.sum())
        if not shuffle and self.parts is None:
            return np.arange(n, dtype=np.int64)
        rng = np.random.default_rng([seed, epoch, 4]) if shuffle else None
        shards = np.arange(len(self.counts)) if rng is None else rng.permutation(len(self.counts))
        idx = [np.arange(self.starts[s], self.starts[s] + self.counts[s]) for s in shards]
        seq = np.concatenate(idx) if idx else np.zeros(0, np.int64)
        place = np.repeat(np.arange(len(shards)), self.counts[shards])   # its shard's turn
        parts = self.parts or 1
        cuts = np.cumsum([0] + [n // parts + (k < n % parts) for k in range(parts)])
        runs = []
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            run = seq[lo:hi]
            if rng is not None and len(run):
                group = (place[lo:hi] - place[lo]) // self.window
                ends = np.flatnonzero(np.diff(group)) + 1
                run = np.concatenate([g[rng.permutation(len(g))] for g in np.split(run, ends)])
            runs.append(run)
        return _deal(runs)


def _deal(runs: list[np.ndarray]) -> np.ndarray:
    """Runs dealt out in turn; each run is at most one longer than the next."""
    if len(runs) == 1:
        return runs[0].astype(np.int64, copy=False)
    full = min(len(r) for r in runs)
    head = np.stack([r[:full] for r in runs], axis=1).reshape(-1)
    return np.concatenate([head, [r[full] for r in runs if len(r) > full]]).astype(np.int64)


class Order:
    def __init__(self, n: int, *, batch_size: int, train: bool = True, shuffle: bool | None = None,
                 seed: int = 0, rank: int = 0, world_size: int = 1, drop_last: bool | None = None,
                 draw: Draw | None = None):
        self.draw = draw
        # what the epoch's order is drawn by (None: a draw that does not say), checked on
        # resume; a bound method's is its object's (a Mixture's draw)
        self.rule = "permutation" if draw is None else getattr(
            getattr(draw, "__self__", draw), "rule", None)
        self.n, self.batch_size = integer("n", n, 0), integer("batch_size", batch_size, 1)
        self.world_size = integer("world_size", world_size, 1)
        if not isinstance(rank, (int, np.integer)) or not 0 <= rank < world_size:
            raise ValueError(f"rank={rank!r} is not valid for world_size={world_size}; "
                             f"use 0..{world_size - 1}")
        self.rank, self.seed = int(rank), integer("seed", seed, 0)  # numpy's seeds are >= 0
        self.train = flag("train", train)
        self.shuffle = flag("shuffle", shuffle, self.train)
        self.drop_last = flag("drop_last", drop_last, self.train)
        self.epoch = 0
        self.offset = 0         # samples of the epoch's order read before this pass (a resume)
        self.position = 0       # batches this pass has served
        if self.train and self.n and not len(self):     # the same on every rank: no DDP hang
            per_rank = self.n // self.world_size
            if not per_rank:
                raise ValueError(f"world_size={self.world_size} leaves no training sample per "
                                 f"rank: the shard set holds {self.n}")
            raise ValueError(f"batch_size={batch_size} leaves no training batch: each of the "
                             f"{self.world_size} rank(s) holds {per_rank} samples and "
                             f"drop_last=True drops a partial batch; use batch_size <= "
                             f"{per_rank} or drop_last=False")

    def set_epoch(self, epoch: int) -> None:
        epoch = integer("epoch", epoch, 0)     # -1 or "1" failed only at the next iteration
        if epoch != self.epoch:
            self.rewind()
        self.epoch = epoch

    def rewind(self) -> None:
        """The next pass reads the current epoch from its start."""
        self.offset = self.position = 0

    def consumed(self, position: int | None = None) -> int:
        """Samples of the epoch's order the ranks have read together after ``position`` (default:
        this pass's) batches of this pass."""
        position = self.position if position is None else position
        return self.offset + position * self.batch_size * self.world_size

    def batch_seed(self, epoch: int, position: int) -> int:
        """Seed of this pass's batch ``position``: independent of which worker runs it, and the
        same in a run resumed on the same layout."""
        return int(np.random.SeedSequence([self.seed, epoch, self.rank, self.consumed(position)])
                   .generate_state(1)[0])

    def permutation(self) -> np.ndarray:
        """The epoch's order of the whole set (every rank's share)."""
        if self.draw is not None:
            return np.asarray(self.draw(self.seed, self.epoch, self.shuffle), np.int64)
        if not self.shuffle:
            return np.arange(self.n, dtype=np.int64)
        return np.random.default_rng([self.seed, self.epoch]).permutation(self.n).astype(np.int64)

    def rank_indices(self) -> np.ndarray:
        order = self.permutation()[self.offset:]
        if self.train:
            order = order[: len(order) - len(order) % self.world_size]
        return order[self.rank::self.world_size]

    def _batches_from(self, offset: int) -> int:
        """This rank's batches in an epoch whose first ``offset`` samples are read."""
        left = max(self.n - offset, 0)
        if self.train:
            k = left // self.world_size
        else:
            k = len(range(self.rank, left, self.world_size))
        return k // self.batch_size if self.drop_last else -(-k // self.batch_size)

    def __len__(self) -> int:
        """Batches per (whole) epoch for this rank."""
        return self._batches_from(0)

    def pass_length(self) -> int:
        """Batches of this pass: the epoch's, or in a resumed epoch those after its offset."""
        return self._batches_from(self.offset)

    def batches(self) -> list[np.ndarray]:
        """This rank's remaining batches of this pass (from ``position`` on)."""
        idx = self.rank_indices()
        return [idx[b * self.batch_size:(b + 1) * self.batch_size]
                for b in range(self.position, self.pass_length())]

    def state_dict(self, position: int | None = None) -> dict:
        """The epoch and the samples of it read, after ``position`` (default: this pass's)
        batches of this pass."""
        return {"seed": self.seed, "epoch": self.epoch, "consumed": self.consumed(position),
                "position": self.position if position is None else position,
                "n": self.n, "batch_size": self.batch_size, "world_size": self.world_size,
                "rank": self.rank, **({"order": self.rule} if self.rule else {})}

    def load_state_dict(self, state: dict) -> None:
        """Continue the saved epoch, on any layout (world size, batch size).

        Raises:
            ValueError: not an order's state, or one of a set of another size or another
                order (``shuffle_window``, ``shard_split``).
        """
        keys = ("seed", "epoch", "consumed", "n")
        if not isinstance(state, dict) or not all(k in state for k in keys):
            raise ValueError(f"not a loader state (a dict with {', '.join(keys)}): "
                             f"{str(state)[:100]}")
        for key in keys:            # an array or a string named, not compared
            integer(key, state[key], 0)
        if state["n"] != self.n:
            raise ValueError(f"cannot resume: saved n={state['n']} samples per epoch but this "
                             f"loader has n={self.n}")
        saved = state.get("order")
        if saved != self.rule:
            raise ValueError(f"cannot resume: the saved epoch's order is drawn by "
                             f"{str(saved)[:100]!r}, this loader's by {self.rule!r}; resume "
                             f"with the same set or mixture (its weights), shuffle_window and "
                             f"shard_split")
        self.seed, self.epoch = int(state["seed"]), int(state["epoch"])
        self.offset = integer("consumed", state["consumed"], 0, self.n)
        self.position = 0
