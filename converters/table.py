"""A table of rows by key, packed in temporary files as it is read (``Table``): a source's
rows (``fastdata.converters.sources``), or a labels file's: CSV (a header row), JSON Lines
(an object per line) or parquet (pyarrow, ``pip install 'fastdata-shards[parquet]'``), chosen
by the file's extension. One column names each row's image (``path``, or ``file_name`` as
Hugging Face's image folders have it: relative to the source folder); every other column is
a label or a field (``fastdata.converters.labels``).
"""
from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass, field

from fastdata._optional import require
from fastdata.converters.spill import Packed
from fastdata.converters.units import read_limited

#: a labels file larger than this is refused before it is parsed
MAX_LABELS_BYTES = 1 << 30
#: the names a column of image paths may have
PATH_COLUMNS = ("path", "file_name")
FORMATS = {".csv": "csv", ".tsv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl",
           ".parquet": "parquet", ".pq": "parquet"}


@dataclass
class Table:
    """A table of rows by key (a labels file's image paths, a source's samples): ``add`` a
    row at a time; its keys, cells (CSV: strings; JSON Lines, parquet, a source: JSON values)
    and places (``line``: where a row is, for messages) are packed in temporary files
    (``fastdata.converters.scan.Packed``), read back a block at a time, so that a table's
    memory does not grow with its rows. ``bad``: rows that name no usable image, as skipped
    entries."""

    file: str
    columns: list[str]
    bad: list[dict] = field(default_factory=list)
    #: what a row's place is called in messages ("line", "row", or "sample")
    unit: str = "line"
    #: what the table is called in messages (default: "labels file NAME")
    what: str = ""
    #: the label column's class names, where the source gives them (a Hugging Face
    #: ``ClassLabel``'s, in index order), else None: inferred from the labels
    classes: list[str] | None = None
    #: the kinds of columns that the source's own types give (``fastdata.fields``), by name
    known: dict = field(default_factory=dict)
    #: the names of ``columns`` in the source, where it calls them otherwise (the label's)
    sources: list[str] = field(default_factory=list)

    def __post_init__(self):
        self.what = self.what or f"labels file {os.path.basename(self.file)}"
        self.keys, self.places = Packed(), Packed()
        self.cells = [Packed() for _ in self.columns]

    def __len__(self) -> int:
        return len(self.keys)

    def add(self, key: str, cells, place) -> None:
        """The row ``key`` (``cells``: one per column) found at ``place``."""
        self.keys.append([key.encode("utf-8", "surrogateescape")])
        self.places.append([str(place).encode("utf-8", "surrogateescape")])
        for column, cell in zip(self.cells, cells):
            column.append([encode_cell(cell)])

    def rows(self, block: int = 1 << 12):
        """``(row number, key, cells, where)`` of each row, in order (``where``: the row, for
        a message)."""
        for a in range(0, len(self), block):
            keys = [k.decode("utf-8", "surrogateescape") for k in self.keys.block(a, a + block)]
            places = self.places.block(a, a + block)
            columns = [list(map(decode_cell, c.block(a, a + block))) for c in self.cells]
            for k, key in enumerate(keys):
                yield a + k, key, [c[k] for c in columns], self._at(places[k])

    def column(self, k: int):
        """Column ``k``'s cells, in order (a fresh pass each call)."""
        return map(decode_cell, self.cells[k].iter_from(0))

    def where(self, row: int, column: str | None = None) -> str:
        """Row number ``row`` (and a column) of the table, for a message."""
        at = self._at(self.places.block(row, row + 1)[0])
        return at if column is None else f"{at}, column {column}"

    def _at(self, place: bytes) -> str:
        return " ".join(filter(None, (self.what, self.unit,
                                      place.decode("utf-8", "surrogateescape"))))


def encode_cell(cell) -> bytes:
    """A cell as ``Table`` packs it: a string as its UTF-8 bytes, none as nothing, bytes (a
    file's: a tar member's) as they are, any other JSON value as JSON, a first byte telling
    which."""
    if isinstance(cell, str):
        return b"s" + cell.encode("utf-8", "surrogatepass")
    if cell is None:
        return b"n"
    if isinstance(cell, bytes):
        return b"b" + cell
    return b"j" + json.dumps(cell, ensure_ascii=False).encode("utf-8", "surrogatepass")


def decode_cell(data: bytes):
    """``encode_cell``'s cell back."""
    tag = data[:1]
    if tag == b"n":
        return None
    if tag == b"b":
        return data[1:]
    text = data[1:].decode("utf-8", "surrogatepass")
    return text if tag == b"s" else json.loads(text)


def relative(path) -> str | None:
    """A labels file's path as the scan writes it (relative, normalised), or None where it is
    not a path inside the source folder."""
    if not isinstance(path, str):
        return None
    path = path.strip().replace("/", os.sep)
    norm = os.path.normpath(path)
    if not path or os.path.isabs(path) or norm == ".." or norm.startswith(".." + os.sep):
        return None
    return norm


