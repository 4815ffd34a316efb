"""``classmap``: a class per pixel (semantic segmentation), resampled nearest through the crop
and mirrored by the flip with its image.

A sample's value is uint8 ``(h, w)``: a class index a pixel (0-254), 255 where a pixel has no
class (``CrossEntropyLoss(ignore_index=255)`` skips them). A source's map covers the whole
picture, upright, at any resolution of the picture's shape (a half-resolution map is read as
it lies over the image); a stored one covers the stored square (``place``: what the fit kept
of the picture, at the map's density, a pad's borders 255). In a batch, the maps are one uint8
tensor ``(B, out, out)`` (``.long()`` it for ``CrossEntropyLoss``, on the device: an eighth of
the bytes to move), each output pixel the class at its centre as the image's resize samples
it.

A map's cell is a PNG of one 8-bit value a pixel (mode ``L``, or ``P`` whose palette indices
are the classes, as Pascal VOC's): a labels file's path to it (relative to the source folder),
or a WebDataset member's bytes (``--field seg.png=classmap``). A map is stored run-length
encoded: its height and width, then each run's length (uint32) and value (uint8). A batch
samples each map straight from its runs (``read_moved``: the C kernel ``sample_runs``, a map's
runs walked once), or, where the kernel is not built, decodes it and gathers.
"""
from __future__ import annotations

import io

import numpy as np

from fastdata.fields.base import (
    FieldError,
    FieldKind,
    check_bytes,
    class_names,
    register,
    spread,
)

#: a class map's value for pixels of no class (borders of ``fit="pad"``, and what the maps
#: leave unlabelled): ``CrossEntropyLoss(ignore_index=255)`` skips them
IGNORE = 255
#: the most pixels a map may hold (4096 x 4096): a PNG's header, or a stored map's runs, can
#: claim any size, and where the C kernel is not built a batch decodes its maps whole
MAX_MAP_PIXELS = 1 << 24


