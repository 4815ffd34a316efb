"""Models by name: small built-in ResNets (no torchvision needed), torchvision architectures
when torchvision is installed, or any ``module:callable`` returning an ``nn.Module``.

``build_model(name, num_classes)``; the callable form is called with ``num_classes=``.
"""
from __future__ import annotations

import importlib

import torch
from torch import nn


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 convolutions and a shortcut."""
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.short = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        """(B, cin, H, W) → (B, cout, H / stride, W / stride)."""
        y = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(y)) + self.short(x))


class SmallResNet(nn.Module):
    """A compact ResNet for small images: stem, ``len(blocks)`` stages (stride 2 after the
    first), global average pool, linear head."""

    def __init__(self, num_classes: int, *, width: int = 32, blocks=(1, 1, 1)):
        super().__init__()
        layers = [nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width),
                  nn.ReLU(inplace=True)]
        cin = width
        for i, n in enumerate(blocks):
            cout = width * 2 ** i
            for j in range(n):
                layers.append(BasicBlock(cin, cout, 2 if (i > 0 and j == 0) else 1))
                cin = cout
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(cin, num_classes)

    def forward(self, x):
        """(B, 3, H, W) images → (B, num_classes) logits."""
        x = self.features(x)
        return self.head(x.mean((2, 3)))


class TinyDetector(nn.Module):
    """A one-stage detector small enough for tests and examples (CenterNet's idea on a stride
    4 grid): per cell, a logit per class that an object of it is centred there, and the box's
    width and height in output pixels. Takes a detection set's targets as torchvision's
    detection models do: ``model(images, targets)`` in training returns a dict of losses;
    ``model(images)`` in evaluation returns, per image, ``boxes``, ``labels`` and ``scores``
    of its ``top`` most confident cells."""

    def __init__(self, num_classes: int, *, width: int = 16, top: int = 10):
        super().__init__()
        self.num_classes, self.top, self.stride = num_classes, top, 4
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, 2, 1), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, 2, 1), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, 1, 1), nn.ReLU(inplace=True))
        self.head = nn.Conv2d(width, num_classes + 2, 1)

    def forward(self, images, targets=None):
        """``images`` (B, 3, H, W); ``targets``: a list of dicts (``boxes`` x0, y0, x1, y1,
        ``labels`` from 1) in training."""
        out = self.head(self.features(images))
        logits, sizes = out[:, :self.num_classes], out[:, self.num_classes:]
        if self.training:
            if targets is None:
                raise ValueError("in training, TinyDetector takes (images, targets)")
            return self._losses(logits, sizes, targets)
        return self._detections(logits, sizes)

    def _losses(self, logits, sizes, targets) -> dict:
        b, c, h, w = logits.shape
        boxes = torch.cat([t["boxes"] for t in targets]).float()
        labels = torch.cat([t["labels"] for t in targets]) - 1
        owner = torch.repeat_interleave(torch.arange(b, device=logits.device),
                                        torch.tensor([len(t["boxes"]) for t in targets],
                                                     device=logits.device))
        centre = (boxes[:, :2] + boxes[:, 2:]) / 2 / self.stride
        x = centre[:, 0].long().clamp(0, w - 1)
        y = centre[:, 1].long().clamp(0, h - 1)
        heat = torch.zeros_like(logits)
        heat[owner, labels, y, x] = 1.0
        loss_cls = nn.functional.binary_cross_entropy_with_logits(logits, heat)
        wh = (boxes[:, 2:] - boxes[:, :2]).clamp(min=1).log()
        pred = sizes[owner, :, y, x]
        loss_box = nn.functional.l1_loss(pred, wh) if len(boxes) else sizes.sum() * 0
        return {"loss_cls": loss_cls, "loss_box": loss_box}

    def _detections(self, logits, sizes) -> list[dict]:
        b, c, h, w = logits.shape
        scores, where = logits.sigmoid().flatten(1).topk(min(self.top, c * h * w), 1)
        labels, cell = where // (h * w), where % (h * w)
        y, x = cell // w, cell % w
        wh = sizes.flatten(2).gather(2, cell[:, None].expand(b, 2, -1)).exp()
        cx, cy = (x + 0.5) * self.stride, (y + 0.5) * self.stride
        boxes = torch.stack([cx - wh[:, 0] / 2, cy - wh[:, 1] / 2, cx + wh[:, 0] / 2,
                             cy + wh[:, 1] / 2], 2)
        return [{"boxes": boxes[i], "labels": labels[i] + 1, "scores": scores[i]}
                for i in range(b)]


class TinySegmenter(nn.Module):
    """A small fully convolutional net for segmentation sets: per pixel, a logit per class,
    ``(B, num_classes, H, W)`` from ``(B, 3, H, W)`` (a stride 4 encoder, upsampled)."""

    def __init__(self, num_classes: int, *, width: int = 16):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, 2, 1), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, 2, 1), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, 1, 1), nn.ReLU(inplace=True))
        self.head = nn.Conv2d(width, num_classes, 1)

    def forward(self, x):
        """(B, 3, H, W) images → (B, num_classes, H, W) logits."""
        y = self.head(self.features(x))
        return nn.functional.interpolate(y, size=x.shape[-2:], mode="bilinear",
                                         align_corners=False)


BUILTIN = {
    "tiny": lambda n: SmallResNet(n, width=8, blocks=(1,)),
    "resnet8": lambda n: SmallResNet(n, width=16, blocks=(1, 1, 1)),
    "resnet14": lambda n: SmallResNet(n, width=32, blocks=(2, 2, 2)),
    "tiny_detector": lambda n: TinyDetector(n),
    "tiny_segmenter": lambda n: TinySegmenter(n),
}


#: the largest crop ``fastdata train`` feeds the built-in models by default: they keep the
#: full resolution in their first stage, so their cost grows with the crop's area
BUILTIN_CROP = 64
#: the same for other models (torchvision's are made for 224 px)
OTHER_CROP = 224


def default_crop(name: str, size: int) -> int:
    """The crop to train model ``name`` at from images stored at ``size`` px, where none is
    given: at most ``BUILTIN_CROP`` for a built-in model, ``OTHER_CROP`` for any other."""
    return min(size, BUILTIN_CROP if name in BUILTIN else OTHER_CROP)


def build_model(name: str, num_classes: int) -> nn.Module:
    """A model for ``num_classes`` classes by name.

    Args:
        name: a built-in (``tiny``, ``resnet8``, ``resnet14``: small ResNets for small images;
            ``tiny_detector``: ``TinyDetector``, for detection sets; ``tiny_segmenter``:
            ``TinySegmenter``, for segmentation sets),
            a torchvision model name where torchvision imports, or ``module:callable`` (called
            with ``num_classes=``).
        num_classes: the size of the model's output.

    Raises:
        ValueError: an unknown name, or a callable that cannot be loaded or called (named).
    """
    if name in BUILTIN:
        return BUILTIN[name](num_classes)
    if ":" in name:
        module, fn = name.split(":", 1)
        try:
            make = getattr(importlib.import_module(module), fn)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"model={name!r}: cannot load {fn!r} from module {module!r} ({e}); "
                             f"is the module on PYTHONPATH?") from None
        try:
            model = make(num_classes=num_classes)
        except TypeError as e:
            raise ValueError(f"model={name!r}: {fn}(num_classes={num_classes}) failed ({e}); "
                             f"the callable must accept num_classes=") from e
        if not isinstance(model, nn.Module):
            raise ValueError(f"model={name!r} returned {type(model).__name__}, not an nn.Module")
        return model
    try:
        import torchvision.models as tvm
    except Exception as e:              # not installed, or not importable beside this torch
        raise ValueError(f"model={name!r} is not built in ({', '.join(BUILTIN)}) and "
                         f"torchvision is not usable ({e}); install torchvision or pass "
                         f"'module:callable'") from None
    if name not in tvm.list_models(module=tvm):
        raise ValueError(f"model={name!r} is not valid; choose one of {', '.join(BUILTIN)}, "
                         f"a torchvision model name, or 'module:callable'")
    return tvm.get_model(name, num_classes=num_classes)
