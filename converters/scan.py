"""Walk an ImageFolder-style tree: ``root/<class>/**/<image>``.

Classes are the sorted names of the top-level directories (as torchvision's ImageFolder), files
are matched by extension case-insensitively, nested sub-directories and symlinks (to files and
to directories) are followed, a folder reached twice within a class (a loop, or two links to
it) is walked once, by the first path in name order. Dotfiles/dot-directories, non-image
files, broken links, special files (FIFOs, devices: never opened), unreadable folders and
images directly in ``root`` (in no class) are ignored and counted. A class directory without
images keeps its index (so indices always match sorted folder names, like
``ImageFolder(allow_empty=True)``); the converter reports it as empty. The listing's file
types are used: no ``stat`` per file (but for links), which a network file system makes slow.
"""
from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm

from fastdata.converters.spill import Packed, Spilled, blocks_of
from fastdata.format import IMAGE_EXTENSIONS


class Files(Sequence):
    """The scan's ``(path relative to root, label)`` pairs, in order, packed in unlinked
    temporary files (``Packed`` paths, and the labels) and read back a block at a time, so
    that a conversion's memory does not grow with the number of files. Sequential reads are
    what the converter does; ``files[i]`` costs a few reads."""

    BLOCK = 1 << 14         # files a read brings in

    def __init__(self):
        self._paths, self._labels = Packed(), tempfile.TemporaryFile()

    def extend(self, paths: list[str], label) -> None:
        """``paths``, each with ``label`` (one for all, or one each)."""
        self._paths.append([p.encode("utf-8", "surrogateescape") for p in paths])
        labels = np.broadcast_to(np.asarray(label, np.int32), (len(paths),))
        self._labels.write(np.ascontiguousarray(labels).tobytes())

    def freeze(self) -> Files:
        """Done adding: read from here on."""
        self._paths.flush()
        self._labels.flush()
        return self

    def __len__(self) -> int:
        return len(self._paths)

    def _block(self, a: int, b: int) -> list[tuple[str, int]]:
        """Entries ``a`` to ``b - 1``."""
        paths = self._paths.block(a, b)
        labels = np.frombuffer(os.pread(self._labels.fileno(), 4 * len(paths), 4 * a),
                               np.int32).tolist()
        return [(p.decode("utf-8", "surrogateescape"), label)
                for p, label in zip(paths, labels)]

    def __getitem__(self, i):
        n = len(self)
        if isinstance(i, slice):
            a, b, step = i.indices(n)
            if step != 1:
                return self._block(0, n)[i]
            return self._block(a, max(a, b))
        i = range(n)[i]
        return self._block(i, i + 1)[0]

    def iter_from(self, first: int):
        """The entries from position ``first`` on."""
        for a in range(first, len(self), self.BLOCK):
            yield from self._block(a, min(a + self.BLOCK, len(self)))

    def __iter__(self):
        return self.iter_from(0)


