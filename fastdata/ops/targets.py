"""A detection or segmentation batch's targets moved with its images, whether a set stores
them as its field ``label`` (moved by the ``boxes`` or ``classmap`` field kind:
``fastdata.fields``) or, at version 3, in ``annotations.bin``: boxes and instance masks through
the same crop, resize and flip as the pixels, for the whole batch at once (no per-box Python);
class maps by the ``classmap`` kind whichever way they are stored.

A box is clipped to the crop and kept where what is left is at least ``Targets.min_size``
output pixels wide and high (torchvision's ``SanitizeBoundingBoxes`` rule: by default 1) and
at least ``Targets.min_visible`` of its area is inside the crop (albumentations'
``min_visibility``: by default 0, any part). A mask is resampled nearest at the same pixel
centres as the image's resize (output pixel ``i`` of a crop of ``h`` stored pixels from ``top``
reads stored row ``top + floor((i + 0.5) * h / out)``).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from fastdata.fields.boxes import BoxesField, moved_boxes
from fastdata.fields.classmap import ClassMapField

TARGET_FORMATS = ("list", "padded")
#: how a segmentation set's class maps are moved and batched, whichever way they are stored
_CLASS_MAPS = ClassMapField()


@dataclasses.dataclass(frozen=True)
class Targets:
    """How a detection set's targets come out of a loader (``Loader(targets=...)``; a string
    there is ``form`` with the other defaults).

    Args:
        form: ``"list"``, a dict per image (torchvision's detection models' convention), or
            ``"padded"``, one dict of tensors padded to the batch's most boxes, with
            ``counts``.
        min_visible: the least fraction of a box's area that must stay inside the crop for it
            to be kept (0: any part of it).
        min_size: the least width and height, in output pixels, of a kept box's part inside
            the crop.

    Raises:
        ValueError: a form not in ``TARGET_FORMATS``, or a bound out of its range (named).
    """

    form: str = "list"
    min_visible: float = 0.0
    min_size: float = 1.0

    def __post_init__(self):
        if self.form not in TARGET_FORMATS:
            raise ValueError(f"targets form {self.form!r} is not valid; choose one of "
                             f"{', '.join(map(repr, TARGET_FORMATS))}")
        for name, hi in (("min_visible", 1.0), ("min_size", math.inf)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= hi:
                raise ValueError(f"{name}={v!r} is not valid; use a number in "
                                 f"[0, {hi:g}]" if hi < math.inf else
                                 f"{name}={v!r} is not valid; use a number of pixels >= 0")

    @classmethod
    def of(cls, value) -> Targets:
        """``value`` as ``Targets``: one already, or a form's name."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls(form=value)
        raise ValueError(f"targets={value!r} is not valid; give one of "
                         f"{', '.join(map(repr, TARGET_FORMATS))} or a fastdata.Targets")


def sample_grid(crop, out: int) -> tuple[np.ndarray, np.ndarray]:
    """The stored rows and columns that nearest resampling of a crop (top, left, h, w) to
    ``out`` pixels reads: the image's resize's pixel centres."""
    top, left, h, w = (int(v) for v in crop)
    centre = np.arange(out) + 0.5
    rows = top + np.minimum((centre * h / out).astype(np.int64), h - 1)
    cols = left + np.minimum((centre * w / out).astype(np.int64), w - 1)
    return rows, cols


def crop_targets(ann, indices, crops: torch.Tensor | None, flips, stored: int,
                 out: int, rule: Targets = Targets()) -> list[dict]:
    """The targets of the samples ``indices`` of a set whose ``Annotations`` are ``ann``, as
    their images are cropped (``crops``: (B, 4) top, left, h, w in stored pixels of side
    ``stored``; None: the whole square) to ``out`` pixels and flipped (``flips``); ``rule``:
    which boxes the crop leaves enough of to keep.

    Returns:
        Per image a dict: ``boxes`` float32 ``(K, 4)`` ``x0, y0, x1, y1`` in output pixels,
        ``labels`` int64 ``(K,)`` (the class index + 1: 0 is the background, as torchvision's
        detection models take them), ``iscrowd`` int64 ``(K,)`` and, where the set has
        masks, ``masks`` uint8 ``(K, out, out)``; where it has keypoints, ``keypoints``
        float32 ``(K, points, 3)``, x, y in output pixels and v (0: cut away or not
        labelled), the left/right points swapped by a flip (``fastdata.fields.keypoints``).
    """
    indices = np.asarray(indices, np.int64)
    b = len(indices)
    crop = (np.tile([0, 0, stored, stored], (b, 1)) if crops is None
            else np.asarray(crops, np.int64).reshape(b, 4))
    flip = np.zeros(b, bool) if flips is None else np.asarray(flips, bool)
    counts = ann.counts(indices)
    rows = ann.rows(indices)
    owner = np.repeat(np.arange(b), counts)
    boxes, keep = moved_boxes(ann.boxes[rows].astype(np.float64) * stored, crop[owner],
                              flip[owner], out, rule.min_size, rule.min_visible)
    ends = np.cumsum(counts)
    result = []
    for k in range(b):
        sel = slice(ends[k] - counts[k], ends[k])
        keep_k = keep[sel]
        target = {"boxes": torch.from_numpy(boxes[sel][keep_k]),
                  "labels": torch.from_numpy(ann.classes[rows[sel][keep_k]] + 1),
                  "iscrowd": torch.from_numpy(ann.iscrowd[rows[sel][keep_k]].astype(np.int64))}
        if ann.has_masks:
            target["masks"] = torch.from_numpy(_masks(ann, int(indices[k]), keep_k, crop[k],
                                                      bool(flip[k]), stored, out))
        if getattr(ann, "keypoints", None) is not None:     # a set of one's own may have none
            target["keypoints"] = torch.from_numpy(ann.keypoints_kind.move(
                ann.keypoints[rows[sel][keep_k]], crop[k], bool(flip[k]), stored, out))
        result.append(target)
    return result


