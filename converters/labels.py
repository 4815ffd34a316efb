"""Labels and fields from a labels file instead of folder names (``fastdata convert SRC OUT
--labels FILE``): CSV, JSON Lines or parquet (``fastdata.converters.table``), a row per image
with its path relative to SRC (column ``path`` or ``file_name``, in any layout, flat included).

* Only a ``label`` column, or only columns of numbers (most of each column's cells: one that
  is not a number skips its row): a set's labels. ``label`` holds a class
  name or a non-negative integer per image (the classes are the sorted names, or ``0..max``
  where every label is an integer, so that an integer label is its class index); columns of 0
  and 1 only are multi-label (multi-hot; the header names the classes); other numbers are
  regression targets (the header names them).
* Otherwise a ``label`` column (if any) is the class label, as above, and every other column
  is a field of its own, its kind inferred (``fastdata.fields.infer``: numbers ``float``, JSON
  arrays of numbers ``array``, of integers ``tokens``, objects ``json``, other strings
  ``text``) or given by ``--field NAME=KIND``. A set without a ``label`` column has none.

Images under SRC that the file does not list, rows whose file is not under SRC, rows listed
twice and rows that do not parse (a value not of its field's kind, named by line and column)
are reported as the manifest's skipped entries, with why.
"""
from __future__ import annotations

import array
import itertools
import logging
import os
import re
from dataclasses import dataclass, field

import numpy as np

from fastdata.converters.scan import FieldValues, Files, Scan, source_folder, walk_images
from fastdata.converters.spill import Spilled, blocks_of, merged
from fastdata.converters.table import Table, read_table, relative
from fastdata.converters.units import read_limited
from fastdata.fields import FieldError, FieldKind
from fastdata.fields.base import MAX_VALUE_BYTES
from fastdata.fields.infer import infer, kind_named
from fastdata.fields.schema import check_name

log = logging.getLogger("fastdata.convert")

#: integer labels are class indices below this: each index up to the largest is a class, so
#: one row's label must not make millions of them
MAX_CLASSES = 1 << 20
_INTEGER = re.compile(r"[0-9]+")
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|[-+]?(inf|nan)", re.IGNORECASE)


@dataclass
class LabelsFile:
    """A table's rows as labels and fields: the rows kept (their numbers in the table,
    ascending), each one's class index or targets, and its fields' values."""

    kind: str                                   # one of fastdata.format.LABEL_KINDS
    names: list[str]                            # classes or target names
    rows: Spilled | None                        # the rows kept, by number (None: all)
    labels: Spilled | None = None               # their class indices (kind "class")
    targets: np.ndarray | None = None           # their targets (multi-label, regression)
    bad: list[dict] = field(default_factory=list)   # rows that cannot be used: path, reason
    fields: dict[str, FieldKind] = field(default_factory=dict)  # the other columns' kinds
    values: FieldValues | None = None           # the rows kept's fields' values


def read_labels(file: str, kinds: dict[str, str] | None = None,
                files: str | None = None) -> tuple[Table, LabelsFile]:
    """Parse a labels file (see the module's docstring). ``kinds``: a column's kind by name
    (``--field NAME=KIND``), where not inferred; ``files``: the folder that the paths of a
    column of files (a class map's PNG) are relative to.

    Raises:
        ValueError: the file is not a labels file (``read_table``), or its columns are not
            labels and fields (``labels_of``).
    """
    table = read_table(file)
    return table, labels_of(table, kinds, files)


def labels_of(table: Table, kinds: dict[str, str] | None = None,
              files: str | None = None) -> LabelsFile:
    """A table's columns as labels and fields (see the module's docstring): any table, a
    labels file's or a source's own columns (``fastdata.converters.sources``). Each column
    is read a few times over, never held whole.

    Raises:
        ValueError: a ``kinds`` entry names no column or gives the label another kind than
            ``class``, a column's name is not a field's, or integer labels (class indices)
            are mixed with others (the first such row named).
    """
    kinds = dict(kinds or {})
    missing = [n for n in kinds if n not in table.columns]
    if missing:
        raise ValueError(f"--field {missing[0]}=...: {table.what} has no column "
                         f"{missing[0]!r} (its columns: {', '.join(table.columns)})")
    if kinds.get("label", "class") != "class":
        raise ValueError(f"--field label={kinds['label']}: the label column is a class per "
                         f"image; rename the column to make it a field of another kind")
    if not table.columns:       # images alone
        return LabelsFile("none", [], None, bad=list(table.bad))
    if not kinds and table.columns == ["label"]:
        return _classes(table, None, list(table.bad))
    if not kinds and "label" not in table.columns and _all_numbers(table):
        return _numbers(table)
    return _with_fields(table, kinds, files)