class FieldValues:
    """The fields' values of a scan's files, in the scan's order: one column per field, packed
    as a shard's column holds them (an array a value, or each value's bytes) in unlinked
    temporary files (``Spilled``, ``Packed``) and read back a block at a time, so that they
    take no memory of their own whatever their number."""

    def __init__(self, fields: dict):
        self.fields = dict(fields)
        self.columns = [Spilled(kind.dtype, kind.shape) if kind.fixed else Packed()
                        for kind in self.fields.values()]

    @classmethod
    def of(cls, fields: dict, rows) -> FieldValues:
        """``rows``: each file's parsed values, in ``fields``' order."""
        out = cls(fields)
        for r in rows:
            out.add(r)
        return out

    def add(self, values: tuple) -> None:
        """The next file's parsed values, in ``fields``' order."""
        for kind, value, column in zip(self.fields.values(), values, self.columns):
            column.append([kind.to_bytes(value)] if not kind.fixed else
                          np.asarray(value, kind.dtype).reshape(1, *kind.shape))

    def add_stored(self, stored: tuple[bytes, ...]) -> None:
        """The next file's values of variable-length kinds, as their columns store them (made
        by ``kind.to_bytes`` elsewhere: in a pool's processes)."""
        for column, data in zip(self.columns, stored):
            column.append([data])

    def __len__(self) -> int:
        return len(self.columns[0]) if self.columns else 0

    def rows(self, a: int, b: int) -> list[tuple]:
        """The values of files ``a`` to ``b - 1``, a tuple per file."""
        from fastdata.fields import Column

        b = min(b, len(self))
        columns = []
        for kind, column in zip(self.fields.values(), self.columns):
            if kind.fixed:
                values = kind.read(Column(column.block(a, b)), np.arange(b - a))
            else:
                blobs = column.block(a, b)
                offsets = np.zeros(len(blobs) + 1, np.int64)
                np.cumsum([len(x) for x in blobs], out=offsets[1:])
                values = kind.read(Column(np.frombuffer(b"".join(blobs), np.uint8), offsets),
                                   np.arange(len(blobs)))
            columns.append(values)
        return list(zip(*columns)) if columns else [() for _ in range(a, max(a, b))]

    def iter_from(self, first: int, block: int = 1 << 12):
        """The values of the files from position ``first`` on, a tuple per file."""
        for a in range(first, len(self), block):
            yield from self.rows(a, a + block)

    def take(self, order) -> FieldValues:
        """These values in the order ``order`` (positions; an array, or a ``Spilled`` of
        them) gives: their stored records and bytes copied, not parsed again."""
        out = FieldValues(self.fields)
        for positions in blocks_of(order):
            for p in positions.tolist():
                for column, into in zip(self.columns, out.columns):
                    into.append(column.block(p, p + 1))
        return out

    def digest(self) -> bytes:
        """What a conversion's fingerprint takes of them: the kinds and every value."""
        import hashlib

        from fastdata.fields.schema import entries

        h = hashlib.sha256(repr(entries(self.fields)).encode())
        for c in self.columns:
            c.hash_into(h)
        return h.digest()


@dataclass
class Scan:
    root: str
    classes: list[str]                      # class names, or a labels file's target names
    files: Files                            # (path relative to root, label), sorted
    ignored: dict[str, int] = field(default_factory=dict)   # reason -> count
    #: what a labels file leaves out, as the manifest's ``skipped`` entries (path, reason)
    skipped: list[dict] = field(default_factory=list)
    label_kind: str = "class"               # see fastdata.format.LABEL_KINDS
    #: (files, K) float32 targets of a multi-label or regression labels file, else None
    targets: np.ndarray | None = None
    #: a segmentation set's class maps: (their folder, a digest of their sizes and times)
    masks: tuple[str, str] | None = None
    #: the files' fields (a labels file's other columns), else None
    values: FieldValues | None = None
    #: where the images are when they are not the files ``root/path`` (a tar's members, a
    #: parquet file's cells: ``fastdata.converters.sources.base.Images``), else None; the
    #: paths are then the samples' keys
    images: Any = None

    @property
    def fields(self) -> dict:
        """The files' fields: name -> kind (``fastdata.fields``)."""
        return {} if self.values is None else self.values.fields

    def shuffled(self, seed: int = 0) -> Scan:
        """This scan with its files (and targets) in an order drawn from ``seed`` (shards
        that mix the classes)."""
        perm = np.random.default_rng([seed, 5]).permutation(len(self.files))
        files = Files()
        for k in perm.tolist():
            path, label = self.files[k]
            files.extend([path], label)
        targets = None if self.targets is None else self.targets[perm]
        values = None if self.values is None else self.values.take(perm)
        images = None if self.images is None else self.images.take(perm)
        return dataclasses.replace(self, files=files.freeze(), targets=targets, values=values,
                                   images=images)

    def labels_as_field(self) -> Scan:
        """This scan with its multi-label or regression targets moved into the field
        ``label``, the first of its fields (``fastdata.format.LABEL_FIELDS``): the shards
        hold them."""
        if self.targets is None:
            return self
        from fastdata.fields import field_of
        from fastdata.format import LABEL_FIELDS, label_params

        kind = field_of(LABEL_FIELDS[self.label_kind],
                        **label_params(self.label_kind, self.classes))
        values = FieldValues({"label": kind, **self.fields})
        if self.values is not None:     # the other fields' columns as they are
            values.columns[1:] = self.values.columns
        for block in blocks_of(self.targets):
            values.columns[0].append(block)
        return dataclasses.replace(self, targets=None, values=values)


