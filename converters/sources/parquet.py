"""Parquet tables of images (``--source parquet``): a ``.parquet`` file, a folder of them
(Hugging Face's hub layout, ``data/train-00000-of-00004.parquet``, included), or a pattern,
on disk or in a store; ``pip install 'fastdata-shards[parquet]'``.

A row is a sample. Its image is the column Hugging Face's features call an ``Image`` (the
``{bytes, path}`` struct), else ``--image-column``, else a column named ``image`` (``img``,
``jpg``...) of bytes, else the only column of bytes, else a column of paths relative to the
source folder (``image_path``, ``file_name``, ``path``). Every other column is the label or a
field, as a labels file's are (``fastdata.converters.labels``): a ``ClassLabel`` with its
names, a fixed-size list of numbers an ``array`` of their dtype, the rest inferred or given
by ``--field NAME=KIND``. Rows are in the files' order (the pattern's, or their sorted paths)
and row order within a file; a sample's key is ``FILE/ROW`` (rows from 0). Where the files
hold several splits (``train-*`` and ``test-*``), ``--split`` chooses one.

The images are read row group by row group, a few rows at a time, as the shards are written
(a file in a store by byte ranges): never more than a batch of cells in memory. A null or
oversized cell skips its row with the reason; a file whose columns differ from the first's
is refused naming both.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterator

import numpy as np
from tqdm import tqdm

from fastdata._optional import require
from fastdata.converters import decode
from fastdata.converters.labels import kept, labels_of, samples
from fastdata.converters.scan import Scan
from fastdata.converters.sources import arrow
from fastdata.converters.sources.base import Indexed, Places, Source, Unreadable, register
from fastdata.converters.sources.pieces import Piece, find, holds
from fastdata.converters.table import relative
from fastdata.converters.units import ConversionError
from fastdata.shards.stores import is_url

SUFFIXES = (".parquet", ".pq")
#: rows of the image column read at once
BATCH_ROWS = 32
#: a row group whose images take more than this uncompressed, or more than an image may
#: take (``decode.MAX_FILE_BYTES``) a row, is refused (its rows skipped) before a byte of it
#: is decompressed: few huge cells, or a compressed bomb
MAX_GROUP_BYTES = 16 << 30
#: a hub layout's file name: SPLIT-INDEX-of-COUNT
_HUB_NAME = re.compile(r"(?:^|/)([A-Za-z0-9_.]+?)-(\d{5})-of-(\d{5})\.parquet$")


class _RangeFile:
    """A piece in a store as the seekable file pyarrow reads: reads by byte range, at least
    ``AHEAD`` bytes a request (pyarrow reads a column chunk a buffer at a time: one request
    for several)."""

    AHEAD = 8 << 20

    def __init__(self, piece: Piece):
        self.piece, self.at, self.closed = piece, 0, False
        self.held, self.held_at = b"", 0      # the bytes of the last request, and where

    def seek(self, offset: int, whence: int = 0) -> int:
        self.at = offset + (0, self.at, self.piece.size)[whence]
        return self.at

    def tell(self) -> int:
        return self.at

    def read(self, n: int = -1) -> bytes:
        end = self.piece.size if n < 0 else min(self.piece.size, self.at + n)
        if end <= self.at:
            return b""
        if not (self.held_at <= self.at and end <= self.held_at + len(self.held)):
            self.held_at = self.at
            self.held = self.piece.read(self.at, min(self.piece.size,
                                                     max(end, self.at + self.AHEAD)))
        data = self.held[self.at - self.held_at:end - self.held_at]
        self.at += len(data)
        return data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True


def open_parquet(piece: Piece):
    """A ``pyarrow.parquet.ParquetFile`` of ``piece`` that streams its pages (a buffered
    read of each column chunk, not the whole chunk at once).

    Raises:
        ValueError: not a parquet file pyarrow can read (naming it).
    """
    pa = require("pyarrow", "parquet sources")
    import pyarrow.parquet as pq

    source = pa.PythonFile(_RangeFile(piece), mode="r") if piece.remote else piece.where
    try:
        return pq.ParquetFile(source, buffer_size=1 << 20, pre_buffer=False)
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{piece.shown} is not a readable parquet file ({e})") from None


class ParquetImages(Indexed):
    """A parquet source's images: ``(a, b)`` a row group and a row in it."""

    @property
    def random_access(self) -> bool:
        """No: a row group is read a few rows at a time, in order."""
        return False

    def __init__(self, pieces, places, column: str, form: str):
        super().__init__(pieces, places)
        self.column, self.form = column, form

    def read(self, piece: Piece, a: np.ndarray, b: np.ndarray) -> Iterator:
        file = open_parquet(piece)
        k = 0
        while k < len(a):       # runs of rows in one row group, read a batch at a time
            group, stop = int(a[k]), k + 1
            while stop < len(a) and a[stop] == group and b[stop] > b[stop - 1]:
                stop += 1
            yield from self._group(file, piece, group, b[k:stop].tolist())
            k = stop

    def _group(self, file, piece: Piece, group: int, rows: list[int]) -> Iterator:
        size = _image_bytes(file, group, self.column)
        most = min(MAX_GROUP_BYTES, decode.MAX_FILE_BYTES * file.metadata.row_group(group).num_rows)
        if size > most:
            reason = (f"row group {group} of {piece.name} holds {size:,} bytes of images, "
                      f"more than the {most:,} read (a row group of few huge cells, or "
                      f"damaged): write it with smaller row groups")
            yield from (Unreadable(reason) for _ in rows)
            return
        want, at = iter(rows), 0
        row: int | None = next(want)
        try:
            for batch in file.iter_batches(batch_size=BATCH_ROWS, row_groups=[group],
                                           columns=[self.column], use_threads=False):
                items = arrow.image_items(batch.column(0), self.form)
                while row is not None and row < at + len(items):
                    yield items[row - at]
                    row = next(want, None)
                at += len(items)
                if row is None:
                    return
        except Exception as e:     # noqa: BLE001 - pyarrow's errors on a damaged file
            reason = f"row group {group} of {piece.name} cannot be read past row {at} ({e})"
            yield from (Unreadable(reason) for r in [row, *want] if r is not None)
            return
        yield from (Unreadable(f"{piece.name} has no row {r} in row group {group}")
                    for r in [row, *want] if r is not None)


