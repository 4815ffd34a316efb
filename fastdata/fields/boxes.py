"""``boxes``: boxes per sample, each with a class where the field has classes (a grounding
set's phrases' regions, objects beside a caption), moved with the crop and mirrored by the flip.

A sample's value is float32 ``(n, 5)``: ``x0, y0, x1, y1`` as fractions of the stored square
(0 to 1, ``x0 < x1``, ``y0 < y1``) and the box's class index (-1 in a field without classes);
then, where the field has ``crowd``, each box's crowd flag (COCO's ``iscrowd``: 0 or 1), and
where it has ``keypoints``, each box's ``K`` points ``x, y, v`` as the ``keypoints`` kind
stores an instance's (``fastdata.fields.keypoints``): ``(n, 5 + crowd + 3K)`` in all. In a
batch, each image's is a dict as torchvision's detection models take it (and as a detection
set's targets are): ``boxes`` float32 ``(k, 4)`` in output pixels, clipped to the crop, those
the crop leaves less than a pixel of dropped, and with classes ``labels`` int64 ``(k,)``, the
class index + 1 (0 is the background); with crowd flags ``iscrowd`` int64 ``(k,)``, with
keypoints ``keypoints`` float32 ``(k, K, 3)`` moved as that kind moves them.

In a labels file or a source's column, a sample's cell is a JSON list of boxes, each
``[x0, y0, x1, y1]`` or ``{"box": [x0, y0, x1, y1], "label": "cat", "iscrowd": 0,
"keypoints": ...}`` (fractions of the image; a box's ``keypoints`` as the ``keypoints`` kind
takes one instance); the field's classes are the labels the column names, sorted, and it has
crowd flags where a box gives ``iscrowd``.

**Instance masks**: where the column's boxes give ``"polygons"`` (COCO's polygon form: a list of
flat ``[x1, y1, x2, y2, ...]`` outlines, fractions of the image), the field has ``masks`` and
every box gives its own (an empty list: an empty mask). A value is then a dict ``{"boxes": (n,
5), "polygons": [[(k, 2) float32 outline, ...] per box]}`` (fractions of the stored square,
running on past it where the conversion's fit cut the picture); the outlines move with the
crop and flip like the boxes, and each kept box's mask is drawn at the output size (a pixel is
inside where its centre is, even-odd across an outline, any outline of the box): ``masks``
uint8 ``(k, out, out)`` beside ``boxes``, as torchvision's ``MaskRCNN`` takes them. Stored:
the box count, outline count and point count (uint32), the boxes' records, each box's outline
count, each outline's point count, then the points.
"""
from __future__ import annotations

import itertools
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
from fastdata.fields.keypoints import KeypointsField

#: the most boxes one sample may hold
MAX_BOXES = 1 << 16
#: how far beyond the stored square (in its sides) a stored outline's point may lie: where
#: the fit cut the picture, an outline runs on past the square's edge
MAX_BEYOND = 1024