def encode_runs(m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A map (any shape, uint8) as its runs, row-major: ``(lengths uint32, values uint8)``."""
    flat = np.ascontiguousarray(m).ravel()
    starts = np.concatenate([[0], np.flatnonzero(flat[1:] != flat[:-1]) + 1])
    return np.diff(np.append(starts, flat.size)).astype(np.uint32), flat[starts]


def within_limit(m: np.ndarray) -> np.ndarray:
    """The map ``m``, or where it holds more than ``MAX_MAP_PIXELS``, the most of its shape
    that does, resampled nearest at pixel centres."""
    h, w = m.shape
    if h * w <= MAX_MAP_PIXELS:
        return m
    k = (MAX_MAP_PIXELS / (h * w)) ** 0.5
    oh, ow = max(1, int(h * k)), max(1, int(w * k))
    return m[((np.arange(oh) + 0.5) * h / oh).astype(np.int64)][
        :, ((np.arange(ow) + 0.5) * w / ow).astype(np.int64)]


@register
class ClassMapField(FieldKind):
    """A class per pixel.

    Args:
        classes: the class names, in index order: a stored value must then be one of their
            indices or ``IGNORE``; None (a field of one's own): any value is a class index.

    Raises:
        ValueError: classes that are not distinct names, or more than 255 of them.
    """

    kind = "classmap"
    fixed = False
    moves = True
    binary = True

    def __init__(self, *, classes=None):
        self.classes = None if classes is None else class_names(classes)
        if self.classes is not None and len(self.classes) > IGNORE:
            raise ValueError(f"a class map holds at most {IGNORE} classes (0-{IGNORE - 1}), "
                             f"not {len(self.classes)}")

    def params(self) -> dict:
        return {} if self.classes is None else {"classes": self.classes}

    def parse(self, cell, where: str) -> np.ndarray:
        """A PNG's bytes (a path to one is read by the source before it gets here), as the
        map's values."""
        if not isinstance(cell, (bytes, bytearray, memoryview)):
            raise FieldError(f"{where}: {str(cell)[:40]!r} is not a class map PNG")
        check_bytes(len(cell), where)
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(io.BytesIO(bytes(cell))) as img:
                if img.format != "PNG" or img.mode not in ("L", "P"):
                    raise FieldError(f"{where}: a {img.format} of mode {img.mode}, not a PNG of "
                                     f"one 8-bit value a pixel (mode L or P)")
                if img.width * img.height > MAX_MAP_PIXELS:
                    raise FieldError(f"{where}: a class map of {img.width}x{img.height} pixels, "
                                     f"more than {MAX_MAP_PIXELS:,}")
                value = np.asarray(img, np.uint8)
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
            if isinstance(e, FieldError):
                raise
            raise FieldError(f"{where}: not a readable PNG ({e})") from None
        self._check_classes(value, where)
        return value

    def _check_classes(self, values: np.ndarray, where: str) -> None:
        """Refuse a value that is neither one of the classes' indices nor ``IGNORE``."""
        if self.classes is not None and ((values >= len(self.classes)) & (values != IGNORE)).any():
            raise FieldError(f"{where}: a class map value that is neither a class below "
                             f"{len(self.classes)} nor {IGNORE}")

    def to_bytes(self, value: np.ndarray) -> bytes:
        lengths, values = encode_runs(np.asarray(value, np.uint8))
        head = np.array([*value.shape, len(lengths)], np.uint32)
        return head.tobytes() + lengths.tobytes() + values.tobytes()

    def from_bytes(self, data: bytes, where: str) -> np.ndarray:
        h, w, lengths, values = self._runs(data, 0, len(data), where)
        return np.repeat(values, lengths).reshape(h, w)

    def _runs(self, data, start: int, end: int, where: str) -> tuple:
        """The stored map at ``data[start:end]``, checked: ``(h, w, lengths, values)``.

        Raises:
            FieldError: runs that do not cover the map, or a value past the classes.
        """
        size = end - start
        check_bytes(size, where)
        if size < 12:
            raise FieldError(f"{where}: {size} bytes are not a class map")
        h, w, n = (int(v) for v in np.frombuffer(data, np.uint32, 3, start))
        if size != 12 + 5 * n or not 0 < h * w <= MAX_MAP_PIXELS or n > h * w:
            raise FieldError(f"{where}: a class map of {h}x{w} pixels in {n} runs does not "
                             f"fit its {size} bytes")
        lengths = np.frombuffer(data, np.uint32, n, start + 12)
        if not n or lengths.min() == 0 or int(lengths.sum(dtype=np.int64)) != h * w:
            raise FieldError(f"{where}: a class map whose runs do not cover its {h}x{w} pixels")
        values = np.frombuffer(data, np.uint8, n, start + 12 + 4 * n)
        self._check_classes(values, where)
        return h, w, lengths, values

    def place(self, value: np.ndarray, at) -> np.ndarray:
        """The map on the stored square (``FieldKind.place``), at the map's own density:
        what the fit cut away left out, what it padded ``IGNORE``."""
        sx, sy, ox, oy = at
        mh, mw = value.shape
        oh, ow = max(1, round(mh / sy)), max(1, round(mw / sx))
        shrink = min(1.0, (MAX_MAP_PIXELS / (oh * ow)) ** 0.5)
        oh, ow = max(1, int(oh * shrink)), max(1, int(ow * shrink))
        rows = np.floor(((np.arange(oh) + 0.5) / oh - oy) / sy * mh).astype(np.int64)
        cols = np.floor(((np.arange(ow) + 0.5) / ow - ox) / sx * mw).astype(np.int64)
        out = np.full((oh, ow), IGNORE, np.uint8)
        r, c = np.flatnonzero((rows >= 0) & (rows < mh)), np.flatnonzero((cols >= 0) &
                                                                          (cols < mw))
        out[np.ix_(r, c)] = value[np.ix_(rows[r], cols[c])]
        return out

    def move_batch(self, values, crops, flips, stored: int, out: int) -> list[np.ndarray]:
        """Each map through its image's crop (top, left, h, w in stored pixels of a square of
        side ``stored``) to ``out`` pixels and flip: output pixel ``i`` of a crop of ``h``
        stored pixels from ``top`` reads the class at stored position ``top + (i + .5) * h /
        out``, where the map lies over the square."""
        rows, cols = _grid([m.shape for m in values], crops, stored, out)
        # whole rows first, then columns: a third of the time of one 2-D gather
        return [m[r][:, c[::-1] if flip else c] for m, r, c, flip in zip(values, rows, cols,
                                                                           flips)]

    def read_moved(self, column, local, crops, flips, stored: int, out: int) -> list:
        """``move_batch`` of the stored maps, each sampled straight from its runs by the C
        kernel where it is built (no map decoded whole)."""
        from fastdata.kernels import cpu

        if not cpu.available():
            return super().read_moved(column, local, crops, flips, stored, out)
        o, v = column.offsets, np.ascontiguousarray(column.values)
        if o is None:
            raise FieldError("a classmap column without offsets")
        local = np.asarray(local, np.int64)
        heads, shapes = np.empty((len(local), 3), np.int64), []
        for k, i in enumerate(local.tolist()):
            h, w, lengths, _ = self._runs(v, int(o[i]), int(o[i + 1]), f"value {i}")
            heads[k] = int(o[i]) + 12, len(lengths), w
            shapes.append((h, w))
        rows, cols = _grid(shapes, crops, stored, out)
        result = np.empty((len(local), out, out), np.uint8)
        cpu.sample_runs(v, heads, rows, cols, np.asarray(flips, bool), result)
        return list(result)

    def collate(self, values):
        import torch

        if not len(values):
            return torch.zeros((0, 0, 0), dtype=torch.uint8)
        return torch.from_numpy(np.stack(values))

    def describe(self, column) -> str:
        return f"classmap: {spread(column, 1, 'bytes')} run-length encoded"


def _grid(shapes, crops, stored: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows and columns (int64 ``(B, out)``, ascending) of each map (``shapes``: their
    heights and widths across the square's ``stored`` pixels) that its crop's output pixels
    read: the cell holding stored position ``top + (i + .5) * h / out`` (multiplied first: a
    map of the stored size reads exactly the pixel the image's resize reads)."""
    centre = (np.arange(out) + 0.5) / out
    c = np.asarray(crops, np.float64).reshape(-1, 4)
    mh, mw = (np.array([s[k] for s in shapes], np.int64).reshape(-1, 1) for k in (0, 1))
    rows = np.clip(((c[:, :1] + centre * c[:, 2:3]) * mh / stored).astype(np.int64), 0, mh - 1)
    cols = np.clip(((c[:, 1:2] + centre * c[:, 3:4]) * mw / stored).astype(np.int64), 0, mw - 1)
    return rows, cols