def _image_bytes(file, group: int, column: str) -> int:
    """The uncompressed bytes of ``column`` in row group ``group``, as the file says."""
    meta = file.metadata.row_group(group)
    return sum(meta.column(j).total_uncompressed_size for j in range(meta.num_columns)
               if meta.column(j).path_in_schema.split(".")[0] == column)


@register
class ParquetSource(Source):
    """Parquet tables of images (see the module's docstring).

    Args:
        src: a parquet file, a folder of them, a pattern, or the URL of any of them.
        fields: the kind of a column by name, where not inferred (``--field NAME=KIND``).
        split: the split to read where the files hold several (``train``, ``test``).
        image_column: the image's column, where it is not found by its type or name.
    """

    kind = "parquet"
    takes = ("fields", "split", "image_column")
    described = "parquet files: a .parquet file, a folder of them or a pattern"

    @classmethod
    def claims(cls, src: str) -> bool:
        return holds(src, SUFFIXES, also=("data",))

    def scan(self, *, progress: bool) -> Scan:
        pieces = of_split(find(self.src, SUFFIXES, "parquet files"), self.options["split"],
                          self.src)
        first = open_parquet(pieces[0])
        schema = first.schema_arrow
        features = arrow.hf_features(schema.metadata)
        image = arrow.image_column(schema, features, self.options["image_column"],
                                   pieces[0].shown)
        table, class_names = arrow.label_table(schema, image, features, "parquet", self.src,
                                               self.options["fields"])
        locations = Places()                # each row's file, row group and row
        seen: set[str] = set()              # the paths of a path column, so far
        bar = tqdm(total=sum(p.size for p in pieces), unit="B", unit_scale=True,
                   desc="index parquet", disable=not progress, dynamic_ncols=True)
        for number, piece in enumerate(pieces):
            file = first if number == 0 else open_parquet(piece)
            _same_columns(file.schema_arrow, schema, piece, pieces[0])
            start = 0
            for group in range(file.num_row_groups):
                for place in _index_group(file, piece, (number, group, start), table,
                                          class_names, image, seen):
                    locations.append([place])
                start += file.metadata.row_group(group).num_rows
            bar.update(piece.size)
        bar.close()
        return self._scan(pieces, table, image, locations)

    def _scan(self, pieces: list[Piece], table, image, locations) -> Scan:
        labels = labels_of(table, self.options["fields"])
        if not kept(table, labels):
            raise ConversionError(f"no usable row in {self.src} ({len(labels.bad)} left out, "
                                  f"e.g. {labels.bad[:1]})")
        files, targets, values = samples(table, labels)
        if image.form == "path":
            return Scan(_folder(self.src), labels.names, files, skipped=labels.bad,
                        label_kind=labels.kind, targets=targets, values=values)

        return Scan(self.src, labels.names, files, skipped=labels.bad, label_kind=labels.kind,
                    targets=targets, values=values,
                    images=ParquetImages(pieces, locations.kept(labels.rows), image.name,
                                         image.form))