@register
class BoxesField(FieldKind):
    """Boxes per sample.

    Args:
        classes: the boxes' class names, in index order; None: boxes without classes.
        masks: whether each box has an instance mask (its outlines; the module's docstring).
        crowd: whether each box has a crowd flag (COCO's ``iscrowd``).
        keypoints: the parameters of the ``keypoints`` kind whose instance each box holds
            (``KeypointsField``: its ``names``...); None: boxes without points.

    Raises:
        ValueError: a name that is not a string, the same name twice, ``masks`` or ``crowd``
            not a bool, or ``keypoints`` not the ``keypoints`` kind's parameters.
    """

    kind = "boxes"
    fixed = False
    moves = True

    def __init__(self, *, classes=None, masks: bool = False, crowd: bool = False,
                 keypoints: dict | None = None):
        self.classes = None if classes is None else class_names(classes)
        self._index = {c: k for k, c in enumerate(self.classes or ())}
        for name, v in (("masks", masks), ("crowd", crowd)):
            if not isinstance(v, bool):
                raise ValueError(f"{name}={v!r} is not valid; give True or False")
        self.masks, self.crowd = masks, crowd
        if keypoints is not None and not isinstance(keypoints, dict):
            raise ValueError(f"keypoints={keypoints!r} is not valid; give the keypoints "
                             f"kind's parameters ({{'names': [...]}}) or None")
        try:
            self.points = None if keypoints is None else KeypointsField(**keypoints)
        except TypeError as e:
            raise ValueError(f"keypoints={keypoints!r} is not valid ({e})") from None
        #: the floats of a box's record (the module's docstring)
        self.width = 5 + crowd + 3 * (len(self.points.names) if self.points else 0)

    @classmethod
    def from_column(cls, cells) -> BoxesField:
        """With the labels the column's boxes name, sorted; without classes where none does.

        Raises:
            ValueError: more than ``MAX_CLASSES`` labels.
        """
        names: set[str] = set()
        masks = crowd = False
        for cell in map(json_cell, cells):
            for box in cell if isinstance(cell, list) else ():
                if isinstance(box, dict):
                    if "label" in box:
                        names.add(str(box["label"]))
                    masks = masks or "polygons" in box
                    crowd = crowd or "iscrowd" in box
            if len(names) > MAX_CLASSES:
                raise ValueError(f"a boxes column naming more than {MAX_CLASSES:,} classes")
        return cls(classes=sorted(names) if names else None, masks=masks, crowd=crowd)

    def params(self) -> dict:
        out: dict = {} if self.classes is None else {"classes": self.classes}
        for name in ("masks", "crowd"):
            if getattr(self, name):
                out[name] = True
        return out if self.points is None else {**out, "keypoints": self.points.params()}

    def parse(self, cell, where: str) -> np.ndarray | dict:
        """A JSON list of boxes, each ``[x0, y0, x1, y1]`` or ``{"box": [...], "label":
        name, "polygons": [[x1, y1, ...], ...]}``, as fractions of the stored square."""
        if isinstance(cell, str):
            try:
                cell = json.loads(cell) if cell.strip() else []
            except ValueError:
                raise FieldError(f"{where}: {cell[:40]!r} is not a JSON list of boxes") from None
        if not isinstance(cell, list):
            raise FieldError(f"{where}: {str(cell)[:40]!r} is not a list of boxes")
        check_bytes(len(cell) * 4 * self.width, where, MAX_BOXES * 4 * self.width)
        rows = self._checked(np.asarray([self._box(b, where) for b in cell],
                                        np.float32).reshape(-1, self.width), where)
        if not self.masks:
            return rows
        polygons = [[_outline(p, where) for p in _polygons_of(b, where)] for b in cell]
        check_bytes(sum(p.nbytes for b in polygons for p in b), where)
        return {"boxes": rows, "polygons": polygons}

    def _box(self, box, where: str) -> list:
        """A cell's box as its record (``width`` floats)."""
        extra = dict(box) if isinstance(box, dict) else {}
        if "polygons" in extra and not self.masks:
            raise FieldError(f"{where}: a box with polygons in a field without masks")
        for name, have in (("iscrowd", self.crowd), ("keypoints", self.points is not None)):
            if name in extra and not have:
                raise FieldError(f"{where}: a box with {name} in a field without them")
        if isinstance(box, dict):
            box = box.get("box")
        if not isinstance(box, list) or len(box) != 4 or \
                not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in box):
            raise FieldError(f"{where}: {str(box)[:40]!r} is not a box [x0, y0, x1, y1]")
        row = [*box, self._class_of(extra.get("label"), where)]
        if self.crowd:
            row.append(extra.get("iscrowd", 0))
        if self.points is not None:
            points = extra.get("keypoints")
            row += [0.0] * (self.width - len(row)) if points is None else \
                self.points.parse([points], where).ravel().tolist()
        return row

    def _class_of(self, label, where: str) -> int:
        """A box's label as its class index (-1 in a field without classes)."""
        if self.classes is None:
            if label is not None:
                raise FieldError(f"{where}: a box labelled {str(label)[:40]!r} in a field "
                                 f"without classes")
            return -1
        if label is None:
            raise FieldError(f"{where}: a box without a label, in a field whose boxes have "
                             f"{len(self.classes)} classes")
        k = self._index.get(str(label))
        if k is None:
            raise FieldError(f"{where}: a box's label {str(label)[:40]!r} is not one of the "
                             f"field's {len(self._index)} classes")
        return k

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
        if self.crowd and not np.isin(a[:, 5], (0, 1)).all():
            raise FieldError(f"{where}: a box's crowd flag is not 0 or 1")
        if self.points is not None:
            self.points.check_points(self._points_of(a), where)
        return a

    def _points_of(self, rows: np.ndarray) -> np.ndarray:
        """The boxes' points ``(n, K, 3)`` of their records (a field with keypoints)."""
        assert self.points is not None
        return rows[:, 5 + self.crowd:].reshape(len(rows), len(self.points.names), 3)

    def to_bytes(self, value) -> bytes:
        if not self.masks:
            return np.ascontiguousarray(value, np.float32).tobytes()
        outlines = [p for b in value["polygons"] for p in b]
        head = [len(value["boxes"]), len(outlines), sum(len(p) for p in outlines)]
        parts = [np.array(head, np.uint32), np.ascontiguousarray(value["boxes"], np.float32),
                 np.array([len(b) for b in value["polygons"]], np.uint32),
                 np.array([len(p) for p in outlines], np.uint32), *outlines]
        return b"".join(np.ascontiguousarray(p).tobytes() for p in parts)

    def from_bytes(self, data: bytes, where: str) -> np.ndarray | dict:
        if self.masks:
            return self._with_masks(data, where)
        per = 4 * self.width
        check_bytes(len(data), where, MAX_BOXES * per)
        if len(data) % per:
            raise FieldError(f"{where}: {len(data)} bytes are not whole boxes")
        return self._checked(np.frombuffer(data, np.float32).reshape(-1, self.width), where)

    def _with_masks(self, data: bytes, where: str) -> dict:
        """A stored value of a field with masks (the module's docstring), checked."""
        check_bytes(len(data), where)
        n, p, q = (int(v) for v in np.frombuffer(data[:12].ljust(12, b"\0"), np.uint32))
        per = 4 * self.width
        if len(data) != 12 + (per + 4) * n + 4 * p + 8 * q or n > MAX_BOXES:
            raise FieldError(f"{where}: {len(data)} bytes are not {n} boxes with {p} outlines "
                             f"of {q} points")
        rows = self._checked(np.frombuffer(data, np.float32, self.width * n, 12).reshape(
            n, self.width), where)
        counts = np.frombuffer(data, np.uint32, n + p, 12 + per * n).tolist()
        per_box, points = counts[:n], counts[n:]
        if sum(per_box) != p or sum(points) != q or min(points, default=3) < 3:
            raise FieldError(f"{where}: its outlines' counts do not add up (or one has fewer "
                             f"than 3 points)")
        xy = np.frombuffer(data, np.float32, 2 * q, 12 + (per + 4) * n + 4 * p).reshape(q, 2)
        if not (np.abs(xy) <= MAX_BEYOND).all():        # NaN compares false
            raise FieldError(f"{where}: an outline's point that is not a finite fraction of "
                             f"the square, within {MAX_BEYOND} of it")
        ends = list(itertools.accumulate(points))
        outlines = [xy[e - c:e] for c, e in zip(points, ends)]
        ends = list(itertools.accumulate(per_box))
        return {"boxes": rows, "polygons": [outlines[e - c:e] for c, e in zip(per_box, ends)]}

    def read(self, column, local) -> list:
        if self.masks:
            return list(super().read(column, local))
        per = 4 * self.width
        data, counts = records(column, local, per, MAX_BOXES * per)
        rows = self._checked(np.frombuffer(data, np.float32).reshape(-1, self.width),
                             "a value read")
        return np.split(rows, np.cumsum(counts)[:-1]) if len(counts) else []

    def instances(self, value) -> int:
        return len(value["boxes"] if self.masks else value)

    def place(self, value, at):
        """The boxes on the stored square (``FieldKind.place``): clipped to it, those left
        without area dropped; their outlines moved as they are (a mask is drawn inside the
        square only), their points as the ``keypoints`` kind places them."""
        sx, sy, ox, oy = at
        rows = np.array(value["boxes"] if self.masks else value, np.float32).reshape(
            -1, self.width)
        rows[:, [0, 2]] = np.clip(rows[:, [0, 2]] * sx + ox, 0, 1)
        rows[:, [1, 3]] = np.clip(rows[:, [1, 3]] * sy + oy, 0, 1)
        if self.points is not None:
            rows[:, 5 + self.crowd:] = self.points.place(self._points_of(rows), at).reshape(
                rows[:, 5 + self.crowd:].shape)
        keep = (rows[:, 2] > rows[:, 0]) & (rows[:, 3] > rows[:, 1])
        if not self.masks:
            return rows[keep]
        shift = np.array([ox, oy], np.float32)
        scale = np.array([sx, sy], np.float32)
        return {"boxes": rows[keep], "polygons": [[xy * scale + shift for xy in b] for b, k in
                                                  zip(value["polygons"], keep) if k]}

    def move(self, value, crop, flip: bool, stored: int, out: int) -> dict:
        """One image's boxes through its crop (top, left, h, w in stored pixels) to ``out``
        pixels and flip: the batch's dict (the module's docstring)."""
        return self.move_batch([value], [crop], [flip], stored, out)[0]

    def move_batch(self, values, crops, flips, stored: int, out: int, *,
                   min_size: float = 1.0, min_visible: float = 0.0) -> list[dict]:
        """``move`` of a batch's boxes, all at once (and with masks, each kept box's mask
        drawn); a box is kept where the crop leaves ``min_size`` output pixels of its width
        and height and ``min_visible`` of its area (``fastdata.Targets``)."""
        import torch

        parts = [np.asarray(v["boxes"] if self.masks else v, np.float32).reshape(
            -1, self.width) for v in values]
        counts = [len(v) for v in parts]
        rows = np.concatenate(parts) if parts else np.zeros((0, self.width), np.float32)
        owner = np.repeat(np.arange(len(parts)), counts)
        crops = np.asarray(crops, np.float64).reshape(-1, 4)
        flips = np.asarray(flips, bool).reshape(-1)
        boxes, keep = moved_boxes(rows[:, :4].astype(np.float64) * stored, crops[owner],
                                  flips[owner], out, min_size, min_visible)
        kept = np.bincount(owner[keep], minlength=len(parts)).tolist()
        # one tensor of the batch's kept boxes, each image's a view of it
        result: list[dict] = [{"boxes": b} for b in torch.from_numpy(boxes[keep]).split(kept)]
        columns = {"labels": rows[keep, 4].astype(np.int64) + 1 if self.classes else None,
                   "iscrowd": rows[keep, 5].astype(np.int64) if self.crowd else None}
        for name, column in columns.items():
            for r, c in zip(result, () if column is None else torch.from_numpy(column).split(
                    kept)):
                r[name] = c
        if self.masks:      # the batch's kept boxes' masks in one array, each image's a view
            polygons = [b for v in values for b in v["polygons"]]
            at = np.flatnonzero(keep)
            masks = _masks([polygons[k] for k in at.tolist()], crops[owner[at]],
                           flips[owner[at]], stored, out)
            for r, m in zip(result, torch.from_numpy(masks).split(kept)):
                r["masks"] = m
        if self.points is not None:     # each kept box's points, through its image's crop
            points = np.split(self._points_of(rows[keep]), np.cumsum(kept)[:-1])
            for r, p in zip(result, self.points.move_batch(points, crops, flips, stored, out)):
                r["keypoints"] = torch.from_numpy(p)
        return result

    def collate(self, values):
        return list(values)

    def describe(self, column) -> str:
        what = ", ".join([f"classes={len(self.classes)}" if self.classes else "no classes"]
                         + ["masks"] * self.masks + ["crowd flags"] * self.crowd
                         + ([f"points={len(self.points.names)}"] if self.points else []))
        if not self.masks:
            return f"boxes ({what}): {spread(column, 4 * self.width, 'boxes')}"
        return f"boxes ({what}): {spread(column, 1, 'bytes')}"


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


