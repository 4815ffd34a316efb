"""``ShardDataModule``: fastdata loaders for Lightning's ``Trainer`` (``pip install
'fastdata-shards[lightning]'``).

The trainer gives each loader its rank, world size and device; each training epoch starts the
loader's epoch (``set_epoch``), validation and test read every sample exactly once over the
ranks, and the DataModule's ``state_dict`` (saved in Lightning's checkpoints) resumes a
training epoch exactly where the checkpoint was taken, mid-epoch included.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from fastdata._optional import require
from fastdata.shards import ShardSet

L = require("lightning", "fastdata.integrations.lightning")


class _Epochs:
    """The training loader as Lightning iterates it: each pass starts the trainer's epoch, or
    the remaining batches of the epoch a checkpoint was taken in."""

    def __init__(self, loader, module: ShardDataModule):
        self.loader, self.module = loader, module

    def __len__(self) -> int:
        return len(self.loader)

    # Lightning asks the training loader itself whether it resumes mid-epoch (else it warns
    # that it does not); the position is saved once, in the DataModule's state
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def __iter__(self):
        # a generator: Lightning also calls iter() only to check that it can; the epoch is
        # chosen when the first batch is asked for
        module = self.module
        resume, module._resume = module._resume, None
        # the trainer's count of the epoch's batches goes on from the checkpoint's
        module._first = _processed(module.trainer) if resume is not None else 0
        if resume is None:
            self.loader.set_epoch(module.trainer.current_epoch)
        else:
            self.loader.load_state_dict(resume)
            if not self.loader.batches_left():  # saved after the epoch's last batch: the next
                self.loader.set_epoch(resume["order"]["epoch"] + 1)
        yield from self.loader


def _processed(trainer) -> int:
    """The batches of the current epoch the trainer has finished."""
    return int(trainer.fit_loop.epoch_loop.batch_progress.current.processed)


class ShardDataModule(L.LightningDataModule):  # type: ignore[name-defined]
    """A ``lightning.LightningDataModule`` over fastdata shard sets.

    Args:
        train: the shard set to train on (a path or ``ShardSet``), or None.
        val: the shard set to validate on, or None.
        test: the shard set to test on, or None.
        batch_size: samples per batch on each rank.
        eval_batch_size: for validation and test (default: ``batch_size``).
        batch_transform: the training loader's batch transform (augmentation such as MixUp:
            never the evaluation loaders').
        sample_transform: the training loader's per-image hook.
        eval_batch_transform: the validation and test loaders' batch transform, if they need
            one (a random one warns: evaluation would change from run to run).
        eval_sample_transform: the validation and test loaders' per-image hook.
        **loader_args: any other ``fastdata.Loader`` argument (``size``, ``crop``, ``dtype``,
            ``backend``...), for every loader. ``rank``, ``world_size`` and ``device`` come
            from the trainer.

    Raises:
        ValueError: ``rank``, ``world_size``, ``device`` or ``train`` is given in
            ``loader_args``.
    """

    def __init__(self, train: str | os.PathLike | ShardSet | None = None,
                 val: str | os.PathLike | ShardSet | None = None,
                 test: str | os.PathLike | ShardSet | None = None, *, batch_size: int,
                 eval_batch_size: int | None = None, batch_transform: Callable | None = None,
                 sample_transform: Callable | None = None,
                 eval_batch_transform: Callable | None = None,
                 eval_sample_transform: Callable | None = None, **loader_args: Any):
        super().__init__()
        taken = sorted({"rank", "world_size", "device", "train"} & set(loader_args))
        if taken:
            raise ValueError(f"{', '.join(taken)}: set by the trainer and the split, not "
                             f"by ShardDataModule's arguments")
        self.paths = {"train": train, "val": val, "test": test}
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.loader_args = loader_args
        # augmentation reaches the training loader only: evaluation sees the images as stored
        self.hooks = {"train": dict(batch_transform=batch_transform,
                                    sample_transform=sample_transform),
                      "eval": dict(batch_transform=eval_batch_transform,
                                   sample_transform=eval_sample_transform)}
        self._loaders: dict = {}
        self._resume = None
        self._first = 0

    def _loader(self, split: str):
        import fastdata

        if self.paths[split] is None:
            raise ValueError(f"ShardDataModule has no {split} set: pass {split}=PATH")
        if split not in self._loaders:
            t = self.trainer
            self._loaders[split] = fastdata.Loader(
                self.paths[split], train=split == "train", rank=t.global_rank,
                world_size=t.world_size, device=t.strategy.root_device,
                batch_size=self.batch_size if split == "train" else self.eval_batch_size,
                **self.hooks["train" if split == "train" else "eval"], **self.loader_args)
        return self._loaders[split]

    def train_dataloader(self):
        """The training set's loader (shuffled, augmented), made once and kept."""
        return _Epochs(self._loader("train"), self)

    def val_dataloader(self):
        """The validation set's loader (in order, every sample once over the ranks)."""
        return self._loader("val")

    def test_dataloader(self):
        """The test set's loader (in order, every sample once over the ranks)."""
        return self._loader("test")

    def state_dict(self) -> dict:
        """The training loader's position: the batches the trainer has finished."""
        loader = self._loaders.get("train")
        if loader is None:
            return {}
        state = loader.state_dict()
        # Lightning fetches a batch ahead: the loader's own count is one too many
        state["order"] = loader.order.state_dict(_processed(self.trainer) - self._first)
        return {"train": state}

    def load_state_dict(self, state: dict) -> None:
        """Resume the training loader from ``state_dict()``'s position."""
        self._resume = state.get("train")

    def teardown(self, stage: str) -> None:
        """Close the loaders made for ``stage``."""
        for loader in self._loaders.values():
            loader.close()
        self._loaders.clear()