def _is_number(c) -> bool:
    return (isinstance(c, (int, float)) and not isinstance(c, bool)) or (
        isinstance(c, str) and _NUMBER.fullmatch(c.strip()) is not None)


def _all_numbers(table: Table) -> bool:
    """Whether most cells of each column are numbers: a multi-label or regression file, where
    a cell that is not one skips its row."""
    return len(table) > 0 and all(2 * sum(map(_is_number, table.column(k))) > len(table)
                                  for k in range(len(table.columns)))


def _label_text(cell) -> str:
    return str(_cell(cell)).strip()


def _kinds_of(table: Table, kinds: dict[str, str]) -> dict[str, FieldKind]:
    """Each column's kind but the label's: given, the source's own, or inferred."""
    fields = {}
    for k, name in enumerate(table.columns):
        if name == "label":
            continue
        check_name(name, f"{table.what}: column")
        cells = _Present(table, k)
        fields[name] = (kind_named(kinds[name], cells) if name in kinds else
                        table.known[name] if name in table.known else infer(name, cells))
    return fields


class _Present:
    """A column's cells but the missing ones, as ``infer`` reads them (any number of
    passes)."""

    def __init__(self, table: Table, k: int):
        self.table, self.k = table, k

    def __iter__(self):
        return (c for c in self.table.column(self.k) if c is not None)


def _with_fields(table: Table, kinds: dict[str, str], files: str | None) -> LabelsFile:
    """A ``label`` column (if any) as the class label, every other column a field."""
    fields = _kinds_of(table, kinds)
    at = [table.columns.index(n) for n in fields]
    bad, good = list(table.bad), Spilled(np.int64)
    values = FieldValues(fields)
    for row, key, cells, where in table.rows():
        try:
            parsed = tuple(kind.parse(_cell(cells[k], kind, files, f"{where}, column {n}"),
                                      f"{where}, column {n}")
                           for (n, kind), k in zip(fields.items(), at))
        except FieldError as e:
            bad.append({"path": key, "kind": "bad_label", "reason": str(e)})
            continue
        values.add(parsed)
        good.append([row])
    if "label" not in table.columns:
        return LabelsFile("none", [], good, bad=bad, fields=fields, values=values)
    out = _classes(table, good, bad)
    if out.rows is not None and len(out.rows) < len(good):     # rows whose label is not one
        values = values.take(_positions(good, out.rows))
    out.fields, out.values = fields, values
    return out


def _positions(rows: Spilled, kept: Spilled) -> Spilled:
    """Where each of ``kept`` (a subset of ``rows``, both ascending) is among ``rows``."""
    out = Spilled(np.int64)
    wanted = (int(r) for b in blocks_of(kept) for r in b.tolist())
    want = next(wanted, None)
    for position, row in enumerate(int(r) for b in blocks_of(rows) for r in b.tolist()):
        if want is None:
            break
        if row == want:
            out.append([position])
            want = next(wanted, None)
    return out


def _cell(cell, kind: FieldKind | None = None, files: str | None = None, where: str = ""):
    """A missing value (a parquet null, a JSON null) as an empty cell; a path in a column of
    files (``FieldKind.binary``) as the file's bytes, read from the folder ``files``."""
    if cell is None:
        return ""
    if kind is not None and kind.binary and files is not None and isinstance(cell, str):
        return _file_bytes(files, cell, where)
    return cell