def _polygons_of(box, where: str) -> list:
    """A box's outlines as its cell gives them (a field with masks needs them)."""
    polygons = box.get("polygons") if isinstance(box, dict) else None
    if not isinstance(polygons, list):
        raise FieldError(f"{where}: a box without its polygons (a list of [x1, y1, x2, y2, "
                         f"...] outlines), in a field whose boxes have masks")
    return polygons


def _outline(flat, where: str) -> np.ndarray:
    """An outline ``[x1, y1, x2, y2, ...]`` (fractions of the image) as ``(k, 2)``."""
    if not isinstance(flat, list) or len(flat) < 6 or len(flat) % 2 or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in flat):
        raise FieldError(f"{where}: {str(flat)[:40]!r} is not an outline [x1, y1, x2, y2, "
                         f"...] of at least 3 points")
    xy = np.asarray(flat, np.float32).reshape(-1, 2)
    if not np.isfinite(xy).all() or (xy < 0).any() or (xy > 1).any():
        raise FieldError(f"{where}: an outline's point outside the image (fractions 0 to 1)")
    return xy


def _masks(polygons: list, crops: np.ndarray, flips: np.ndarray, stored: int,
           out: int) -> np.ndarray:
    """Each box's outlines (fractions of the stored square) through its image's crop (``(k,
    4)``: top, left, h, w in stored pixels) and flip (``(k,)``), drawn at ``out`` pixels:
    ``(k, out, out)`` uint8 (by the C kernel where it was built, else ``draw``)."""
    from fastdata.kernels import cpu  # with torch: at load time, never in a conversion

    masks = np.zeros((len(polygons), out, out), np.uint8)
    outlines = [xy for b in polygons for xy in b]
    if not outlines:
        return masks
    lengths = [len(p) for p in outlines]
    owner = np.repeat(np.arange(len(polygons)), [len(b) for b in polygons])
    box = np.repeat(owner, lengths)                  # each point's box
    top, left, h, w = np.asarray(crops, np.float64)[box].T
    xy = np.concatenate(outlines).astype(np.float64)
    xy[:, 0] = (xy[:, 0] * stored - left) * (out / w)
    xy[:, 1] = (xy[:, 1] * stored - top) * (out / h)
    xy[:, 0] = np.where(np.asarray(flips, bool)[box], out - xy[:, 0], xy[:, 0])
    starts = np.cumsum([0] + lengths)
    if cpu.available():
        cpu.fill_outlines(xy, starts, owner, masks)
        return masks
    for k, a, b in zip(owner.tolist(), starts[:-1].tolist(), starts[1:].tolist()):
        draw(masks[k], xy[a:b, 0], xy[a:b, 1])
    return masks


