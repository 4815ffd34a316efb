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

import array
import dataclasses
import itertools
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm

from fastdata.format import IMAGE_EXTENSIONS


class Packed:
    """Byte strings appended in order and packed in two unlinked temporary files (their bytes,
    where each ends), read back a block at a time: a list whose memory does not grow with its
    length. Appends gather in memory and go to the files ``PENDING`` at a time; ``block(a,
    b)`` costs three reads."""

    PENDING = 1 << 12

    def __init__(self):
        self._bytes, self._ends = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        self._n = self._nbytes = 0
        self._pending: list[bytes] = []

    def append(self, blobs: list[bytes]) -> None:
        self._pending += blobs
        self._n += len(blobs)
        if len(self._pending) >= self.PENDING:
            self.flush()

    def flush(self) -> Packed:
        """Write what is pending (before a read)."""
        if self._pending:
            self._bytes.write(b"".join(self._pending))
            self._ends.write(array.array("q", itertools.accumulate(
                map(len, self._pending), initial=self._nbytes))[1:].tobytes())
            self._nbytes += sum(map(len, self._pending))
            self._pending = []
        for f in (self._bytes, self._ends):
            f.flush()
        return self

    def __len__(self) -> int:
        return self._n

    def block(self, a: int, b: int) -> list[bytes]:
        """Entries ``a`` to ``b - 1``."""
        b = min(b, self._n)
        if a >= b:
            return []
        if self._pending:
            self.flush()
        ends = np.frombuffer(os.pread(self._ends.fileno(), 8 * (b - a), 8 * a), np.int64)
        start = 0 if a == 0 else int(np.frombuffer(os.pread(self._ends.fileno(), 8,
                                                            8 * (a - 1)), np.int64)[0])
        blob = os.pread(self._bytes.fileno(), int(ends[-1]) - start, start)
        cuts = [0, *(ends - start).tolist()]
        return [blob[cuts[k]:cuts[k + 1]] for k in range(b - a)]

    def iter_from(self, first: int, block: int = 1 << 14):
        for a in range(first, self._n, block):
            yield from self.block(a, a + block)


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
    """The fields' values of a scan's files, in the scan's order: one column per field
    (``fastdata.fields.Column``: the packed form a shard stores, not a Python object per
    value), memory-mapped from unlinked temporary files as ``FieldValues.build`` writes
    them."""

    def __init__(self, fields: dict, columns: list):
        self.fields, self.columns = dict(fields), columns

    @classmethod
    def build(cls, fields: dict) -> _ValuesBuilder:
        """A builder: ``add(values)`` a file's parsed values (in ``fields``' order) at a
        time, ``done()`` the ``FieldValues``."""
        return _ValuesBuilder(fields)

    @classmethod
    def of(cls, fields: dict, rows) -> FieldValues:
        """``rows``: each file's parsed values, in ``fields``' order."""
        builder = cls.build(fields)
        for r in rows:
            builder.add(r)
        return builder.done()

    def __len__(self) -> int:
        return len(self.columns[0]) if self.columns else 0

    def rows(self, a: int, b: int) -> list[tuple]:
        """The values of files ``a`` to ``b - 1``, a tuple per file."""
        return self.at(np.arange(a, b))

    def at(self, positions: np.ndarray) -> list[tuple]:
        """The values of the files at ``positions``, a tuple per file."""
        columns = [kind.read(c, positions) for kind, c in zip(self.fields.values(),
                                                              self.columns)]
        return list(zip(*columns)) if columns else [() for _ in positions]

    def iter_from(self, first: int, block: int = 1 << 12):
        """The values of the files from position ``first`` on, a tuple per file."""
        for a in range(first, len(self), block):
            yield from self.rows(a, min(len(self), a + block))

    def take(self, order: np.ndarray, block: int = 1 << 12) -> FieldValues:
        """These values in the order ``order`` (positions) gives."""
        builder = FieldValues.build(self.fields)
        for a in range(0, len(order), block):
            for row in self.at(np.asarray(order[a:a + block])):
                builder.add(row)
        return builder.done()

    def digest(self) -> bytes:
        """What a conversion's fingerprint takes of them: the kinds and every value."""
        import hashlib

        from fastdata.fields.schema import entries

        h = hashlib.sha256(repr(entries(self.fields)).encode())
        for c in self.columns:
            h.update(np.ascontiguousarray(c.values).view(np.uint8).data)
            if c.offsets is not None:
                h.update(c.offsets.tobytes())
        return h.digest()


class _ValuesBuilder:
    """``FieldValues`` written a file at a time: each field's values packed as its shard
    column holds them (an array a value, or bytes and where each ends) into unlinked
    temporary files, memory-mapped when done."""

    def __init__(self, fields: dict):
        self.fields = dict(fields)
        self.files = [(tempfile.TemporaryFile(), None if kind.fixed else Packed())
                      for kind in self.fields.values()]
        self.n = 0

    def add(self, values: tuple) -> None:
        for kind, value, (f, packed) in zip(self.fields.values(), values, self.files):
            if packed is None:
                f.write(np.asarray(value, kind.dtype).reshape(kind.shape).tobytes())
            else:
                packed.append([kind.to_bytes(value)])
        self.n += 1

    def done(self) -> FieldValues:
        from fastdata.fields import Column

        columns = []
        for kind, (f, packed) in zip(self.fields.values(), self.files):
            if packed is None:
                columns.append(Column(_mapped(f, kind.dtype, (self.n, *kind.shape))))
                continue
            packed.flush()
            ends = _mapped(packed._ends, np.dtype(np.int64), (self.n,))
            columns.append(Column(_mapped(packed._bytes, np.dtype(np.uint8),
                                          (int(ends[-1]) if self.n else 0,)),
                                  np.concatenate([np.zeros(1, np.int64), ends])))
        return FieldValues(self.fields, columns)


def _mapped(f, dtype: np.dtype, shape: tuple) -> np.ndarray:
    """The temporary file ``f``'s values as a read-only array of ``shape`` (mapped, so that
    they take no memory of their own)."""
    f.flush()
    if not int(np.prod(shape)) or not dtype.itemsize:
        return np.zeros(shape, dtype)
    return np.memmap(f, dtype=dtype, mode="r", shape=shape)


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
    #: a detection set's annotations (``fastdata.converters.coco.Coco``), else None
    coco: Any = None
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