def _file_bytes(folder: str, cell: str, where: str) -> bytes:
    """The bytes of the file at ``cell``, a path inside ``folder``.

    Raises:
        FieldError: a path outside the folder (``..``, absolute, or a link out of it), or a
            file that cannot be read (naming why).
    """
    rel = relative(cell)
    path = os.path.join(folder, rel) if rel is not None else None
    if path is None or not os.path.realpath(path).startswith(
            os.path.join(os.path.realpath(folder), "")):
        raise FieldError(f"{where}: {cell[:80]!r} is not a file's path inside {folder}")
    try:
        return read_limited(path, MAX_VALUE_BYTES, "file")
    except (OSError, ValueError) as e:
        raise FieldError(f"{where}: {e}") from None


def _label_texts(table: Table, rows: Spilled | None):
    """``(row number, label text)`` of the rows ``rows`` (ascending; None: all), in
    order."""
    at = table.columns.index("label")
    return ((row, _label_text(c)) for row, c in merged(table.column(at), rows))


def _classes(table: Table, rows: Spilled | None, bad: list) -> LabelsFile:
    """Class labels of the rows ``rows``: names (sorted), or class indices where every label
    is an integer; the table's own class names (``table.classes``, a Hugging Face
    ``ClassLabel``'s) where it has them. Two passes over the label column: its names (a set
    of them), then each row's index."""
    names_seen: set[str] = set()
    integers, count = False, 0
    for row, v in _label_texts(table, rows):
        if not v:
            bad.append({"path": _key(table, row), "reason": f"{table.where(row)}: empty label",
                        "kind": "bad_label"})
            continue
        count += 1
        integers = integers or _INTEGER.fullmatch(v) is not None
        names_seen.add(v)
    if table.classes is not None:
        names = list(table.classes)
    elif integers:
        names = _indices(table, rows, names_seen)
    else:
        names = sorted(names_seen)
        if count >= 20 and len(names) == count:
            log.warning("%s: each of its %d images has a label of its own, so each is a "
                        "class: if the column holds captions or other text, name it after "
                        "what it holds (e.g. caption), and it becomes a text field",
                        table.what, count)
    index = {name: k for k, name in enumerate(names)}
    kept, labels = Spilled(np.int64), Spilled(np.int32)
    for row, v in _label_texts(table, rows):
        k = index.get(_as_index(v) if integers else v)
        if k is not None:
            kept.append([row])
            labels.append([k])
        elif v:
            bad.append({"path": _key(table, row), "kind": "bad_label",
                        "reason": f"{table.where(row)}: " + (
                            f"class index {v[:40]} is not below {MAX_CLASSES}" if integers
                            else f"{v[:40]!r} is not one of its {len(names)} classes")})
    return LabelsFile("class", names, kept, labels, bad=bad)


def _key(table: Table, row: int) -> str:
    return table.keys.block(row, row + 1)[0].decode("utf-8", "surrogateescape")


def _indices(table: Table, rows: Spilled | None, seen: set[str]) -> list[str]:
    """Integer labels as class indices: the classes ``0..max`` (those from ``MAX_CLASSES`` on
    are rows to skip).

    Raises:
        ValueError: a label that is not an integer among them (never a silent reordering),
            naming its row.
    """
    if not all(_INTEGER.fullmatch(v) for v in seen):
        row, v = next((r, v) for r, v in _label_texts(table, rows)
                      if v and not _INTEGER.fullmatch(v))
        raise ValueError(f"{table.where(row)}: label {v[:40]!r} is not a non-negative "
                         f"integer, while other labels are (class indices): use one kind of "
                         f"label")
    top = max((int(v) for v in map(_as_index, seen) if v), default=-1)
    return [str(i) for i in range(top + 1)]


def _as_index(label: str) -> str:
    """An integer label as its class index's name ("007": "7"); "" for one of
    ``MAX_CLASSES`` or more (a row to skip)."""
    digits = label.lstrip("0") or "0"
    return digits if len(digits) < 8 and int(digits) < MAX_CLASSES else ""


def _numbers(table: Table) -> LabelsFile:
    """Multi-hot (0 and 1 only) or regression targets, each a float32."""
    good, targets, bad = Spilled(np.int64), array.array("f"), list(table.bad)
    for row, key, cells, where in table.rows():
        problem, values = _number_row(cells)
        if problem is not None:
            bad.append({"path": key, "reason": f"{where}: {problem}",
                        "kind": "bad_label"})
            continue
        good.append([row])
        targets.extend(values)
    matrix = np.frombuffer(targets, np.float32).reshape(len(good), len(table.columns)).copy()
    multi = bool(np.isin(matrix, (0.0, 1.0)).all())
    return LabelsFile("multi_label" if multi else "regression", list(table.columns), good,
                      targets=matrix, bad=bad)