def draw(mask: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
    """An outline (its points' ``x``, ``y`` in the mask's pixels) drawn into ``mask`` (uint8,
    square): 1 where a pixel's centre is inside (even-odd), the rest left as it is; a centre on
    the outline is inside on one side of it only, so abutting outlines share no pixel. Only
    the outline's bounding box is touched."""
    out = mask.shape[1]
    x0, y0 = np.asarray(x, np.float64), np.asarray(y, np.float64)
    x1, y1 = np.concatenate((x0[1:], x0[:1])), np.concatenate((y0[1:], y0[:1]))
    lo = max(int(np.floor(x0.min() - 0.5)), 0)
    hi = min(int(np.ceil(x0.max() + 0.5)), out)
    if hi <= lo:
        return
    # each column's centre line: where the edges cross it (scanned down the columns, so that
    # the running parity below runs along contiguous rows)
    xc = np.arange(lo, hi)[:, None] + 0.5
    cols, edges = np.nonzero(((x0 <= xc) & (xc < x1)) | ((x1 <= xc) & (xc < x0)))
    if not len(cols):
        return
    a, b = y0[edges], x0[edges]
    at = a + (xc[cols, 0] - b) * (y1[edges] - a) / (x1[edges] - b)   # a crossing: x1 != x0
    # a crossing at y toggles every pixel of its column whose centre is below it
    rows = np.clip(np.floor(at + 0.5), 0, out).astype(np.int64)
    top, bottom = int(rows.min()), int(rows.max())
    if bottom == top:
        return
    width = hi - lo
    toggles = np.bincount((rows - top) * width + cols, minlength=(bottom - top + 1) * width)
    # past the lowest crossing every column has crossed an even number of times: outside
    inside = np.bitwise_xor.accumulate((toggles & 1).astype(np.uint8).reshape(-1, width)[:-1],
                                       axis=0)
    mask[top:bottom, lo:hi] |= inside
