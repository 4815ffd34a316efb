"""WebDataset tars (``--source webdataset``): a ``.tar`` (or ``.tar.gz``, ``.tgz``), a folder
of them, or a pattern such as ``shard-{000000..000127}.tar``, on disk or in a store.

Members are grouped into samples by key, as WebDataset groups them: a member's key is its
path up to the first ``.`` of its file name, the rest its extension (``000123.seg.png``: key
``000123``, extension ``seg.png``), and one sample's members follow each other. In a sample,
the member with an image extension (``jpg``, ``png``, ``webp``, ...) is the image; ``cls`` is
the class (an integer, or a class name); ``txt`` is a ``text`` field and ``json`` a ``json``
one, each named by its extension; any other extension is a field only where ``--field
EXT=KIND`` names its kind (its text parsed as a labels file's cell is; a ``.npy`` member's
array, never unpickled; a binary kind's member, a class map's PNG, as its bytes), else it is
left out and counted. Samples are in the tars' order
(the pattern's, or their sorted paths) and in member order within a tar; a sample's key is
``TAR/KEY``.

The tars are read once for their headers and small members, the images' bytes left where
they lie: a local tar's image is read by the decode worker itself (a ``Span``), a tar in a
store or a compressed one is read again in order (a store's by byte range) as the shards are
written. Nothing in a tar is extracted or trusted: a member named outside the archive
(absolute, or with ``..``), a key given twice, a sample without an image, a member larger
than it may be, a damaged or cut-off tar each skip what they touch, with the reason, in the
manifest.
"""
from __future__ import annotations

import io
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from fastdata.converters.decode import MAX_FILE_BYTES
from fastdata.converters.labels import kept, labels_of, samples
from fastdata.converters.scan import Scan
from fastdata.converters.sources.base import Indexed, Places, Source, Span, register
from fastdata.converters.sources.pieces import READ_BYTES, Piece, find, holds
from fastdata.converters.sources.tarfiles import Member, TarDamaged, members
from fastdata.converters.table import Table
from fastdata.converters.units import ConversionError
from fastdata.fields.base import FIELDS, MAX_VALUE_BYTES
from fastdata.format import IMAGE_EXTENSIONS

SUFFIXES = (".tar", ".tar.gz", ".tgz")
IMAGE_EXTS = frozenset(e.lstrip(".") for e in IMAGE_EXTENSIONS)
#: extensions with a kind of their own: ``cls`` the label, the others a field of that kind
KINDS = {"cls": "class", "txt": "text", "json": "json"}
#: bytes of a tar in a store (or a compressed one) read at once for the images of a shard
WINDOW_BYTES = 16 << 20


def split_name(name: str) -> tuple[str, str]:
    """A member's ``(key, extension)``: its path up to the first ``.`` of its file name, and
    the rest (lowercased); an extension of ``""`` where there is no ``.``."""
    folder, base = posixpath.split(name)
    stem, dot, ext = base.partition(".")
    return posixpath.join(folder, stem) if folder else stem, ext.lower() if dot else ""


def outside(name: str) -> bool:
    """Whether a member's name points outside the archive (absolute, or through ``..``)."""
    return name.startswith(("/", "\\")) or ".." in name.replace("\\", "/").split("/") \
        or (len(name) > 1 and name[1] == ":")


@dataclass
class _Sample:
    """One key's members, as the index meets them."""

    key: str
    image: Member | None = None
    cells: dict[str, str] = field(default_factory=dict)
    problem: str | None = None


def _npy(data: bytes, m: Member, sample: _Sample):
    """A ``.npy`` member's array as a list (what an ``array`` or ``tokens`` field parses);
    never unpickled."""
    try:
        value = np.load(io.BytesIO(data), allow_pickle=False)
        if value.dtype.kind not in "biuf":
            raise ValueError(f"of {value.dtype}")
        return value.tolist()
    except (ValueError, OSError, EOFError) as e:
        sample.problem = (f"its member {posixpath.basename(m.name)!r} is not an array of "
                          f"numbers in NumPy's .npy format ({e})")
        return ""


