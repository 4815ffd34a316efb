"""Labels from a CSV file instead of folder names (``fastdata convert SRC OUT --labels F.csv``).

The first row is a header whose first column is ``path`` (an image's path relative to SRC, in
any layout, flat included); then either

* one column ``label``: a class name or a non-negative integer per image (single-label; the
  classes are the sorted names, or ``0..max`` where every label is an integer, so that an
  integer label is its class index),
* one column per class holding 0 or 1 (multi-label, multi-hot; the header names the classes),
* or columns of numbers (regression targets; the header names them).

Images under SRC that the file does not list, rows whose file is not under SRC, rows listed
twice and rows that do not parse are reported as the manifest's skipped entries, with why.
"""
from __future__ import annotations

import csv
import io
import os
import re
from dataclasses import dataclass, field

import numpy as np

from fastdata.converters.scan import Files, Scan, source_folder, walk_images
from fastdata.converters.units import read_limited

#: a labels file larger than this is refused before it is parsed
MAX_LABELS_BYTES = 1 << 30
#: integer labels are class indices below this: each index up to the largest is a class, so
#: one row's label must not make millions of them
MAX_CLASSES = 1 << 20
_INTEGER = re.compile(r"[0-9]+")


@dataclass
class LabelsFile:
    kind: str                                   # one of fastdata.format.LABEL_KINDS
    names: list[str]                            # classes or target names
    values: dict[str, list[str]]                # path -> its cells after ``path``
    bad: list[dict] = field(default_factory=list)   # rows that cannot be used: path, reason
    lines: dict[str, int] = field(default_factory=dict)     # path -> its line in the file


def _relative(path: str) -> str | None:
    """A CSV path as the scan writes it (relative, normalised), or None where it would leave
    the source folder."""
    path = path.strip().replace("/", os.sep)
    norm = os.path.normpath(path)
    if not path or os.path.isabs(path) or norm == ".." or norm.startswith(".." + os.sep):
        return None
    return norm


def read_labels(csv_path: str) -> LabelsFile:
    """Parse a labels file (see the module's docstring).

    Raises:
        ValueError: the file is not a regular file, too large, not UTF-8 text, its header is
            not ``path,label`` or ``path,<name>,...``, or it mixes integer labels (class
            indices) with others (the first such row named).
    """
    data = read_limited(csv_path, MAX_LABELS_BYTES, "labels file")
    try:
        rows = list(csv.reader(io.StringIO(data.decode("utf-8-sig"), newline="")))
    except (UnicodeDecodeError, csv.Error) as e:
        raise ValueError(f"labels file {csv_path} is not a readable CSV ({e})") from None
    header = [h.strip() for h in rows[0]] if rows else []
    names = header[1:]
    if len(header) < 2 or header[0] != "path" or "" in names or len(set(names)) < len(names):
        raise ValueError(f"labels file {csv_path}: the first row must be a header `path,label` "
                         f"or `path,<name>,<name>...` (distinct names), not {header[:5]}")
    values: dict[str, list[str]] = {}
    lines: dict[str, int] = {}
    bad: list[dict] = []
    for line, row in enumerate(rows[1:], 2):
        if not any(c.strip() for c in row):
            continue
        where = f"labels file line {line}"
        path = _relative(row[0])
        if len(row) != len(header):
            bad.append({"path": row[0], "kind": "bad_label",
                        "reason": f"{where}: {len(row)} columns, the header has {len(header)}"})
        elif path is None:
            bad.append({"path": row[0], "kind": "bad_label",
                        "reason": f"{where}: not a path inside the source folder"})
        elif path in values:
            bad.append({"path": row[0], "kind": "note",
                        "reason": f"{where}: listed again (the first row counts)"})
        else:
            values[path] = [c.strip() for c in row[1:]]
            lines[path] = line
    if names == ["label"]:
        return _classes(csv_path, values, bad, lines)
    return _numbers(names, values, bad, lines)


def _classes(csv_path: str, values: dict, bad: list, lines: dict) -> LabelsFile:
    """Class labels: names (sorted), or class indices where every label is an integer."""
    labels = {p: v[0] for p, v in values.items()}
    for p in [p for p, v in labels.items() if not v]:
        bad.append({"path": p, "reason": f"labels file line {lines[p]}: empty label",
                    "kind": "bad_label"})
        del labels[p]
    integer = {p: bool(_INTEGER.fullmatch(v)) for p, v in labels.items()}
    if labels and any(integer.values()):
        if not all(integer.values()):      # never a silent reordering of integer classes
            odd = next(p for p in labels if not integer[p])
            raise ValueError(f"labels file {csv_path} line {lines[odd]}: label "
                             f"{labels[odd][:40]!r} is not a non-negative integer, while "
                             f"other labels are (class indices): use one kind of label")
        for p in [p for p in labels if int(labels[p]) >= MAX_CLASSES]:
            bad.append({"path": p, "kind": "bad_label",
                        "reason": f"labels file line {lines[p]}: class index "
                                             f"{labels[p][:40]} is not below {MAX_CLASSES}"})
            del labels[p]
        names = [str(i) for i in range(max((int(v) for v in labels.values()), default=-1) + 1)]
        labels = {p: str(int(v)) for p, v in labels.items()}
    else:
        names = sorted(set(labels.values()))
    return LabelsFile("class", names, {p: [v] for p, v in labels.items()}, bad, lines)


def _numbers(names: list[str], values: dict, bad: list, lines: dict) -> LabelsFile:
    """Multi-hot (0 and 1 only) or regression targets, each a float32."""
    parsed = {}
    for p, cells in values.items():
        where = f"labels file line {lines[p]}"
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
    return LabelsFile("multi_label" if multi else "regression", names,
                      {p: list(map(str, row)) for p, row in parsed.items()}, bad, lines)


def scan_labeled(root: str, csv_path: str) -> Scan:
    """The images under ``root`` that ``csv_path`` labels, sorted by path, with their labels;
    what either side lacks becomes a skipped entry.

    Raises:
        FileNotFoundError: ``root`` does not exist.
        NotADirectoryError: ``root`` is a file.
        ValueError: the labels file is not valid (``read_labels``).
    """
    root = source_folder(root)
    table = read_labels(csv_path)
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
    files = Files()
    targets = None
    if table.kind == "class":
        index = {name: k for k, name in enumerate(table.names)}
        for p in paths:
            files.extend([p], index[table.values[p][0]])
    else:
        files.extend(paths, 0)
        targets = np.array([[float(v) for v in table.values[p]] for p in paths],
                           np.float32).reshape(len(paths), len(table.names))
    return Scan(root, table.names, files.freeze(), ignored, skipped=skipped,
                label_kind=table.kind, targets=targets)
