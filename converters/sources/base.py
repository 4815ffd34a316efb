"""The source interface: ``Source`` (what a conversion reads: its samples in a documented
order, their labels and fields, where each image's bytes are) and the name->class registry
``SOURCES``; ``Images``, where a scan's images are when they are not files under SRC; what a
decode worker is handed for one image (a path, a ``Span`` of a file, bytes, or an
``Unreadable`` with its reason)."""
from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import ClassVar

import numpy as np

from fastdata.checks import choice
from fastdata.converters.decode import Span, Unreadable
from fastdata.converters.scan import Scan
from fastdata.converters.sources.pieces import Piece

__all__ = ["SOURCES", "Images", "Indexed", "Source", "Span", "Unreadable", "register",
           "source_for"]

#: source kind -> its class (``register``)
SOURCES: dict[str, type[Source]] = {}


def register(cls: type[Source]) -> type[Source]:
    """Class decorator: ``cls`` is the source kind named ``cls.kind``."""
    SOURCES[cls.kind] = cls
    return cls


class Images:
    """Where a scan's images are, by sample position, when they are not files under the
    source folder: what a decode worker is handed for each (a path, a ``Span``, the bytes, or
    an ``Unreadable``). Picklable: ``part`` is what a task on another machine reads."""

    def items(self, first: int, end: int) -> Iterator:
        """What a decode worker is handed for the samples ``first`` to ``end - 1``, in
        order."""
        raise NotImplementedError

    def part(self, first: int, end: int) -> Images:
        """Those of samples ``first`` to ``end - 1`` alone (their positions from 0)."""
        raise NotImplementedError

    def take(self, order: np.ndarray) -> Images:
        """These images in the order ``order`` (positions) gives."""
        raise NotImplementedError

    def digest(self) -> bytes:
        """What a conversion's fingerprint takes of them: each file's name, size and
        version, and where each image is in them."""
        raise NotImplementedError


class Indexed(Images):
    """Images at places in a source's pieces: sample ``k`` is in ``pieces[piece[k]]`` at
    ``(a[k], b[k])`` (a byte offset and size, a row group and row: the subclass's own).
    Subclasses give ``read``: what runs of samples in one piece are handed as."""

    @property
    def random_access(self) -> bool:
        """Whether the images can be read in any order (``take``: a shuffled conversion)."""
        return True

    def __init__(self, pieces: list[Piece], piece: np.ndarray, a: np.ndarray, b: np.ndarray):
        self.pieces = pieces
        self.piece, self.a, self.b = (np.asarray(piece, np.int32), np.asarray(a, np.int64),
                                      np.asarray(b, np.int64))

    def __len__(self) -> int:
        return len(self.piece)

    def _like(self, piece, a, b) -> Indexed:
        out = object.__new__(type(self))
        out.__dict__.update(self.__dict__)
        out.piece, out.a, out.b = piece, a, b
        return out

    def part(self, first: int, end: int) -> Indexed:
        return self._like(self.piece[first:end], self.a[first:end], self.b[first:end])

    def take(self, order: np.ndarray) -> Indexed:
        return self._like(self.piece[order], self.a[order], self.b[order])

    def digest(self) -> bytes:
        h = hashlib.sha256(repr([(p.name, p.size, p.version) for p in self.pieces]).encode())
        for arr in (self.piece, self.a, self.b):
            h.update(arr.tobytes())
        return h.digest()

    def items(self, first: int, end: int) -> Iterator:
        k = first
        while k < end:      # runs of samples in one piece
            stop = k + 1
            while stop < end and self.piece[stop] == self.piece[k]:
                stop += 1
            yield from self.read(self.pieces[int(self.piece[k])], self.a[k:stop],
                                 self.b[k:stop])
            k = stop

    def read(self, piece: Piece, a: np.ndarray, b: np.ndarray) -> Iterator:
        """What the samples at ``(a, b)`` of ``piece`` are handed as, in order."""
        raise NotImplementedError


class Source:
    """Where a conversion's samples come from. A subclass sets ``kind`` (its name in
    ``SOURCES`` and ``--source``), ``takes`` (the options it reads beyond SRC) and
    ``claims`` (whether a SRC is one of its kind, for SRC given without ``--source``), and
    gives ``scan``.

    Args:
        src: the source: a folder, a file, a pattern of files or a URL.
        options: the options ``takes`` names (``labels``, ``coco``, ``masks``, ``fields``,
            ``split``, ``image_column``); those it does not take must be None.

    Raises:
        ValueError: an option this kind of source does not take (naming the kinds that do).
    """

    kind: ClassVar[str] = ""
    takes: ClassVar[tuple[str, ...]] = ()
    #: what SRC is, for messages and ``--help``
    described: ClassVar[str] = ""

    def __init__(self, src: str, **options: object):
        self.src = src
        for name, value in options.items():
            if value is not None and name not in self.takes:
                takers = [k for k, c in SOURCES.items() if name in c.takes]
                raise ValueError(f"{name}={value!r} is for {' and '.join(takers) or 'no'} "
                                 f"sources, not a {self.kind} source ({self.described})")
        self.options = {k: options.get(k) for k in self.takes}

    @classmethod
    def claims(cls, src: str) -> bool:
        """Whether ``src`` looks like a source of this kind."""
        return False

    def scan(self, *, progress: bool) -> Scan:
        """The samples, in this source's order: their keys, labels, fields and images.

        Raises:
            ConversionError: no sample in it.
            ValueError: what is not a source of this kind (naming what is wrong).
        """
        raise NotImplementedError


#: the kinds tried, in order, for a SRC without ``--source`` and without a labels file,
#: COCO file or class maps (which choose ``labels``, ``coco``, ``masks``); else ``folder``
DETECTED = ("hf", "webdataset", "parquet")


def source_for(src: str, kind: str | None = None, **options) -> Source:
    """The source ``src`` is: of ``kind`` (a name in ``SOURCES``), else the kind its
    options (``labels``, ``coco``, ``masks``) or its look (``DETECTED``) say.

    Raises:
        ValueError: an unknown kind (naming the kinds), or an option the source does not
            take.
    """
    if kind is None:
        given = [n for n in ("labels", "coco", "masks") if options.get(n) is not None]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)} exclude each other: a set has one kind "
                             f"of label")
        kind = given[0] if given else next(
            (k for k in DETECTED if SOURCES[k].claims(src)), "folder")
    return SOURCES[choice("source", kind, sorted(SOURCES))](src, **options)