def _index_group(file, piece: Piece, at: tuple[int, int, int], table, class_names, image,
                 seen: set[str]) -> list[tuple[int, int, int]]:
    """The rows of one row group (``at``: the file's number, the group's, its first row's in
    the file) into ``table`` (their other columns; a path column's paths as their keys,
    ``seen`` those of the rows before); returns their places ``(file, group, row)``."""
    number, group, start = at
    columns = table.sources + ([image.name] if image.form == "path" else [])
    data = file.read_row_group(group, columns=columns, use_threads=False)
    cells = {name: data.column(name).to_pylist() for name in columns}
    good, keys = list(range(data.num_rows)), [f"{piece.name}/{start + r}"
                                             for r in range(data.num_rows)]
    if image.form == "path":
        good, keys = [], []
        for r, path in enumerate(cells[image.name]):
            key = relative(path)
            if key is None or key in seen:
                table.bad.append({"path": f"{piece.name}/{start + r}", "kind": "bad_label",
                                  "reason": f"parquet {piece.name} row {start + r}: "
                                            f"{str(path)[:80]!r} is " +
                                            ("not a path inside the source folder"
                                             if key is None else "listed again")})
                continue
            good.append(r)
            keys.append(key)
            seen.add(key)
    arrow.add_rows(table, {n: [cells[n][r] for r in good] for n in table.sources}, keys,
                   [f"{piece.name} row {start + r}" for r in good], class_names)
    return [(number, group, r) for r in good]


def _same_columns(schema, first, piece: Piece, first_piece: Piece) -> None:
    if schema.names != first.names:
        raise ValueError(f"{piece.shown}: its columns ({', '.join(schema.names)}) are not "
                         f"those of {first_piece.name} ({', '.join(first.names)}): convert "
                         f"them apart")


def _folder(src: str) -> str:
    """The folder a path column's paths are relative to: SRC, or the folder of a file or
    pattern."""
    if is_url(src):
        raise ValueError(f"{src}: its images are paths to files; a parquet source in a store "
                         f"holds its images' bytes")
    src = os.path.abspath(src)
    return src if os.path.isdir(src) else os.path.dirname(src)


def of_split(pieces: list[Piece], split: str | None, src: str) -> list[Piece]:
    """The pieces of ``split`` (files ``SPLIT-00000-of-00004.parquet``, or under a folder
    ``SPLIT/``); all of them where there is one split and none is asked for.

    Raises:
        ValueError: the files hold several splits and none is asked for, or not the one
            asked for (naming those they hold).
        FileNotFoundError: a file of the hub's layout is missing (``_complete``).
    """
    def split_of(p: Piece) -> str | None:
        m = _HUB_NAME.search(p.name.replace(os.sep, "/"))
        parts = p.name.replace(os.sep, "/").split("/")
        return m.group(1) if m else (parts[-2] if len(parts) > 1 else None)

    _complete(pieces, src)
    splits = sorted({s for s in map(split_of, pieces) if s is not None})
    if split is None:
        if len(splits) > 1 and all(split_of(p) for p in pieces):
            raise ValueError(f"{src} holds the splits {', '.join(splits)}: choose one with "
                             f"--split")
        return pieces
    chosen = [p for p in pieces if split_of(p) == split]
    if not chosen:
        raise ValueError(f"{src} has no split {split!r}; its splits: "
                         f"{', '.join(splits) or 'none named'}")
    return chosen


def _complete(pieces: list[Piece], src: str) -> None:
    """Refuse a hub layout's split that misses one of its files (``train-00001-of-00004``
    named by the others' count, not there).

    Raises:
        FileNotFoundError: naming the first file missing and the fix.
    """
    groups: dict[tuple[str, str, str], set[int]] = {}
    for p in pieces:
        m = _HUB_NAME.search(p.name.replace(os.sep, "/"))
        if m:
            folder = os.path.dirname(p.name)
            groups.setdefault((folder, m.group(1), m.group(3)), set()).add(int(m.group(2)))
    for (folder, split, count), have in groups.items():
        missing = sorted(set(range(int(count))) - have)
        if missing:
            name = os.path.join(folder, f"{split}-{missing[0]:05d}-of-{count}.parquet")
            raise FileNotFoundError(f"{src}: {name} is missing ({len(missing)} of the "
                                    f"{int(count)} files of its split): download the dataset "
                                    f"again")