def batch_targets(ds, indices, params, stored: int, crop: int | None, targets: Targets):
    """A batch of a detection or segmentation set ``ds``'s targets as the loader's ``targets``
    asks (a segmentation set's are its class maps whatever it asks): through ``params``, its
    crops and flips in stored pixels (``CropStage.params``), to ``crop`` pixels (None: the
    stored size); without ``params``, the stored squares as they are."""
    out = (crop or stored) if params is not None else stored
    ann = ds.annotations if ds.label_field is None else None
    m = moved(len(indices), params, stored, out)
    if ds.label_kind == "segmentation":     # class maps: the classmap kind moves them
        maps = ds.field_values("label", indices, m) if ann is None else _CLASS_MAPS.move_batch(
            [ann.class_map(i, stored) for i in np.asarray(indices).tolist()], *m)
        return _CLASS_MAPS.collate(maps).long()
    if ann is None:                         # boxes: the boxes kind moves them
        assert isinstance(ds.label_field, BoxesField)
        t = ds.label_field.move_batch(ds.field_values("label", indices), *m,
                                      min_size=targets.min_size,
                                      min_visible=targets.min_visible)
    else:
        t = crop_targets(ann, indices, m[0], m[1], stored, out, targets)
    return padded(t, out) if targets.form == "padded" else t


def moved(n: int, drawn, stored: int, out: int) -> tuple:
    """``ShardSet.field_values``' ``moved`` of a batch of ``n``: its crops and flips
    (``drawn``; None: the stored squares as they are, to ``stored`` pixels), to ``out``
    pixels."""
    if drawn is None:
        return np.tile([0, 0, stored, stored], (n, 1)), np.zeros(n, bool), stored, stored
    crops, flips = drawn
    return np.asarray(crops).reshape(n, 4), np.asarray(flips, bool).reshape(n), stored, out


def _masks(ann, index: int, keep: np.ndarray, crop, flip: bool, stored: int,
           out: int) -> np.ndarray:
    """Sample ``index``'s kept instance masks through its crop and flip: (K, out, out)."""
    if not keep.any():
        return np.zeros((0, out, out), np.uint8)
    m = ann.masks(index, stored)
    if not keep.all():
        m = m[keep]
    r, c = sample_grid(crop, out)
    if flip:
        c = c[::-1]
    # one gather of every output pixel's stored position, each mask's in one row
    at = (r[:, None] * stored + c).ravel()
    return np.take(m.reshape(len(m), -1), at, axis=1).reshape(len(m), out, out)


def padded(targets: list[dict], out: int) -> dict:
    """List targets as padded tensors: ``boxes`` (B, K, 4), ``labels`` and ``iscrowd``
    (B, K) with -1 where there is no box, ``counts`` (B,) and, with masks, ``masks``
    (B, K, out, out); K is the batch's most boxes in one image."""
    b = len(targets)
    counts = torch.tensor([len(t["labels"]) for t in targets], dtype=torch.int64)
    k = int(counts.max()) if b else 0
    result = {"boxes": torch.zeros((b, k, 4), dtype=torch.float32),
              "labels": torch.full((b, k), -1, dtype=torch.int64),
              "iscrowd": torch.full((b, k), -1, dtype=torch.int64), "counts": counts}
    if targets and "masks" in targets[0]:
        result["masks"] = torch.zeros((b, k, out, out), dtype=torch.uint8)
    if targets and "keypoints" in targets[0]:
        result["keypoints"] = torch.zeros((b, k, *targets[0]["keypoints"].shape[1:]))
    for i, t in enumerate(targets):
        n = len(t["labels"])
        for name in ("boxes", "labels", "iscrowd", "masks", "keypoints"):
            if name in result:
                result[name][i, :n] = t[name]
    return result


def map_tensors(fn, labels):
    """``fn`` applied to each tensor of a batch's labels: a tensor, or dicts, lists and tuples
    of them (detection targets, a batch's fields); anything else (a caption) as it is."""
    if torch.is_tensor(labels):
        return fn(labels)
    if isinstance(labels, dict):
        return {k: map_tensors(fn, v) for k, v in labels.items()}
    if isinstance(labels, (list, tuple)):
        return type(labels)(map_tensors(fn, v) for v in labels)
    return labels
