"""``boxes``: boxes per sample, each with a class where the field has classes (a grounding
set's phrases' regions, objects beside a caption), moved with the crop and mirrored by the flip.

A sample's value is float32 ``(n, 5)``: ``x0, y0, x1, y1`` as fractions of the stored square
(0 to 1, ``x0 < x1``, ``y0 < y1``) and the box's class index (-1 in a field without classes).
In a batch, each image's is a dict as torchvision's detection models take it (and as a
detection set's targets are): ``boxes`` float32 ``(k, 4)`` in output pixels, clipped to the
crop, those the crop leaves less than a pixel of dropped, and with classes ``labels`` int64
``(k,)``, the class index + 1 (0 is the background).

In a labels file or a source's column, a sample's cell is a JSON list of boxes, each
``[x0, y0, x1, y1]`` or ``{"box": [x0, y0, x1, y1], "label": "cat"}`` (fractions of the image);
the field's classes are the labels the column names, sorted.
"""
from __future__ import annotations

import json

import numpy as np

from fastdata.fields.base import (
    FieldError,
    FieldKind,
    check_bytes,
    class_names,
    records,
    register,
    spread,
)
from fastdata.fields.category import MAX_CLASSES
from fastdata.fields.cells import json_cell

#: the most boxes one sample may hold
MAX_BOXES = 1 << 16


@register
class BoxesField(FieldKind):
    """Boxes per sample.

    Args:
        classes: the boxes' class names, in index order; None: boxes without classes.

    Raises:
        ValueError: a name that is not a string, or the same name twice.
    """

    kind = "boxes"
    fixed = False
    moves = True

    def __init__(self, *, classes=None):
        self.classes = None if classes is None else class_names(classes)
        self._index = {c: k for k, c in enumerate(self.classes or ())}

    @classmethod
    def from_column(cls, cells) -> BoxesField:
        """With the labels the column's boxes name, sorted; without classes where none does.

        Raises:
            ValueError: more than ``MAX_CLASSES`` labels.
        """
        names: set[str] = set()
        for cell in map(json_cell, cells):
            for box in cell if isinstance(cell, list) else ():
                if isinstance(box, dict) and "label" in box:
                    names.add(str(box["label"]))
            if len(names) > MAX_CLASSES:
                raise ValueError(f"a boxes column naming more than {MAX_CLASSES:,} classes")
        return cls(classes=sorted(names) if names else None)

    def params(self) -> dict:
        return {} if self.classes is None else {"classes": self.classes}

    def parse(self, cell, where: str) -> np.ndarray:
        """A JSON list of boxes, each ``[x0, y0, x1, y1]`` or ``{"box": [...], "label":
        name}``, as fractions of the stored square."""
        if isinstance(cell, str):
            try:
                cell = json.loads(cell) if cell.strip() else []
            except ValueError:
                raise FieldError(f"{where}: {cell[:40]!r} is not a JSON list of boxes") from None
        if not isinstance(cell, list):
            raise FieldError(f"{where}: {str(cell)[:40]!r} is not a list of boxes")
        check_bytes(len(cell) * 20, where, MAX_BOXES * 20)
        rows = [self._box(b, where) for b in cell]
        return self._checked(np.asarray(rows, np.float32).reshape(-1, 5), where)

    def _box(self, box, where: str) -> list:
        label = None
        if isinstance(box, dict):
            box, label = box.get("box"), box.get("label")
        if not isinstance(box, list) or len(box) != 4 or \
                not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in box):
            raise FieldError(f"{where}: {str(box)[:40]!r} is not a box [x0, y0, x1, y1]")
        if self.classes is None:
            if label is not None:
                raise FieldError(f"{where}: a box labelled {str(label)[:40]!r} in a field "
                                 f"without classes")
            return [*box, -1]
        if label is None:
            raise FieldError(f"{where}: a box without a label, in a field whose boxes have "
                             f"{len(self.classes)} classes")
        k = self._index.get(str(label))
        if k is None:
            raise FieldError(f"{where}: a box's label {str(label)[:40]!r} is not one of the "
                             f"field's {len(self._index)} classes")
        return [*box, k]

    def _checked(self, a: np.ndarray, where: str) -> np.ndarray:
        b, k = a[:, :4], a[:, 4]
        if not np.isfinite(a).all() or (b < 0).any() or (b > 1).any() or \
                (b[:, 2] <= b[:, 0]).any() or (b[:, 3] <= b[:, 1]).any():
            raise FieldError(f"{where}: a box outside the image (fractions 0 to 1) or empty "
                             f"(x0 < x1 and y0 < y1)")
        valid = (k == -1) if self.classes is None else \
            (k >= 0) & (k < len(self.classes)) & (k == np.round(k))
        if not valid.all():
            raise FieldError(f"{where}: a box's class index is not one of the field's")
        return a

    def to_bytes(self, value: np.ndarray) -> bytes:
        return np.ascontiguousarray(value, np.float32).tobytes()

    def from_bytes(self, data: bytes, where: str) -> np.ndarray:
        check_bytes(len(data), where, MAX_BOXES * 20)
        if len(data) % 20:
            raise FieldError(f"{where}: {len(data)} bytes are not whole boxes")
        return self._checked(np.frombuffer(data, np.float32).reshape(-1, 5), where)

    def read(self, column, local) -> list[np.ndarray]:
        data, counts = records(column, local, 20, MAX_BOXES * 20)
        rows = self._checked(np.frombuffer(data, np.float32).reshape(-1, 5), "a value read")
        return np.split(rows, np.cumsum(counts)[:-1]) if len(counts) else []

    def move(self, value: np.ndarray, crop, flip: bool, stored: int, out: int) -> dict:
        """One image's boxes through its crop (top, left, h, w in stored pixels) to ``out``
        pixels and flip: the batch's dict (the module's docstring)."""
        return self.move_batch([value], [crop], [flip], stored, out)[0]

    def move_batch(self, values, crops, flips, stored: int, out: int) -> list[dict]:
        """``move`` of a batch's boxes, all at once."""
        import torch

        parts = [np.asarray(v, np.float32).reshape(-1, 5) for v in values]
        counts = [len(v) for v in parts]
        rows = np.concatenate(parts) if parts else np.zeros((0, 5), np.float32)
        owner = np.repeat(np.arange(len(parts)), counts)
        boxes, keep = moved_boxes(rows[:, :4].astype(np.float64) * stored,
                                  np.asarray(crops, np.float64).reshape(-1, 4)[owner],
                                  np.asarray(flips, bool).reshape(-1)[owner], out)
        kept = np.bincount(owner[keep], minlength=len(parts)).tolist()
        # one tensor of the batch's kept boxes, each image's a view of it
        boxes_of = torch.from_numpy(boxes[keep]).split(kept)
        if self.classes is None:
            return [{"boxes": b} for b in boxes_of]
        labels_of = torch.from_numpy(rows[keep, 4].astype(np.int64) + 1).split(kept)
        return [{"boxes": b, "labels": c} for b, c in zip(boxes_of, labels_of)]

    def collate(self, values):
        return list(values)

    def describe(self, column) -> str:
        classes = f"classes={len(self.classes)}" if self.classes else "no classes"
        return f"boxes ({classes}): {spread(column, 20, 'boxes')}"


