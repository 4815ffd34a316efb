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
from fastdata.converters.spill import BLOCK, Spilled, blocks_of, select

__all__ = ["SOURCES", "Images", "Indexed", "Places", "Source", "Span", "Unreadable",
           "register", "source_for"]

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


class Places(Spilled):
    """Where each sample's image is in a source's pieces: a record ``(piece, a, b)`` a sample
    (a byte offset and size, a row group and row: the source's own), in a temporary file."""

    def __init__(self):
        super().__init__(np.int64, (3,))

    def kept(self, rows) -> Spilled:
        """The places of the samples ``rows`` (ascending; None: all)."""
        return self if rows is None else select(self, rows)


class Indexed(Images):
    """Images at places in a source's pieces: sample ``k`` is in ``pieces[piece]`` at ``(a,
    b)``, its record in ``places`` (a ``Spilled`` of ``(piece, a, b)``, read a block at a
    time; an array for a task's part). Subclasses give ``read``: what runs of samples in one
    piece are handed as."""

    def __init__(self, pieces: list[Piece], places):
        self.pieces, self.places = pieces, places

    def __len__(self) -> int:
        return len(self.places)

    @property
    def random_access(self) -> bool:
        """Whether the images can be read in any order (``take``: a shuffled conversion)."""
        return True

    def _records(self, a: int, b: int) -> np.ndarray:
        if isinstance(self.places, np.ndarray):
            return self.places[a:b]
        return self.places.block(a, b)

    def _like(self, places) -> Indexed:
        out = object.__new__(type(self))
        out.__dict__.update(self.__dict__)
        out.places = places
        return out

    def part(self, first: int, end: int) -> Indexed:
        return self._like(np.array(self._records(first, end)))

    def take(self, order: np.ndarray) -> Indexed:
        out = Spilled(np.int64, (3,))
        for positions in blocks_of(order):
            out.append(np.concatenate([self._records(p, p + 1) for p in positions.tolist()])
                       if len(positions) else np.zeros((0, 3), np.int64))
        return self._like(out)

    def digest(self) -> bytes:
        h = hashlib.sha256(repr([(p.name, p.size, p.version) for p in self.pieces]).encode())
        for a in range(0, len(self), BLOCK):
            h.update(np.ascontiguousarray(self._records(a, a + BLOCK), np.int64).tobytes())
        return h.digest()

    def items(self, first: int, end: int) -> Iterator:
        for a in range(first, end, BLOCK):
            records = self._records(a, min(end, a + BLOCK))
            k = 0
            while k < len(records):      # runs of samples in one piece
                stop = k + 1
                while stop < len(records) and records[stop, 0] == records[k, 0]:
                    stop += 1
                yield from self.read(self.pieces[int(records[k, 0])], records[k:stop, 1],
                                     records[k:stop, 2])
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
        workers: the processes a scan may use (the conversion's ``num_workers``).
        options: the options ``takes`` names (``labels``, ``coco``, ``masks``, ``fields``,
            ``split``, ``image_column``); those it does not take must be None.

    Raises:
        ValueError: an option this kind of source does not take (naming the kinds that do).
    """

    kind: ClassVar[str] = ""
    takes: ClassVar[tuple[str, ...]] = ()
    #: what SRC is, for messages and ``--help``
    described: ClassVar[str] = ""

    def __init__(self, src: str, *, workers: int = 1, **options: object):
        self.src, self.workers = src, workers
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


def source_for(src: str, kind: str | None = None, *, workers: int = 1, **options) -> Source:
    """The source ``src`` is: of ``kind`` (a name in ``SOURCES``), else the kind its
    options (``labels``, ``coco``, ``masks``) or its look (``DETECTED``) say; ``workers``: the
    processes its scan may use.

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
    return SOURCES[choice("source", kind, sorted(SOURCES))](src, workers=workers, **options)
