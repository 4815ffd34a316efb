"""An earlier (version 3) detection set's boxes, their classes and instance masks, or
segmentation set's class maps: one file beside the shards (a later set holds them as its
field ``label``: ``fastdata.format``).

``annotations.bin`` is a sequence of ``.npy`` records (NumPy's format, no pickles). A detection
set's, in this order, ``N`` samples holding ``M`` boxes in all:

* ``offsets`` int64 ``(N + 1,)``: sample ``i``'s boxes are ``offsets[i]:offsets[i + 1]``;
* ``boxes`` float32 ``(M, 4)``: ``x0, y0, x1, y1`` as fractions of the stored square (0 to 1,
  the same for every stored size), ``x0 < x1``, ``y0 < y1``;
* ``classes`` int64 ``(M,)``: each box's index into the manifest's ``classes``;
* ``iscrowd`` uint8 ``(M,)``: 1 for a crowd region (COCO's ``iscrowd``), else 0;
* with masks, for each stored size ``S`` ascending: ``run_offsets`` int64 ``(M + 1,)`` and
  ``runs`` uint32: box ``j``'s mask at ``S x S``, row-major, as the lengths of alternating runs
  of 0 and 1 starting with 0 (``runs[run_offsets[j]:run_offsets[j + 1]]``, an even number of
  them, summing to ``S * S``);
* with keypoints (the manifest's entry has ``keypoints``: the ``keypoints`` field kind's
  parameters), ``keypoints`` float32 ``(M, K, 3)``: each box's points as that kind stores a
  sample's (``fastdata.fields.keypoints``).

A segmentation set's, for each stored size ``S`` ascending: ``run_offsets`` int64 ``(N + 1,)``,
``runs`` uint32 and ``values`` uint8: sample ``i``'s class map at ``S x S``, row-major, is
``values[a:b]`` repeated ``runs[a:b]`` times (``a, b = run_offsets[i], run_offsets[i + 1]``);
each value is a class index or ``IGNORE``.

The manifest's ``annotations`` entry holds the file's size and SHA-256 and whether it has masks.
The file is memory-mapped: the page cache holds one copy for every process that reads it.
"""
from __future__ import annotations

import hashlib
import io
import math
import mmap
import os
import stat

import numpy as np

from fastdata.fields import FieldError, field_of
from fastdata.fields.classmap import IGNORE
from fastdata.format import ANNOTATIONS, ShardFormatError


class _Records:
    """The ``.npy`` records of a buffer, each checked for its dtype and for fitting in the
    bytes left before it is viewed (a header cannot make it allocate)."""

    def __init__(self, data, path: str):
        self.data, self.pos, self.path = data, 0, path

    def take(self, name: str, dtype, ndim: int) -> np.ndarray:
        f = io.BytesIO(self.data[self.pos:self.pos + 65536])
        try:
            read = {(1, 0): np.lib.format.read_array_header_1_0,
                    (2, 0): np.lib.format.read_array_header_2_0}[np.lib.format.read_magic(f)]
            shape, fortran, got = read(f)
        except (ValueError, SyntaxError, TypeError, KeyError) as e:
            raise self.damaged(f"record {name}: {e}") from None
        count = math.prod(shape)            # Python's integers: a hostile shape cannot wrap
        start = self.pos + f.tell()
        if got != np.dtype(dtype) or fortran or len(shape) != ndim or \
                count * got.itemsize > len(self.data) - start:
            raise self.damaged(f"record {name} is not {ndim}-d {np.dtype(dtype)} in the bytes "
                               f"left")
        self.pos = start + count * got.itemsize
        return np.frombuffer(self.data, got, count, start).reshape(shape)

    def damaged(self, why: str) -> ShardFormatError:
        return ShardFormatError(f"{self.path}: damaged ({why}); convert again")


