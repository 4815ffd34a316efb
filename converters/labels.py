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

import logging
import re
from dataclasses import dataclass, field

import numpy as np

from fastdata.converters.scan import FieldValues, Files, Scan, source_folder, walk_images
from fastdata.converters.table import Table, read_table, relative
from fastdata.fields import FieldError, FieldKind
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
    kind: str                                   # one of fastdata.format.LABEL_KINDS
    names: list[str]                            # classes or target names
    values: dict[str, list[str]]                # path -> its label's cells
    bad: list[dict] = field(default_factory=list)   # rows that cannot be used: path, reason
    lines: dict[str, int] = field(default_factory=dict)     # path -> its line in the file
    fields: dict[str, FieldKind] = field(default_factory=dict)  # the other columns' kinds
    #: path -> its fields' parsed values, in ``fields``' order
    field_values: dict[str, tuple] = field(default_factory=dict)


def _relative(path: str) -> str | None:
    return relative(path)


def read_labels(file: str, kinds: dict[str, str] | None = None) -> LabelsFile:
    """Parse a labels file (see the module's docstring). ``kinds``: a column's kind by name
    (``--field NAME=KIND``), where not inferred.

    Raises:
        ValueError: the file is not a labels file (``read_table``), or its columns are not
            labels and fields (``labels_of``).
    """
    return labels_of(read_table(file), kinds)