def _number_row(cells: list) -> tuple[str | None, list[float]]:
    """A row's cells as numbers, or why they are not (a problem's text)."""
    texts = [_label_text(c) for c in cells]
    try:
        row = [float(c) for c in texts]
    except ValueError:
        return f"not numbers: {texts[:5]}", []
    if not np.isfinite(row).all():
        return "not a finite number", []
    with np.errstate(over="ignore"):
        fits = np.isfinite(np.asarray(row, np.float32)).all()
    if not fits:        # stored as float32: 1e39 would be inf, a damaged set
        return "a number beyond float32's range (about ±3.4e38)", []
    return None, row


def samples(table: Table, labels: LabelsFile, order: np.ndarray | None = None
            ) -> tuple[Files, np.ndarray | None, FieldValues | None]:
    """The rows ``labels`` kept (in ``order``, positions among them, where given): their keys
    and class labels, their targets (multi-label and regression) and their fields'
    values."""
    files = Files()
    if order is None:
        keys = merged(table.keys.iter_from(0), labels.rows)
        classes = (int(c) for b in blocks_of(labels.labels) for c in b.tolist()) \
            if labels.labels is not None else itertools.repeat(0)
        for chunk in iter(lambda: list(itertools.islice(zip(keys, classes), Files.BLOCK)), []):
            files.extend([k.decode("utf-8", "surrogateescape") for (_, k), _ in chunk],
                         [c for _, c in chunk])
        return files.freeze(), labels.targets, labels.values
    keys = kept_keys(table, labels)
    label = (np.concatenate(list(blocks_of(labels.labels))) if labels.labels is not None
             else np.zeros(len(keys), np.int32))
    files.extend([keys[k] for k in order.tolist()], label[order])
    targets = labels.targets[order] if labels.targets is not None else None
    values = labels.values.take(order) if labels.values is not None else None
    return files.freeze(), targets, values


def kept_keys(table: Table, labels: LabelsFile) -> list[str]:
    """The keys of the rows ``labels`` kept, in their order."""
    return [k.decode("utf-8", "surrogateescape")
            for _, k in merged(table.keys.iter_from(0), labels.rows)]


def kept(table: Table, labels: LabelsFile) -> int:
    """How many of ``table``'s rows ``labels`` kept."""
    return len(labels.rows) if labels.rows is not None else len(table)


def scan_labeled(root: str, file: str, kinds: dict[str, str] | None = None) -> Scan:
    """The images under ``root`` that the labels file ``file`` lists, sorted by path, with
    their labels and fields (``kinds``: ``read_labels``'); what either side lacks becomes a
    skipped entry.

    Raises:
        FileNotFoundError: ``root`` does not exist.
        NotADirectoryError: ``root`` is a file.
        ValueError: the labels file is not valid (``read_labels``).
    """
    root = source_folder(root)
    table, labels = read_labels(file, kinds, root)
    ignored: dict[str, int] = {}
    present = set(walk_images(root, "", ignored))
    keys = kept_keys(table, labels)
    position = {k: n for n, k in enumerate(keys)}
    listed = set(keys) | {relative(s["path"]) for s in labels.bad}
    skipped = list(labels.bad)
    named = {relative(c) for n, kind in labels.fields.items() if kind.binary
             for c in table.column(table.columns.index(n))}     # a class map's PNG, say
    skipped += [{"path": p, "reason": "not in the labels file", "kind": "unlabelled"}
                for p in sorted(present - listed - named)]
    skipped += [{"path": p, "reason": "in the labels file, not an image in the source folder",
                 "kind": "missing"}
                for p in sorted(set(keys) - present)]
    order = np.array([position[p] for p in sorted(present & set(keys))], np.int64)
    files, targets, values = samples(table, labels, order)
    return Scan(root, labels.names, files, ignored, skipped=skipped, label_kind=labels.kind,
                targets=targets, values=values)
