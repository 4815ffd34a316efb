"""Training on detection and segmentation sets: TrainStep and fit hand a detection set's targets
to a model that returns its losses (the built-in TinyDetector; torchvision's Faster R-CNN
where torchvision imports), and a segmentation set's class maps to a per-pixel loss."""
from __future__ import annotations

import os

import pytest
import torch

import fastdata
from fastdata.cli import main as cli
from fastdata.converters.convert import convert
from fastdata.train import TrainStep, build_model, fit
from fastdata.train.step import loss_for
from tests.helpers import detection_folder


@pytest.fixture(scope="module")
def det_set(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dettrain")
    src, ann = detection_folder(tmp / "src", n=16, maps=True)
    convert(src, str(tmp / "set"), sizes=[64], coco=ann, num_workers=1, progress=False)
    convert(src, str(tmp / "seg"), sizes=[64], masks=f"{src}-maps", num_workers=1, progress=False)
    return str(tmp / "set")


def test_fit_trains_a_detector_that_returns_its_losses(det_set, tmp_path):
    torch.manual_seed(0)
    loader = fastdata.Loader(det_set, batch_size=8, device="cpu", num_workers=0, seed=0,
                             scale=(0.5, 1.0))
    model = build_model("tiny_detector", len(loader.dataset.classes))
    step = TrainStep(model, torch.optim.Adam(model.parameters(), lr=3e-3))
    hist = fit(step, loader, epochs=12, checkpoint_dir=str(tmp_path / "ck"), progress=False,
               log_every=0)
    assert len(hist) == 12 and hist[-1]["loss"] < 0.7 * hist[0]["loss"]
    model.eval()
    images, _ = next(iter(fastdata.Loader(det_set, batch_size=4, train=False, device="cpu",
                                          num_workers=0)))
    out = model(images)
    assert len(out) == 4 and out[0]["boxes"].shape == (10, 4)
    again = fit(TrainStep(model, torch.optim.Adam(model.parameters(), lr=3e-3)), loader, epochs=12,
                checkpoint_dir=str(tmp_path / "ck"), progress=False, log_every=0)
    assert again == []          # resumed from its checkpoint: nothing left to train


def test_train_command_on_a_detection_set(det_set, capsys, caplog):
    assert cli(["-q", "train", det_set, "--model", "tiny_detector", "--epochs", "1",
                "--batch-size", "4", "--device", "cpu", "--optimizer", "adamw",
                "--lr", "0.001"]) == 0
    assert "trained tiny_detector" in capsys.readouterr().out
    assert cli(["-q", "train", det_set, "--model", "tiny_detector", "--auto-augment",
                "ta_wide", "--epochs", "1", "--device", "cpu"]) != 0
    assert "moves pixels" in caplog.text


def test_torchvision_faster_rcnn_takes_the_targets(det_set):
    detection = pytest.importorskip("torchvision.models.detection")
    loader = fastdata.Loader(det_set, batch_size=2, device="cpu", num_workers=0)
    model = detection.fasterrcnn_mobilenet_v3_large_fpn(
        weights=None, weights_backbone=None, num_classes=len(loader.dataset.classes) + 1,
        min_size=64, max_size=64)
    step = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.01))
    images, targets = next(iter(loader))
    assert torch.isfinite(step(images, targets))


def test_fit_trains_and_scores_a_segmenter(det_set):
    seg = os.path.join(os.path.dirname(det_set), "seg")
    torch.manual_seed(0)
    loader = fastdata.Loader(seg, batch_size=8, device="cpu", num_workers=0, crop=32)
    val = fastdata.Loader(seg, batch_size=8, train=False, device="cpu", num_workers=0, crop=32)
    model = build_model("tiny_segmenter", len(loader.dataset.classes))
    step = TrainStep(model, torch.optim.Adam(model.parameters(), lr=1e-2),
                     loss_fn=loss_for("segmentation"))
    hist = fit(step, loader, epochs=15, eval_loader=val, progress=False, log_every=0)
    assert hist[-1]["loss"] < 0.6 * hist[0]["loss"]
    assert hist[-1]["val_acc"] > 0.8        # of the labelled pixels; the background is ~half