def labels_of(table: Table, kinds: dict[str, str] | None = None) -> LabelsFile:
    """A table's columns as labels and fields (see the module's docstring): any table, a
    labels file's or a source's own columns (``fastdata.converters.sources``).

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
        return LabelsFile("none", [], {p: [] for p in table.rows}, list(table.bad),
                          table.lines)
    values = {p: [str(c).strip() if c is not None else "" for c in v]
              for p, v in table.rows.items()}
    if not kinds and table.columns == ["label"]:
        return _classes(table, values, list(table.bad))
    if not kinds and "label" not in table.columns and _all_numbers(table):
        return _numbers(table, values)
    return _with_fields(table, kinds)


def _all_numbers(table: Table) -> bool:
    """Whether most cells of each column are numbers: a multi-label or regression file, where
    a cell that is not one skips its row."""
    def number(c) -> bool:
        return (isinstance(c, (int, float)) and not isinstance(c, bool)) or (
            isinstance(c, str) and _NUMBER.fullmatch(c.strip()) is not None)

    rows = list(table.rows.values())
    return bool(rows) and all(2 * sum(number(r[k]) for r in rows) > len(rows)
                              for k in range(len(table.columns)))


def _with_fields(table: Table, kinds: dict[str, str]) -> LabelsFile:
    """A ``label`` column (if any) as the class label, every other column a field."""
    fields = {}
    for k, name in enumerate(table.columns):
        if name == "label":
            continue
        check_name(name, f"{table.what}: column")
        cells = [row[k] for row in table.rows.values() if row[k] is not None]
        fields[name] = (kind_named(kinds[name], cells) if name in kinds else
                        table.known[name] if name in table.known else infer(name, cells))
    bad, parsed = list(table.bad), {}
    for path, row in table.rows.items():
        try:
            parsed[path] = tuple(kind.parse(_cell(row[table.columns.index(n)]),
                                            table.where(path, n)) for n, kind in fields.items())
        except FieldError as e:
            bad.append({"path": path, "kind": "bad_label", "reason": str(e)})
    if "label" not in table.columns:
        return LabelsFile("none", [], {p: [] for p in parsed}, bad, table.lines, fields,
                          parsed)
    at = table.columns.index("label")
    values = {p: [str(_cell(table.rows[p][at])).strip()] for p in parsed}
    out = _classes(table, values, bad)
    out.fields, out.field_values = fields, {p: parsed[p] for p in out.values}
    return out


def _cell(cell):
    """A missing value (a parquet null, a JSON null) as an empty cell."""
    return "" if cell is None else cell


def _classes(table: Table, values: dict, bad: list) -> LabelsFile:
    """Class labels: names (sorted), or class indices where every label is an integer; the
    table's own class names (``table.classes``, a Hugging Face ``ClassLabel``'s) where it has
    them."""
    labels = {p: v[0] for p, v in values.items()}
    for p in [p for p, v in labels.items() if not v]:
        bad.append({"path": p, "reason": f"{table.where(p)}: empty label", "kind": "bad_label"})
        del labels[p]
    if table.classes is not None:
        names = list(table.classes)
    elif any(_INTEGER.fullmatch(v) for v in labels.values()):
        names = _indices(table, labels, bad)
    else:
        names = sorted(set(labels.values()))
        if len(labels) >= 20 and len(names) == len(labels):
            log.warning("%s: each of its %d images has a label of its own, so each is a "
                        "class: if the column holds captions or other text, name it after "
                        "what it holds (e.g. caption), and it becomes a text field",
                        table.what, len(labels))
    return LabelsFile("class", names, {p: [v] for p, v in labels.items()}, bad, table.lines)


def _indices(table: Table, labels: dict[str, str], bad: list) -> list[str]:
    """Integer labels as class indices (``labels`` rewritten in place, those too large
    dropped into ``bad``): the classes ``0..max``.

    Raises:
        ValueError: a label that is not an integer among them (never a silent reordering).
    """
    odd = next((p for p, v in labels.items() if not _INTEGER.fullmatch(v)), None)
    if odd is not None:
        raise ValueError(f"{table.where(odd)}: label {labels[odd][:40]!r} is not a "
                         f"non-negative integer, while other labels are (class indices): "
                         f"use one kind of label")
    for p in [p for p in labels if int(labels[p]) >= MAX_CLASSES]:
        bad.append({"path": p, "kind": "bad_label",
                    "reason": f"{table.where(p)}: class index {labels[p][:40]} is not "
                              f"below {MAX_CLASSES}"})
        del labels[p]
    for p, v in labels.items():
        labels[p] = str(int(v))
    return [str(i) for i in range(max((int(v) for v in labels.values()), default=-1) + 1)]


def _numbers(table: Table, values: dict) -> LabelsFile:
    """Multi-hot (0 and 1 only) or regression targets, each a float32."""
    parsed, bad = {}, list(table.bad)
    for p, cells in values.items():
        where = table.where(p)
        try:
            row = [float(c) for c in cells]
        except ValueError:
            bad.append({"path": p, "reason": f"{where}: not numbers: {cells[:5]}",
                        "kind": "bad_label"})
            continue
        if not np.isfinite(row).all():
            bad.append({"path": p, "reason": f"{where}: not a finite number",
                        "kind": "bad_label"})
            continue
        with np.errstate(over="ignore"):
            fits = np.isfinite(np.asarray(row, np.float32)).all()
        if not fits:        # stored as float32: 1e39 would be inf, a damaged set
            bad.append({"path": p, "kind": "bad_label",
                        "reason": f"{where}: a number beyond float32's range "
                                  f"(about ±3.4e38)"})
            continue
        parsed[p] = row
    multi = all(v in (0.0, 1.0) for row in parsed.values() for v in row)
    return LabelsFile("multi_label" if multi else "regression", list(table.columns),
                      {p: list(map(str, row)) for p, row in parsed.items()}, bad, table.lines)


def samples(labels: LabelsFile, keys: list[str]) -> tuple[Files, np.ndarray | None,
                                                          FieldValues | None]:
    """The samples ``keys`` (each in ``labels.values``, in their order): their keys and
    class labels, their targets (multi-label and regression) and their fields' values."""
    files = Files()
    if labels.kind == "class":
        index = {name: k for k, name in enumerate(labels.names)}
        for p in keys:
            files.extend([p], index[labels.values[p][0]])
    else:
        files.extend(keys, 0)
    targets = None
    if labels.kind in ("multi_label", "regression"):
        targets = np.array([[float(v) for v in labels.values[p]] for p in keys],
                           np.float32).reshape(len(keys), len(labels.names))
    values = (FieldValues.of(labels.fields, [labels.field_values[p] for p in keys])
              if labels.fields else None)
    return files.freeze(), targets, values


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
    table = read_labels(file, kinds)
    ignored: dict[str, int] = {}
    present = set(walk_images(root, "", ignored))
    listed = set(table.values) | {_relative(s["path"]) for s in table.bad}
    skipped = list(table.bad)
    skipped += [{"path": p, "reason": "not in the labels file", "kind": "unlabelled"}
                for p in sorted(present - listed)]
    skipped += [{"path": p, "reason": "in the labels file, not an image in the source folder",
                 "kind": "missing"}
                for p in sorted(set(table.values) - present)]
    paths = sorted(present & set(table.values))
    files, targets, values = samples(table, paths)
    return Scan(root, table.names, files, ignored, skipped=skipped, label_kind=table.kind,
                targets=targets, values=values)