class TarImages(Indexed):
    """A tar source's images: ``(a, b)`` a member's data offset and size in its tar."""

    @property
    def random_access(self) -> bool:
        """Tars on disk, uncompressed: a shuffled conversion reads each image where it is
        (a compressed tar or one in a store is read in order)."""
        return not any(p.remote or p.compressed for p in self.pieces)

    def read(self, piece: Piece, a: np.ndarray, b: np.ndarray) -> Iterator:
        if not piece.remote and not piece.compressed:
            for off, size in zip(a.tolist(), b.tolist()):
                yield Span(piece.where, off, size)
            return
        if piece.compressed:    # in order: one pass through the stream for the run
            reader = piece.reader(int(a[0]))
            for off, size in zip(a.tolist(), b.tolist()):
                reader.skip(off - reader.tell())
                yield reader.read(size)
            return
        yield from _windows(piece, a.tolist(), b.tolist())


def _windows(piece: Piece, offsets: list[int], sizes: list[int]) -> Iterator[memoryview]:
    """Members of a tar in a store, read a byte range of up to ``WINDOW_BYTES`` at a time
    (one request for many small members; the run's offsets ascend)."""
    k = 0
    while k < len(offsets):
        stop = k + 1
        while stop < len(offsets) and offsets[stop] >= offsets[stop - 1] and \
                offsets[stop] + sizes[stop] - offsets[k] <= WINDOW_BYTES:
            stop += 1
        start = offsets[k]
        data = memoryview(piece.read(start, max(o + s for o, s in zip(offsets[k:stop],
                                                                      sizes[k:stop]))))
        for off, size in zip(offsets[k:stop], sizes[k:stop]):
            yield data[off - start:off - start + size]
        k = stop


@register
class TarSource(Source):
    """WebDataset tars (see the module's docstring).

    Args:
        src: a tar, a folder of tars, a pattern of tar names, or the URL of any of them.
        fields: the kind of members by extension (``{"npy": "array"}``, ``--field EXT=KIND``)
            beside ``txt`` (text) and ``json``.
    """

    kind = "webdataset"
    takes = ("fields",)
    described = ("WebDataset tars: a .tar (.tar.gz, .tgz), a folder of them or a pattern "
                 "such as shard-{000000..000127}.tar")

    @classmethod
    def claims(cls, src: str) -> bool:
        return holds(src, SUFFIXES)

    def scan(self, *, progress: bool) -> Scan:
        pieces = find(self.src, SUFFIXES, "tar files")
        given = dict(self.options["fields"] or {})
        kinds = {**{ext: k for ext, k in KINDS.items() if ext != "cls"}, **given}
        index = _Index(kinds, self.src)
        bar = tqdm(total=sum(p.size for p in pieces), unit="B", unit_scale=True,
                   desc="index tars", disable=not progress, dynamic_ncols=True)
        for k, piece in enumerate(pieces):
            index.add(piece, k)
            bar.update(piece.size)
        bar.close()
        table = index.done()
        labels = labels_of(table, {c: kinds[c] for c in table.columns if c in kinds})
        if not kept(table, labels):
            left = index.skipped + labels.bad
            raise ConversionError(f"no sample with an image in {self.src} (" + (
                f"{len(left)} left out, e.g. {left[0]['path']}: {left[0]['reason']}" if left
                else "; ".join(f"{n} {why}" for why, n in index.ignored.items())
                or "it holds no member") + ")")
        files, targets, values = samples(table, labels)
        return Scan(self.src, labels.names, files, index.ignored,
                    skipped=index.skipped + labels.bad, label_kind=labels.kind,
                    targets=targets, values=values,
                    images=TarImages(pieces, index.where.kept(labels.rows)))


