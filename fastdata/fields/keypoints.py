"""``keypoints``: named points per instance (a person's joints), moved with the crop and
mirrored by the flip with their left/right pairs swapped, as torchvision's and detectron2's
keypoint conventions have it.

A sample's value is float32 ``(n, K, 3)``: ``n`` instances of the field's ``K`` named points,
each ``x, y`` as fractions of the stored square (0 to 1, the same at every stored size; the
point at the centre of stored pixel ``(c, r)`` of an ``S`` square is ``((c + .5) / S,
(r + .5) / S)``) and ``v``: 0 not labelled (or cut away), 1 labelled but hidden, 2 visible
(COCO's). In a batch, each image's are ``(n, K, 3)`` in output pixels (torchvision's
``KeypointRCNN`` targets' ``keypoints``); a point the crop cuts away gets ``v = 0``.

In a labels file or a source's column, a sample's cell is a JSON list of instances, each an
object of named points (``{"nose": [x, y, v], "left_eye": [x, y]}``: ``v`` 2 where not given,
a point not named is not labelled) or a list of the field's ``K`` points; the names, in the
order the column first names them, are the field's.
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
from fastdata.fields.cells import json_cell

#: name prefixes of mirrored points (``left_eye`` <-> ``right_eye``), as COCO names them
MIRRORED = (("left_", "right_"), ("l_", "r_"))
#: the most points one sample may hold (instances times names)
MAX_POINTS = 1 << 20
#: the most names a field's points may have
MAX_NAMES = 1024


@register
class KeypointsField(FieldKind):
    """Named points per instance.

    Args:
        names: the points' names, in their order (COCO's category ``keypoints``).
        flip_pairs: pairs of names a horizontal flip swaps (default: each ``left_*`` with its
            ``right_*``, and ``l_*`` with ``r_*``).
        skeleton: pairs of names joined when drawn (COCO's ``skeleton``, kept for users).

    Raises:
        ValueError: no names, a name twice, or a pair naming a point that is not one.
    """

    kind = "keypoints"
    fixed = False
    moves = True

    def __init__(self, *, names, flip_pairs=None, skeleton=None):
        self.names = class_names(names)
        self._index = index = {n: k for k, n in enumerate(self.names)}
        pairs = _mirrored(self.names) if flip_pairs is None else flip_pairs
        self.flip_pairs = _pairs("flip_pairs", pairs, index)
        self.skeleton = _pairs("skeleton", skeleton or [], index)
        self.flip_order = np.arange(len(self.names))
        for a, b in self.flip_pairs:
            self.flip_order[index[a]], self.flip_order[index[b]] = index[b], index[a]

    @classmethod
    def from_column(cls, cells) -> KeypointsField:
        """The points the column's instances name, in the order it first names them.

        Raises:
            ValueError: no instance names its points (a list of lists cannot say which is
                which).
        """
        names: dict[str, None] = {}
        for cell in map(json_cell, cells):
            for instance in [cell] if isinstance(cell, dict) else \
                    cell if isinstance(cell, list) else ():
                if isinstance(instance, dict):
                    names.update(dict.fromkeys(map(str, instance)))
                    if len(names) > MAX_NAMES:
                        raise ValueError(f"a keypoints column naming more than {MAX_NAMES} "
                                         f"points")
        if not names:
            raise ValueError('a keypoints column names its points: give each instance as an '
                             'object, e.g. [{"nose": [0.5, 0.4, 2], "left_eye": [0.45, 0.35]}]')
        return cls(names=list(names))

    def params(self) -> dict:
        out: dict = {"names": self.names, "flip_pairs": [list(p) for p in self.flip_pairs]}
        return {**out, "skeleton": [list(p) for p in self.skeleton]} if self.skeleton else out

    def parse(self, cell, where: str) -> np.ndarray:
        """A JSON list of instances, each an object of named points or ``K`` points
        ``[x, y, v]`` (or COCO's flat ``[x1, y1, v1, x2, ...]``), ``x, y`` as fractions of the
        stored square."""
        if isinstance(cell, str):
            try:
                cell = json.loads(cell) if cell.strip() else []
            except ValueError:
                raise FieldError(f"{where}: {cell[:40]!r} is not a JSON list of "
                                 f"instances") from None
        if isinstance(cell, dict):
            cell = [cell]
        if isinstance(cell, list):
            cell = [self._named(i, where) if isinstance(i, dict) else i for i in cell]
        try:
            a = np.asarray(cell, np.float64).reshape(-1, len(self.names), 3)
        except (TypeError, ValueError):
            raise FieldError(f"{where}: not instances of {len(self.names)} points [x, y, v] "
                             f"each") from None
        check_bytes(a.size * 4, where, MAX_POINTS * 12)
        return self.check_points(a.astype(np.float32), where)

    def _named(self, instance: dict, where: str) -> list:
        """An instance of named points as the field's ``K`` points (those not named: 0, 0,
        0)."""
        points = [[0.0, 0.0, 0.0] for _ in self.names]
        for name, p in instance.items():
            k = self._index.get(name)
            if k is None:
                raise FieldError(f"{where}: {str(name)[:40]!r} is not one of the field's "
                                 f"points ({', '.join(self.names)})")
            if not isinstance(p, list) or len(p) not in (2, 3):
                raise FieldError(f"{where}: point {name!r} is not [x, y] or [x, y, v]")
            points[k] = [*p, 2] if len(p) == 2 else p
        return points

    def check_points(self, a: np.ndarray, where: str) -> np.ndarray:
        """``a`` (``(..., K, 3)``), checked: finite ``x, y``; ``v`` 0, 1 or 2."""
        if not np.isfinite(a).all() or not np.isin(a[..., 2], (0, 1, 2)).all():
            raise FieldError(f"{where}: keypoints whose x, y are not finite or whose v is not "
                             f"0, 1 or 2")
        return a

    def to_bytes(self, value: np.ndarray) -> bytes:
        return np.ascontiguousarray(value, np.float32).tobytes()

    def from_bytes(self, data: bytes, where: str) -> np.ndarray:
        check_bytes(len(data), where, MAX_POINTS * 12)
        per = len(self.names) * 12
        if len(data) % per:
            raise FieldError(f"{where}: {len(data)} bytes are not whole instances of "
                             f"{len(self.names)} points")
        return self.check_points(np.frombuffer(data, np.float32).reshape(
            -1, len(self.names), 3), where)

    def read(self, column, local) -> list[np.ndarray]:
        k = len(self.names)
        data, counts = records(column, local, 12 * k, MAX_POINTS * 12)
        points = self.check_points(np.frombuffer(data, np.float32).reshape(-1, k, 3),
                                   "a value read")
        return np.split(points, np.cumsum(counts)[:-1]) if len(counts) else []

    def place(self, value: np.ndarray, at) -> np.ndarray:
        """The points on the stored square (``FieldKind.place``); one off it becomes
        ``[0, 0, 0]``, not labelled."""
        sx, sy, ox, oy = at
        p = np.array(value, np.float32)
        p[..., 0] = p[..., 0] * sx + ox
        p[..., 1] = p[..., 1] * sy + oy
        p[(p[..., 0] < 0) | (p[..., 0] >= 1) | (p[..., 1] < 0) | (p[..., 1] >= 1)] = 0
        return p

    def describe(self, column) -> str:
        per = 12 * len(self.names)
        return f"keypoints (points={len(self.names)}): {spread(column, per, 'instances')}"

    def collate(self, values):
        import torch

        return [torch.from_numpy(np.array(v, np.float32)) for v in values]

    def move(self, points: np.ndarray, crop, flip: bool, stored: int, out: int) -> np.ndarray:
        """One image's points ``(n, K, 3)`` (fractions of the stored square of side
        ``stored``) through its crop (top, left, h, w in stored pixels) to ``out`` pixels and
        flip, as its pixels and boxes are moved; points the crop cuts away get ``v = 0``, and a
        flip swaps the mirrored names."""
        return self.move_batch([points], [crop], [flip], stored, out)[0]

    def move_batch(self, values, crops, flips, stored: int, out: int) -> list[np.ndarray]:
        """``move`` of a batch's points, all at once."""
        k = len(self.names)
        parts = [np.asarray(v, np.float64).reshape(-1, k, 3) for v in values]
        if not parts:
            return []
        counts = [len(v) for v in parts]
        p = np.concatenate(parts)
        owner = np.repeat(np.arange(len(parts)), counts)
        top, left, h, w = np.asarray(crops, np.float64).reshape(-1, 4)[owner].T[..., None]
        flip = np.asarray(flips, bool).reshape(-1)[owner]
        p[..., 0] = (p[..., 0] * stored - left) * out / w
        p[..., 1] = (p[..., 1] * stored - top) * out / h
        p[flip, :, 0] = out - p[flip, :, 0]
        p[flip] = p[flip][:, self.flip_order]
        inside = (p[..., 0] >= 0) & (p[..., 0] < out) & (p[..., 1] >= 0) & (p[..., 1] < out)
        p[..., 2] = np.where(inside, p[..., 2], 0)
        return np.split(p.astype(np.float32), np.cumsum(counts)[:-1])

def _mirrored(names: list[str]) -> list[tuple[str, str]]:
    """The pairs ``left_x`` / ``right_x`` (``l_x`` / ``r_x``) among ``names``."""
    have = set(names)
    return [(n, right + n[len(left):]) for n in names for left, right in MIRRORED
            if n.startswith(left) and right + n[len(left):] in have]


def _pairs(what: str, pairs, index: dict) -> list[tuple[str, str]]:
    """``pairs`` checked to be pairs of the field's names (each used once, for a flip)."""
    try:
        out = [(str(a), str(b)) for a, b in pairs]
    except (TypeError, ValueError):
        raise ValueError(f"{what}={pairs!r} is not a list of pairs of names") from None
    if not all(a in index and b in index and a != b for a, b in out):
        raise ValueError(f"{what}={pairs!r} names a point that is not one of the field's "
                         f"({', '.join(index)})")
    flat = [n for p in out for n in p]
    if what == "flip_pairs" and len(set(flat)) != len(flat):
        raise ValueError(f"flip_pairs={pairs!r} names a point in two pairs")
    return out