def walk_images(folder: str, rel: str, ignored: dict[str, int], *,
                others: frozenset[str] = frozenset()) -> list[str]:
    """The image files under ``folder``, as paths ``rel`` + their path from it (unsorted);
    what is not one is counted in ``ignored`` by reason. ``others``: the real paths of folders
    another walk owns (the source folder, the other classes), which a link inside this one
    must not bring in (a folder outside them that several classes link is in each)."""
    found: list[str] = []
    seen: set[str] = set()
    stack = [(folder, rel)]    # (folder, its path from the root)
    while stack:
        folder, rel = stack.pop()
        real = os.path.realpath(folder)
        if real in others:          # a link to the source folder or to another class
            ignored["link to a folder of another class"] = \
                ignored.get("link to a folder of another class", 0) + 1
            continue
        if real in seen:            # a symlink loop, or a folder linked twice: walked once
            continue
        seen.add(real)
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError:
            ignored["unreadable folder"] = ignored.get("unreadable folder", 0) + 1
            continue
        subfolders = []
        for e in entries:   # types from the directory listing: no stat but for links
            if e.name.startswith("."):
                reason = "hidden"
            elif e.is_dir():            # links followed, as os.walk(followlinks=True)
                subfolders.append(e.name)
                continue
            elif not e.name.lower().endswith(IMAGE_EXTENSIONS):
                reason = "not an image extension"
            elif e.is_file():
                found.append(rel + e.name)
                continue
            elif e.is_symlink() and not os.path.exists(e.path):
                reason = "broken link"
            else:               # a FIFO, a socket, a device: never opened
                reason = "not a regular file"
            ignored[reason] = ignored.get(reason, 0) + 1
        stack += [(os.path.join(folder, d), rel + d + os.sep)     # popped in name order
                  for d in sorted(subfolders, reverse=True)]
    return found


def source_folder(root: str) -> str:
    """``root`` as an absolute path, checked to be a folder.

    Raises:
        FileNotFoundError: it does not exist.
        NotADirectoryError: it is a file (named, with what a source is).
    """
    root = os.path.abspath(root)
    if os.path.isdir(root):
        return root
    if not os.path.lexists(root):
        raise FileNotFoundError(f"source folder {root!r} does not exist")
    raise NotADirectoryError(f"source {root!r} is a file, not a folder: convert reads a folder "
                             f"of images (root/<class>/<images>, or any layout with --labels "
                             f"FILE.csv)")


def scan_folder(root: str, *, progress: bool = False) -> Scan:
    root = source_folder(root)
    entries = [e for e in os.scandir(root) if not e.name.startswith(".")]
    classes = sorted(e.name for e in entries if e.is_dir())
    loose = sum(e.name.lower().endswith(IMAGE_EXTENSIONS) for e in entries if not e.is_dir())
    if not classes:
        found = f"; it holds {loose} image{'' if loose == 1 else 's'} directly: move them into " \
            f"class folders, or give their labels with --labels FILE.csv (a header " \
            f"`path,label`, a row per image)" if loose else ""
        raise ValueError(f"no class directories in {root!r}: expected root/<class>/<images> "
                         f"(the ImageFolder layout){found}")
    ignored: dict[str, int] = {}
    if loose:       # as ImageFolder: they belong to no class (counted, so the summary shows it)
        ignored["image outside the class directories"] = loose
    files = Files()
    # ImageNet: 1.28M files to list before the first image is decoded
    bar = tqdm(total=len(classes), unit="class", desc="scan", disable=not progress,
               dynamic_ncols=True)
    # a folder belongs to one class: a link inside a class to the source folder or another
    # class brings in nothing (it made a class hold every other one's images)
    owned = {os.path.realpath(root)} | {os.path.realpath(os.path.join(root, c)) for c in classes}
    for label, name in enumerate(classes):
        own = os.path.realpath(os.path.join(root, name))
        files.extend(sorted(walk_images(os.path.join(root, name), name + os.sep, ignored,
                                        others=frozenset(owned - {own}))), label)
        bar.update(1)
    bar.close()
    return Scan(root, classes, files.freeze(), ignored)