class Annotations:
    """A detection set's annotations (see the module's docstring), checked as they are opened.
    ``kind``: ``"detection"``.

    Raises:
        ShardFormatError: the file is missing, not what the manifest says, or inconsistent
            (boxes outside the square, classes out of range, masks of the wrong area...).
    """

    def __init__(self, root: str, entry: dict, *, num_samples: int, num_classes: int,
                 sizes: tuple[int, ...]):
        self.kind = "detection"
        self.path = path = os.path.join(root, ANNOTATIONS)
        self.has_masks = bool(entry["masks"])
        data = _mapped(path, entry)
        r = _Records(data, path)
        self.offsets = r.take("offsets", np.int64, 1)
        self.boxes = r.take("boxes", np.float32, 2)
        self.classes = r.take("classes", np.int64, 1)
        self.iscrowd = r.take("iscrowd", np.uint8, 1)
        self.runs: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._alternating = np.zeros(0, np.uint8)      # 0, 1, 0, 1...: the runs' values
        for size in sizes if self.has_masks else ():
            self.runs[size] = (r.take(f"run_offsets/{size}", np.int64, 1),
                               r.take(f"runs/{size}", np.uint32, 1))
        #: the boxes' keypoints (``fastdata.fields.keypoints``) where the set has them
        self.keypoints_kind = self.keypoints = None
        if entry.get("keypoints") is not None:
            self.keypoints_kind = _keypoints_kind(entry["keypoints"], path)
            self.keypoints = r.take("keypoints", np.float32, 3)
        if r.pos != len(data):
            raise r.damaged(f"{len(data) - r.pos} bytes after its last record")
        problem = self._problem(num_samples, num_classes)
        if problem:
            raise r.damaged(problem)

    def _problem(self, n: int, classes: int) -> str | None:
        """What is inconsistent, or None."""
        o, m = self.offsets, len(self.boxes)
        if len(o) != n + 1 or o[0] != 0 or o[-1] != m or (np.diff(o) < 0).any():
            return f"offsets are not {n + 1} ascending positions from 0 to {m}"
        b = self.boxes
        if b.shape != (m, 4) or not np.isfinite(b).all() or (b < 0).any() or (b > 1).any() \
                or (b[:, 2] <= b[:, 0]).any() or (b[:, 3] <= b[:, 1]).any():
            return "boxes outside the square or empty"
        if len(self.classes) != m or (self.classes < 0).any() or (self.classes >= classes).any():
            return f"box classes not {m} indices below {classes}"
        if len(self.iscrowd) != m or (self.iscrowd > 1).any():
            return "iscrowd not 0 or 1 per box"
        if self.keypoints_kind is not None:
            k = len(self.keypoints_kind.names)
            try:
                if self.keypoints is None or self.keypoints.shape != (m, k, 3):
                    raise FieldError(f"not the {m} boxes' {k} points")
                self.keypoints_kind.from_bytes(self.keypoints.tobytes(), "keypoints")
            except FieldError as e:
                return f"keypoints: {e}"
        return self._masks_problem(m)

    def _masks_problem(self, m: int) -> str | None:
        """What is inconsistent in the masks of ``m`` boxes, or None."""
        for size, (starts, runs) in self.runs.items():
            d = np.diff(starts)
            if len(starts) != m + 1 or starts[0] != 0 or starts[-1] != len(runs) \
                    or (d < 2).any() or (d % 2).any():
                return f"masks at {size}: run offsets inconsistent"
            if m and (np.add.reduceat(runs.astype(np.int64), starts[:-1]) != size * size).any():
                return f"masks at {size}: a mask's runs do not cover {size}x{size}"
        return None

    def counts(self, indices) -> np.ndarray:
        """The number of boxes of each of ``indices``."""
        indices = np.asarray(indices)
        return self.offsets[indices + 1] - self.offsets[indices]

    def rows(self, indices) -> np.ndarray:
        """The box rows of ``indices``, sample after sample."""
        indices = np.asarray(indices, np.int64)
        counts = self.counts(indices)
        first = np.repeat(self.offsets[indices] - np.cumsum(counts) + counts, counts)
        return first + np.arange(counts.sum())

    def masks(self, index: int, size: int) -> np.ndarray:
        """Sample ``index``'s instance masks at ``size``: uint8 ``(k, size, size)``, 0 or 1."""
        starts, runs = self.runs[size]
        a, b = self.offsets[index], self.offsets[index + 1]
        r = runs[starts[a]:starts[b]]
        alternating = self._alternating     # one read: reader threads may grow it meanwhile
        if len(alternating) < len(r):
            alternating = self._alternating = (np.arange(2 * len(r)) & 1).astype(np.uint8)
        return np.repeat(alternating[:len(r)], r).reshape(b - a, size, size)

    def __getstate__(self):
        raise TypeError("Annotations are opened in the process that reads them")


