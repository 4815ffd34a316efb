"""Where a label's coordinates land in the stored square: through the picture's EXIF
orientation (when the label was made on the picture as stored) and the fit to the square
(``fit_square``), for boxes (points) and for instance masks (nearest, at the pixel centres
the pixels are resampled at); and where a picture lies on the square (``square_of``), for the
fields that are placed on it."""
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
    """How an annotation's coordinates reach the stored square of side ``size``: the
    orientation to apply (1: none), then ``x * kx + ox``, ``y * ky + oy`` (upright pixels →
    square pixels, as ``fit_square`` places them)."""
    orientation: int
    width: int              # of the annotations' frame
    height: int
    kx: float
    ky: float
    ox: float
    oy: float
    size: int

    def points(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.orientation in _ORIENT:
            x, y = _ORIENT[self.orientation](x, y, self.width, self.height)
        return x * self.kx + self.ox, y * self.ky + self.oy

    def sources(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        """For the square of side ``size``: the annotation frame's column (x) that each of
        its rows reads, and the row (y) that each of its columns reads, where the orientation
        swaps the axes; else the row each square row reads and the column each square column
        reads (nearest, at pixel centres, as the pixels are resampled; -1 off the picture)."""
        k = self.size / size
        centre = (np.arange(size) + 0.5) * k
        up_w, up_h = (self.height, self.width) if self.orientation in (5, 6, 7, 8) else (
            self.width, self.height)
        xu = np.floor((centre - self.ox) / self.kx).astype(np.int64)    # upright column
        yu = np.floor((centre - self.oy) / self.ky).astype(np.int64)    # upright row
        xu[(xu < 0) | (xu >= up_w)] = -1
        yu[(yu < 0) | (yu >= up_h)] = -1
        w, h = self.width, self.height          # upright index → the stored frame's
        flip = lambda v, n: np.where(v >= 0, n - 1 - v, -1)  # noqa: E731
        o = self.orientation
        rows, cols = {1: (yu, xu), 2: (yu, flip(xu, w)), 3: (flip(yu, h), flip(xu, w)),
                      4: (flip(yu, h), xu), 5: (yu, xu), 6: (yu, flip(xu, h)),
                      7: (flip(yu, w), flip(xu, h)), 8: (flip(yu, w), xu)}[o]
        return rows, cols

    def mask(self, columns: tuple[int, np.ndarray], sizes) -> dict[int, np.ndarray]:
        """A mask (``_mask_columns``: its first column and its columns) at each of
        ``sizes``, resampled nearest as the pixels are fitted."""
        first, cols = columns
        out = {}
        for size in sizes:
            a, b = self.sources(size)
            if self.orientation in (5, 6, 7, 8):    # square rows read stored columns
                square = _pick(cols, a - first, b)
            else:
                square = _pick(cols, b - first, a).T
            out[size] = square
        return out


def _pick(columns: np.ndarray, along: np.ndarray, across: np.ndarray) -> np.ndarray:
    """``columns[along[i], across[j]]`` as an array, 0 where either index is off them."""
    out = np.zeros((len(along), len(across)), np.uint8)
    i = np.flatnonzero((along >= 0) & (along < len(columns)))
    j = np.flatnonzero(across >= 0)
    if len(i) and len(j):
        out[np.ix_(i, j)] = columns[along[i]][:, across[j]]
    return out


def frame(path: str, label_size: tuple[int, int], size: int, fit: str) -> Frame:
    """The frame of the labels of the image at ``path``, made on a picture of ``label_size``
    (width, height): the image upright, or as stored where only that matches; the square's
    side ``size``, and the conversion's ``fit``.

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
    return Frame(orientation, *label_size, *_placement(upright, size, fit), size)


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
