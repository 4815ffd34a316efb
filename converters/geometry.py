"""Where a label's coordinates land on the picture upright, through its EXIF orientation
(when the label was made on the picture as stored: ``frame``); and where a picture lies on
the stored square (``square_of``), for the fields that are placed on it."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

_EXIF_ORIENTATION = 0x0112

#: EXIF orientation → (x, y) in the stored frame (width W, height H) → upright, as the
#: transposes ``ImageOps.exif_transpose`` applies
_ORIENT = {2: lambda x, y, w, h: (w - x, y), 3: lambda x, y, w, h: (w - x, h - y),
           4: lambda x, y, w, h: (x, h - y), 5: lambda x, y, w, h: (y, x),
           6: lambda x, y, w, h: (h - y, x), 7: lambda x, y, w, h: (h - y, w - x),
           8: lambda x, y, w, h: (y, w - x)}


@dataclass(frozen=True)
class Frame:
    """How an annotation's coordinates reach the picture upright: the orientation to apply
    (1: none), then ``x / upright width``, ``y / upright height`` (fractions of the picture, as
    a moving field's values are given before the fit places them: ``placed``)."""
    orientation: int
    width: int              # of the annotations' frame
    height: int

    def points(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.orientation in _ORIENT:
            x, y = _ORIENT[self.orientation](x, y, self.width, self.height)
        w, h = (self.height, self.width) if self.orientation in (5, 6, 7, 8) else (
            self.width, self.height)
        return x / w, y / h


def frame(path: str, label_size: tuple[int, int]) -> Frame:
    """The frame of the labels of the image at ``path``, made on a picture of ``label_size``
    (width, height): the image upright, or as stored where only that matches.

    Raises:
        ValueError: the image's size, stored or upright, is not ``label_size``.
    """
    try:
        img = Image.open(path)
    except Image.DecompressionBombError as e:
        raise ValueError(f"refused as a decompression bomb ({e})") from None
    with img:
        raw = img.size
        orientation = img.getexif().get(_EXIF_ORIENTATION, 1) if img.format in (
            "JPEG", "PNG", "WEBP", "TIFF") else 1
    orientation = orientation if orientation in _ORIENT else 1
    upright = raw[::-1] if orientation in (5, 6, 7, 8) else raw
    if tuple(label_size) == upright:
        orientation = 1                 # labelled upright
    elif tuple(label_size) != raw:
        raise ValueError(f"its labels' size ({label_size[0]}x{label_size[1]}) is not the "
                         f"image's ({raw[0]}x{raw[1]})")
    return Frame(orientation, *label_size)


def _placement(shape: tuple[int, int], size: int, fit: str
               ) -> tuple[float, float, float, float]:
    """How ``fit_square`` places a picture of ``shape`` (width, height) on a square of side
    ``size``: ``(kx, ky, ox, oy)``, picture pixel ``(x, y)`` at square pixel ``(x * kx + ox,
    y * ky + oy)``."""
    w, h = shape
    if fit == "stretch":
        return size / w, size / h, 0.0, 0.0
    if fit == "crop":
        k = size / min(w, h)
        return k, k, -(w - min(w, h)) / 2 * k, -(h - min(w, h)) / 2 * k
    k = size / max(w, h)
    nw, nh = max(1, round(w * k)), max(1, round(h * k))
    return nw / w, nh / h, float((size - nw) // 2), float((size - nh) // 2)


def square_of(shape: tuple[int, int], size: int, fit: str) -> tuple[float, float, float, float]:
    """Where a picture of ``shape`` (width, height, upright) lies on the stored square of side
    ``size`` that ``fit`` makes of it (``fit_square``), in fractions of the square: the point
    at fractions ``(x, y)`` of the picture lands at ``(x * sx + ox, y * sy + oy)``.

    Returns:
        ``(sx, sy, ox, oy)``.
    """
    kx, ky, ox, oy = _placement(shape, size, fit)
    return kx * shape[0] / size, ky * shape[1] / size, ox / size, oy / size


def cut_away(path: str, fields: dict, given: tuple, stored: tuple, fit: str) -> list[dict]:
    """The note (a skipped entry of kind ``note``) on the sample at ``path`` where some of its
    instances (boxes) lay wholly outside the square that ``fit`` kept of its picture, so that
    ``placed`` dropped them: ``[]`` where none did."""
    lost = []
    for (name, kind), a, b in zip(fields.items(), given, stored):
        n = kind.instances(a) if kind.moves else None
        if n is not None and (kept := kind.instances(b)) < n:
            lost.append(f"field {name}: {n - kept} of its {n} boxes")
    return [{"path": path, "kind": "note", "reason": f"{'; '.join(lost)} lie outside the "
             f"square --fit {fit} keeps of the picture, so are not stored (--fit pad keeps "
             f"every box)"}] if lost else []


def placed(fields: dict, values: tuple, shape: tuple[int, int], opts) -> tuple:
    """A sample's field values as its shard stores them: those that move with the pixels
    (given over the whole picture) placed on the stored square as the fit placed the picture
    of ``shape`` (``FieldKind.place``), the others as they are; ``opts``: the conversion's
    ``DecodeOptions``."""
    if opts.fit == "stretch" or not any(kind.moves for kind in fields.values()):
        return values
    at = square_of(shape, opts.sizes[-1], opts.fit)
    return tuple(kind.place(v, at) if kind.moves else v for kind, v in zip(fields.values(),
                                                                          values))
