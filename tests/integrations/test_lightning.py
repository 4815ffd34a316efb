"""``fastdata.lightning.ShardDataModule`` under a real Lightning ``Trainer`` (CPU, gloo)."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest
import torch

from tests.helpers import REPO, N, ids_of

L = pytest.importorskip("lightning", reason="Lightning not installed (fastdata-shards[lightning])")

import fastdata  # noqa: E402
from fastdata.integrations.lightning import ShardDataModule  # noqa: E402

ARGS = dict(batch_size=4, size=16, dtype=torch.uint8, augment=False, num_workers=0, seed=3)


class Recorder(L.LightningModule):
    """A tiny model that records which samples each step saw (by pixel fingerprint)."""

    def __init__(self, ids: dict):
        super().__init__()
        self.net = torch.nn.Linear(3, 3)
        self.ids, self.seen = ids, {"train": [], "val": []}

    def _ids(self, x):
        nhwc = x.permute(0, 2, 3, 1).contiguous().numpy()
        return [self.ids[hashlib.md5(i.tobytes()).hexdigest()] for i in nhwc]

    def training_step(self, batch, i):
        x, y = batch
        self.seen["train"].append((self.current_epoch, self._ids(x)))
        return torch.nn.functional.cross_entropy(self.net(x.float().mean((2, 3))), y)

    def validation_step(self, batch, i):
        self.seen["val"].append((self.current_epoch, self._ids(batch[0])))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def trainer(**kw):
    return L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                     enable_model_summary=False, num_sanity_val_steps=0, log_every_n_steps=1,
                     **kw)


@pytest.mark.parametrize("stop", [N // 4 + 2, N // 4])   # mid-way through epoch 1; epoch 0's end
def test_epochs_eval_and_mid_epoch_resume_under_a_trainer(shards, tmp_path, stop):
    ids = ids_of(fastdata.open(shards["hdf5"]))
    path = shards["hdf5"]
    whole = Recorder(ids)
    trainer(max_epochs=2, enable_checkpointing=False).fit(
        whole, datamodule=ShardDataModule(path, path, **ARGS))
    epochs = [[b for e, b in whole.seen["train"] if e == k] for k in (0, 1)]
    assert [len(e) for e in epochs] == [N // 4] * 2             # full batches, the rest dropped
    assert all(len(set(sum(e, []))) == 4 * (N // 4) for e in epochs)
    assert epochs[0] != epochs[1]                                # set_epoch each epoch
    for k in (0, 1):                                             # eval: every sample, once
        assert sorted(sum([b for e, b in whole.seen["val"] if e == k], [])) == list(range(N))

    ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=stop,
                                               save_top_k=-1)
    first = Recorder(ids)
    trainer(max_steps=stop, callbacks=[ckpt]).fit(
        first, datamodule=ShardDataModule(path, path, **ARGS))
    (saved,) = [os.path.join(tmp_path, f) for f in os.listdir(tmp_path)]
    rest = Recorder(ids)
    trainer(max_epochs=2, enable_checkpointing=False).fit(
        rest, datamodule=ShardDataModule(path, path, **ARGS), ckpt_path=saved)
    assert first.seen["train"] + rest.seen["train"] == whole.seen["train"]


def test_loader_arguments_the_trainer_sets_are_refused(shards):
    with pytest.raises(ValueError, match="rank"):
        ShardDataModule(shards["hdf5"], batch_size=4, rank=1)


DDP_SCRIPT = """
import json, sys, torch, lightning as L
sys.path.insert(0, sys.argv[3])
import fastdata
from fastdata.integrations.lightning import ShardDataModule
from tests.integrations.test_lightning import ARGS, Recorder
from tests.helpers import ids_of

path, out = sys.argv[1], sys.argv[2]
model = Recorder(ids_of(fastdata.open(path)))
trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
                    enable_progress_bar=False, enable_model_summary=False,
                    enable_checkpointing=False, num_sanity_val_steps=0, log_every_n_steps=1)
dm = ShardDataModule(path, path, **ARGS)
trainer.fit(model, datamodule=dm)
with open(f"{out}/rank{trainer.global_rank}.json", "w") as f:
    json.dump({k: [b for _, b in v] for k, v in model.seen.items()}, f)
"""


def test_two_processes_split_training_and_evaluate_every_sample_once(shards, tmp_path):
    script = tmp_path / "fit.py"
    script.write_text(DDP_SCRIPT)
    root = REPO
    env = {**os.environ, "PYTHONPATH": root}
    subprocess.run([sys.executable, str(script), shards["hdf5"], str(tmp_path), root],
                   check=True, timeout=240, env=env, cwd=tmp_path)
    ranks = [json.load(open(tmp_path / f"rank{r}.json")) for r in (0, 1)]
    train = [sum(r["train"], []) for r in ranks]
    assert len(ranks[0]["train"]) == len(ranks[1]["train"]) == N // 2 // 4
    assert not set(train[0]) & set(train[1])
    assert sorted(sum((sum(r["val"], []) for r in ranks), [])) == list(range(N))


class LabelRecorder(L.LightningModule):
    """Records the labels' dtype and shape that each split's steps are given."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(3, 3)
        self.labels = {"train": set(), "val": set()}

    def training_step(self, batch, i):
        x, y = batch
        self.labels["train"].add((y.dtype, tuple(y.shape[1:])))
        return self.net(x.float().mean((2, 3))).sum()

    def validation_step(self, batch, i):
        self.labels["val"].add((batch[1].dtype, tuple(batch[1].shape[1:])))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_augmentation_reaches_the_training_loader_only(shards, recwarn):
    """A batch transform given to the DataModule (MixUp: soft targets) shapes the training
    batches, never the validation ones, and no evaluation loader warns about it."""
    from fastdata import transforms as T

    path = shards["hdf5"]
    args = {**ARGS, "dtype": torch.float32}
    model = LabelRecorder()
    trainer(max_epochs=1, enable_checkpointing=False).fit(model, datamodule=ShardDataModule(
        path, path, batch_transform=T.MixUp(1.0, num_classes=3), **args))
    assert model.labels == {"train": {(torch.float32, (3,))}, "val": {(torch.int64, ())}}
    assert not [w for w in recwarn if "evaluation loader" in str(w.message)]
    dm = ShardDataModule(path, path, eval_batch_transform=T.MixUp(1.0, num_classes=3), **args)
    with pytest.warns(UserWarning, match="evaluation loader"):
        trainer(max_epochs=1, enable_checkpointing=False).fit(LabelRecorder(), datamodule=dm)