def read_table(file: str) -> Table:
    """The labels file ``file`` as a ``Table``.

    Raises:
        ValueError: an extension that is not one of ``FORMATS``, a file that is not a regular
            file, too large, not UTF-8 (CSV, JSON Lines) or not readable as its format, or
            whose columns are not a path column and distinct names (each named).
        ImportError: a parquet file without pyarrow (naming the extra).
    """
    fmt = FORMATS.get(os.path.splitext(file)[1].lower())
    if fmt is None:
        raise ValueError(f"labels file {file}: {os.path.splitext(file)[1] or 'no extension'!r} "
                         f"is not a labels file's extension; give one of "
                         f"{', '.join(FORMATS)}")
    data = read_limited(file, MAX_LABELS_BYTES, "labels file")
    header, records, unit = {"csv": _csv, "jsonl": _jsonl, "parquet": _parquet}[fmt](file, data)
    paths = [c for c in header if c in PATH_COLUMNS]
    if len(paths) != 1 or len(header) < 2 or "" in header or len(set(header)) < len(header):
        raise ValueError(f"labels file {file}: its columns must be one image path column "
                         f"({' or '.join(PATH_COLUMNS)}) and at least one more, each named "
                         f"once, not {header[:6]}")
    at = header.index(paths[0])
    table = Table(file, [c for c in header if c != paths[0]], unit=unit)
    seen: set[str] = set()
    for line, row in records:
        _add(table, line, row, at, seen)
    return table


def _add(table: Table, line: int, row: list | None, at: int, seen: set[str]) -> None:
    """One record into ``table`` (``row`` None: one that does not fit the header; ``seen``:
    the paths of the rows before it)."""
    where = f"labels file {os.path.basename(table.file)} {table.unit} {line}"
    if row is None or len(row) != len(table.columns) + 1:
        shown = row[at] if row and len(row) > at else f"{table.unit} {line}"
        found = "not an object of the first line's keys" if row is None else \
            f"{len(row)} columns, the header has {len(table.columns) + 1}"
        table.bad.append({"path": str(shown), "kind": "bad_label", "reason": f"{where}: {found}"})
        return
    path = relative(row[at])
    if path is None:
        table.bad.append({"path": str(row[at]), "kind": "bad_label",
                          "reason": f"{where}: not a path inside the source folder"})
    elif path in seen:
        table.bad.append({"path": str(row[at]), "kind": "note",
                          "reason": f"{where}: listed again (the first row counts)"})
    else:
        seen.add(path)
        table.add(path, [c for k, c in enumerate(row) if k != at], line)


def _csv(file: str, data: bytes) -> tuple[list[str], list, str]:
    # a cell may be as long as the file (the csv module's 128 KiB limit would refuse a long
    # caption with the whole file): the field checks each value's length, naming its row
    limit = csv.field_size_limit(MAX_LABELS_BYTES)
    try:
        text = data.decode("utf-8-sig")
        rows = list(csv.reader(io.StringIO(text, newline=""),
                               delimiter="\t" if file.lower().endswith(".tsv") else ","))
    except (UnicodeDecodeError, csv.Error) as e:
        raise ValueError(f"labels file {file} is not a readable CSV ({e})") from None
    finally:
        csv.field_size_limit(limit)
    header = [h.strip() for h in rows[0]] if rows else []
    records = [(line, row) for line, row in enumerate(rows[1:], 2) if any(c.strip() for c in row)]
    return header, records, "line"


def _jsonl(file: str, data: bytes) -> tuple[list[str], list, str]:
    """JSON Lines: the first object's keys are the columns; a line that is not an object of
    those keys is a bad row."""
    try:
        lines = data.decode("utf-8-sig").splitlines()
    except UnicodeDecodeError as e:
        raise ValueError(f"labels file {file} is not UTF-8 text ({e})") from None
    header: list[str] | None = None
    records = []
    for line, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError):
            obj = None
        if header is None:
            if not isinstance(obj, dict):
                raise ValueError(f"labels file {file} line {line}: not a JSON object (each "
                                 f"line of a JSON Lines file is one)")
            header = list(obj)
        fits = isinstance(obj, dict) and list(obj) == header
        records.append((line, tuple(obj[c] for c in header) if fits else None))
    return header or [], records, "line"


def _parquet(file: str, data: bytes) -> tuple[list[str], list, str]:
    pa = require("pyarrow", "a parquet labels file")
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"labels file {file} is not a readable parquet file ({e})") from None
    header = table.column_names
    columns = [table.column(c).to_pylist() for c in header]
    return header, [(k + 1, tuple(col[k] for col in columns)) for k in range(table.num_rows)], \
        "row"