def _keypoints_kind(params, path: str):
    """The keypoints a manifest's ``annotations`` entry describes, or a damaged entry."""
    try:
        return field_of("keypoints", **params)
    except (TypeError, ValueError) as e:
        raise ShardFormatError(f"{path}: the manifest's keypoints are not readable ({e})") \
            from None


class ClassMaps:
    """A segmentation set's class maps (see the module's docstring), checked as they are
    opened. ``kind``: ``"segmentation"``.

    Raises:
        ShardFormatError: the file is missing, not what the manifest says, or inconsistent
            (a map not covering its square, a value that is no class).
    """

    def __init__(self, root: str, entry: dict, *, num_samples: int, num_classes: int,
                 sizes: tuple[int, ...]):
        self.kind = "segmentation"
        self.path = path = os.path.join(root, ANNOTATIONS)
        data = _mapped(path, entry)
        r = _Records(data, path)
        self.maps: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {
            size: (r.take(f"run_offsets/{size}", np.int64, 1),
                   r.take(f"runs/{size}", np.uint32, 1), r.take(f"values/{size}", np.uint8, 1))
            for size in sizes}
        if r.pos != len(data):
            raise r.damaged(f"{len(data) - r.pos} bytes after its last record")
        for size, (starts, runs, values) in self.maps.items():
            problem = _maps_problem(size, starts, runs, values, num_samples, num_classes)
            if problem:
                raise r.damaged(problem)

    def class_map(self, index: int, size: int) -> np.ndarray:
        """Sample ``index``'s class map at ``size``: uint8 ``(size, size)``."""
        starts, runs, values = self.maps[size]
        a, b = starts[index], starts[index + 1]
        return np.repeat(values[a:b], runs[a:b]).reshape(size, size)

    def __getstate__(self):
        raise TypeError("ClassMaps are opened in the process that reads them")


def _maps_problem(size: int, starts, runs, values, n: int, classes: int) -> str | None:
    """What is inconsistent in the class maps of ``n`` samples at ``size``, or None."""
    if len(starts) != n + 1 or starts[0] != 0 or starts[-1] != len(runs) \
            or len(values) != len(runs) or (np.diff(starts) < 1).any():
        return f"class maps at {size}: run offsets inconsistent"
    if n and (np.add.reduceat(runs.astype(np.int64), starts[:-1]) != size * size).any():
        return f"class maps at {size}: a map's runs do not cover {size}x{size}"
    if ((values >= classes) & (values != IGNORE)).any():
        return f"class maps at {size}: a value that is neither a class below {classes} nor " \
               f"{IGNORE}"
    return None


def open_annotations(root: str, entry: dict, kind: str, **kw) -> Annotations | ClassMaps:
    """A set's ``Annotations`` (``kind`` "detection") or ``ClassMaps`` ("segmentation");
    ``kw``: ``num_samples``, ``num_classes``, ``sizes``."""
    return (Annotations if kind == "detection" else ClassMaps)(root, entry, **kw)


def _mapped(path: str, entry: dict):
    """The file's bytes, memory-mapped and checked against the manifest's size and SHA-256
    (a link or a special file refused)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        raise ShardFormatError(f"{path}: cannot open the set's annotations "
                               f"({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != entry["bytes"]:
            raise ShardFormatError(f"{path}: not the regular file of {entry['bytes']} bytes "
                                   f"the manifest names; convert again")
        data = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise ShardFormatError(f"{path}: damaged (its checksum is not the manifest's); convert "
                               f"again")
    return data
