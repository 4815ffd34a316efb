"""Which samples each rank reads, in which batches: the one implementation every backend uses.

* Epoch order: a permutation drawn from ``(seed, epoch)`` (identity when ``shuffle=False``);
  ``set_epoch(e)`` as ``DistributedSampler`` (the order repeats until it is called).
* Partition: rank ``r`` of ``w`` takes every ``w``-th sample of the epoch order from position
  ``r``. Train mode first truncates the order to a multiple of ``w`` so every rank holds the
  same number of samples (DDP must not hang); eval mode keeps all, so every sample is seen
  exactly once across ranks, never padded with duplicates.
* Batching: consecutive chunks of ``batch_size``; ``drop_last`` (default: train) drops each
  rank's final partial batch. In train mode all ranks therefore get the same number of batches.
* Resume: ``state_dict()`` records (seed, epoch, batches served); after ``load_state_dict`` the
  next iteration yields exactly the remaining batches of that epoch.
"""
from __future__ import annotations

import numpy as np

from fastdata.checks import flag, integer


class Order:
    def __init__(self, n: int, *, batch_size: int, train: bool = True, shuffle: bool | None = None,
                 seed: int = 0, rank: int = 0, world_size: int = 1, drop_last: bool | None = None):
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
        self.position = 0       # batches already served in this epoch
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
            self.position = 0
        self.epoch = epoch

    def batch_seed(self, epoch: int, position: int) -> int:
        """Seed of one batch's augmentation: independent of which worker runs it."""
        return int(np.random.SeedSequence([self.seed, epoch, self.rank, position])
                   .generate_state(1)[0])

    def permutation(self) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.n, dtype=np.int64)
        return np.random.default_rng([self.seed, self.epoch]).permutation(self.n).astype(np.int64)

    def rank_indices(self) -> np.ndarray:
        order = self.permutation()
        if self.train:
            order = order[: len(order) - len(order) % self.world_size]
        return order[self.rank::self.world_size]

    def __len__(self) -> int:
        """Batches per epoch for this rank."""
        if self.train:
            k = self.n // self.world_size
        else:
            k = len(range(self.rank, self.n, self.world_size))
        return k // self.batch_size if self.drop_last else -(-k // self.batch_size)

    def batches(self) -> list[np.ndarray]:
        """This rank's remaining batches of the current epoch (from ``position`` on)."""
        idx = self.rank_indices()
        nb = len(self)
        return [idx[b * self.batch_size:(b + 1) * self.batch_size]
                for b in range(self.position, nb)]

    def state_dict(self) -> dict:
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position,
                "n": self.n, "batch_size": self.batch_size, "world_size": self.world_size,
                "rank": self.rank}

    def load_state_dict(self, state: dict) -> None:
        keys = ("seed", "epoch", "position", "n", "batch_size", "world_size")
        if not isinstance(state, dict) or not all(k in state for k in keys):
            raise ValueError(f"not a loader state (a dict with {', '.join(keys)}): "
                             f"{str(state)[:100]}")
        for k in ("n", "batch_size", "world_size"):
            if state[k] != getattr(self, k):
                raise ValueError(f"cannot resume: saved {k}={state[k]} but this loader has "
                                 f"{k}={getattr(self, k)}")
        self.seed, self.epoch, self.position = state["seed"], state["epoch"], state["position"]