class _Index:
    """The samples of a source's tars as their headers and small members say, in order: a
    table of their small members (``cls`` as the ``label`` column, each field's extension a
    column of its own) and where each image is, packed as they come."""

    def __init__(self, kinds: dict[str, str], src: str):
        self.exts = ["cls", *kinds]
        self.kinds = kinds
        self.table = Table(src, ["label", *kinds], unit="sample", what="webdataset")
        self.where = Places()                   # each sample's tar, offset, size
        self.seen_columns: set[str] = set()     # the extensions some sample has
        self.skipped: list[dict] = []
        self.ignored: dict[str, int] = {}

    def add(self, piece: Piece, number: int) -> None:
        """The samples of the tar ``piece`` (the ``number``-th)."""
        reader = piece.reader()
        seen: set[str] = set()
        current: _Sample | None = None
        try:
            for m in members(reader, piece.shown, None if piece.compressed else piece.size):
                key, ext = split_name(m.name)
                if current is None or key != current.key:
                    self._close(piece, number, current)
                    current = _Sample(key)
                    if key in seen:
                        current.problem = f"the key {key!r} again, apart from its first " \
                                          f"members: kept where it was first"
                    seen.add(key)
                self._member(reader, m, ext, current)
        except (TarDamaged, OSError) as e:
            # a damaged header after a sample's members leaves them whole; damage inside a
            # member's data (or a stream's) does not
            if current is not None and (getattr(e, "in_data", True)):
                current.problem = current.problem or "the tar is damaged inside it"
            self.skipped.append({"path": piece.name, "kind": "unreadable",
                                 "reason": f"{e}; the members after it are left out"})
        self._close(piece, number, current)

    def _count(self, reason: str) -> None:
        self.ignored[reason] = self.ignored.get(reason, 0) + 1

    def _member(self, reader, m: Member, ext: str, sample: _Sample) -> None:
        if not m.regular:
            self._count("tar member that is not a file (a folder, a link, a device)")
        elif outside(m.name):
            sample.problem = f"its member {m.name!r} is named outside the archive"
        elif ext in sample.cells or (ext in IMAGE_EXTS and sample.image is not None
                                     and ext == split_name(sample.image.name)[1]):
            sample.problem = f"its member .{ext} twice"
        elif ext in IMAGE_EXTS:
            if sample.image is not None:
                self._count("tar member with a second image of a sample")
            elif m.size > MAX_FILE_BYTES:
                sample.problem = (f"its image member of {m.size:,} bytes is larger than an "
                                  f"image may be ({MAX_FILE_BYTES:,})")
            else:
                sample.image = m
        elif ext == "cls" or ext in self.kinds:
            sample.cells[ext] = self._value(reader, m, ext, sample)
        elif ext:
            self._count(f"tar member with no field's extension (.{ext}: name its kind with "
                        f"--field {ext}=KIND)")
        else:
            self._count("tar member without an extension")

    def _value(self, reader, m: Member, ext: str, sample: _Sample):
        """A small member's text (a class, a caption, JSON), array (``.npy``) or bytes (a
        binary kind's: ``FieldKind.binary``); a sample's problem where it is too large or not
        UTF-8."""
        if m.size > MAX_VALUE_BYTES:
            sample.problem = (f"its member {posixpath.basename(m.name)!r} holds {m.size:,} "
                              f"bytes, more than the {MAX_VALUE_BYTES:,} a field's value may")
            return ""
        data = b"".join(reader.read(min(READ_BYTES, m.size - k))
                        for k in range(0, m.size, READ_BYTES))
        if len(data) < m.size:
            e = TarDamaged(f"cut off inside the data of {m.name!r}")
            e.in_data = True
            raise e
        if ext in self.kinds and FIELDS[self.kinds[ext]].binary:
            return data
        if m.name.lower().endswith(".npy"):
            return _npy(data, m, sample)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            sample.problem = f"its member {posixpath.basename(m.name)!r} is not UTF-8 text"
            return ""

    def _close(self, piece: Piece, number: int, sample: _Sample | None) -> None:
        """File a finished sample: a row of the table, or a skipped entry with its reason."""
        if sample is None:
            return
        key = f"{piece.name}/{sample.key}"
        if sample.problem is None and sample.image is None:
            sample.problem = (f"no image member ({', '.join(sorted(IMAGE_EXTS))}) among its "
                              f"{len(sample.cells)} member{'s' if len(sample.cells) != 1 else ''}")
        if sample.problem is not None:
            self.skipped.append({"path": key, "kind": "unreadable", "reason": sample.problem})
            return
        assert sample.image is not None
        self.table.add(key, [sample.cells.get(ext) for ext in self.exts], key)
        self.where.append([(number, sample.image.offset, sample.image.size)])
        self.seen_columns.update(sample.cells)

    def done(self) -> Table:
        """The table, without the columns no sample has (a tar without ``cls``: no label)."""
        for ext in reversed(self.exts):
            if ext not in self.seen_columns:
                k = self.exts.index(ext)
                del self.exts[k], self.table.columns[k], self.table.cells[k]
        return self.table