def moved_boxes(xyxy: np.ndarray, crop: np.ndarray, flip: np.ndarray, out: int,
                min_size: float = 1.0, min_visible: float = 0.0
                ) -> tuple[np.ndarray, np.ndarray]:
    """Boxes ``(M, 4)`` in stored pixels, each with its image's crop (top, left, h, w) and
    flip, to ``out`` pixels.

    Returns:
        ``(boxes in output pixels, clipped to the crop, (M, 4) float32; kept (M,) bool)``: a
        box is kept where what the crop leaves of it is at least ``min_size`` pixels wide and
        high and at least ``min_visible`` of its area.
    """
    top, left, h, w = crop.T.astype(np.float64)
    sx, sy = out / w, out / h
    x0, x1 = (xyxy[:, 0] - left) * sx, (xyxy[:, 2] - left) * sx
    y0, y1 = (xyxy[:, 1] - top) * sy, (xyxy[:, 3] - top) * sy
    area = (x1 - x0) * (y1 - y0)
    x0, x1, y0, y1 = (np.clip(v, 0, out) for v in (x0, x1, y0, y1))
    cw, ch = x1 - x0, y1 - y0
    keep = (cw >= min_size) & (ch >= min_size) & (cw > 0) & (ch > 0) & (
        cw * ch >= min_visible * area)
    x0, x1 = np.where(flip, out - x1, x0), np.where(flip, out - x0, x1)
    return np.stack([x0, y0, x1, y1], 1).astype(np.float32), keep
