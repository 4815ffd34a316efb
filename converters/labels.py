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
import os
from dataclasses import dataclass, field

import numpy as np

from fastdata.converters.scan import Files, Scan, walk_images

#: a labels file larger than this is refused before it is parsed
MAX_LABELS_BYTES = 1 << 30


@dataclass
class LabelsFile:
    kind: str                                   # one of fastdata.format.LABEL_KINDS
    names: list[str]                            # classes or target names
    values: dict[str, list[str]]                # path -> its cells after ``path``
    bad: list[dict] = field(default_factory=list)   # rows that cannot be used: path, reason


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
        ValueError: the file is too large, not UTF-8 text, or its header is not
            ``path,label`` or ``path,<name>,...``.
    """
    if os.path.getsize(csv_path) > MAX_LABELS_BYTES:
        raise ValueError(f"labels file {csv_path} is larger than {MAX_LABELS_BYTES} bytes")
    try:
        with open(csv_path, newline="", encoding="utf-8-sig") as f:
            rows = list(csv.reader(f))
    except (UnicodeDecodeError, csv.Error) as e:
        raise ValueError(f"labels file {csv_path} is not a readable CSV ({e})") from None
    header = [h.strip() for h in rows[0]] if rows else []
    names = header[1:]
    if len(header) < 2 or header[0] != "path" or "" in names or len(set(names)) < len(names):
        raise ValueError(f"labels file {csv_path}: the first row must be a header `path,label` "
                         f"or `path,<name>,<name>...` (distinct names), not {header[:5]}")
    values: dict[str, list[str]] = {}
    bad: list[dict] = []
    for line, row in enumerate(rows[1:], 2):
        if not any(c.strip() for c in row):
            continue
        where = f"labels file line {line}"
        path = _relative(row[0])
        if len(row) != len(header):
            bad.append({"path": row[0], "reason": f"{where}: {len(row)} columns, the header "
                                                  f"has {len(header)}"})
        elif path is None:
            bad.append({"path": row[0], "reason": f"{where}: not a path inside the source "
                                                  f"folder"})
        elif path in values:
            bad.append({"path": row[0], "reason": f"{where}: listed again (the first row "
                                                  f"counts)"})
        else:
            values[path] = [c.strip() for c in row[1:]]
    if names == ["label"]:
        return _classes(values, bad)
    return _numbers(names, values, bad)


def _classes(values: dict, bad: list) -> LabelsFile:
    labels = {p: v[0] for p, v in values.items()}
    for p in [p for p, v in labels.items() if not v]:
        bad.append({"path": p, "reason": "labels file: empty label"})
        del labels[p]
    if labels and all(v.isdigit() for v in labels.values()):
        names = [str(i) for i in range(max(int(v) for v in labels.values()) + 1)]
        labels = {p: str(int(v)) for p, v in labels.items()}
    else:
        names = sorted(set(labels.values()))
    return LabelsFile("class", names, {p: [v] for p, v in labels.items()}, bad)


def _numbers(names: list[str], values: dict, bad: list) -> LabelsFile:
    parsed = {}
    for p, cells in values.items():
        try:
            row = [float(c) for c in cells]
        except ValueError:
            bad.append({"path": p, "reason": f"labels file: not numbers: {cells[:5]}"})
            continue
        if not all(np.isfinite(row)):
            bad.append({"path": p, "reason": "labels file: not a finite number"})
            continue
        parsed[p] = row
    multi = all(v in (0.0, 1.0) for row in parsed.values() for v in row)
    return LabelsFile("multi_label" if multi else "regression", names,
                      {p: list(map(str, row)) for p, row in parsed.items()}, bad)


def scan_labeled(root: str, csv_path: str) -> Scan:
    """The images under ``root`` that ``csv_path`` labels, sorted by path, with their labels;
    what either side lacks becomes a skipped entry.

    Raises:
        FileNotFoundError: ``root`` is not a folder.
        ValueError: the labels file is not valid (``read_labels``).
    """
    root = os.path.abspath(root)
    if not os.path.isdir(root):
        raise FileNotFoundError(f"source folder {root!r} does not exist or is not a directory")
    table = read_labels(csv_path)
    ignored: dict[str, int] = {}
    present = set(walk_images(root, "", ignored))
    listed = set(table.values) | {_relative(s["path"]) for s in table.bad}
    skipped = list(table.bad)
    skipped += [{"path": p, "reason": "not in the labels file"}
                for p in sorted(present - listed)]
    skipped += [{"path": p, "reason": "in the labels file, not an image in the source folder"}
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
