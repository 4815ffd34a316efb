"""Shard writers: one ``ShardWriter`` per container, registered by container name.

The converter opens a writer per shard, ``add``s each sample as its worker returns it and
``finish``es it, which writes labels, checksums and metadata into a fresh temporary file
(``<file>.tmp-XXXXXXXX``, made with ``O_EXCL | O_NOFOLLOW``: no link planted in the folder is
written through) and renames it into place, so a shard file on disk is always complete. Raw
pixels go into the file as they come, a batch at a time (``write_pending``), straight from the
workers' ring slots (no shard held in memory, no long serial write at the end of each shard
while the workers wait); JPEG payloads, whose total size is known only at the end, are kept
until then. Layouts are documented in ``fastdata.format``.

Raw HDF5 pixels that fill whole pages (64 px and up) are written with ``O_DIRECT``: the disk
reads them from the ring itself, with no copy into the page cache, which was the writer's
main cost. The pixels are on the disk when a conversion returns, and a conversion larger than
memory does not push everything else out of the cache.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import shutil

import numpy as np

from fastdata.format import (
    LMDB_LABELS,
    LMDB_META,
    LMDB_OPTIONS,
    PAGE,
    ShardMeta,
    lmdb_crc_key,
    lmdb_field_key,
    lmdb_key,
    shard_checksum,
)
from fastdata.outdir import temp_path

# raw LMDB: payload bytes per transaction, about (at least one sample). LMDB copies each value
# into pages it mallocs and frees them all at the commit: kept under glibc's trim threshold
# (128 KiB, or twice the largest block it has mapped and freed), they are reused, where a
# larger transaction's went back to the OS at each commit and the next one's faulted in anew
COMMIT_BYTES = 64 << 10
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


#: container name -> its writer (``register``), as ``fastdata.shards.READERS`` for readers
WRITERS: dict[str, type[ShardWriter]] = {}


def register(cls: type[ShardWriter]) -> type[ShardWriter]:
    """Class decorator: ``cls`` writes the shards of its ``container``."""
    WRITERS[cls.container] = cls
    return cls


class ShardWriter:
    """One shard, written to a temporary file beside ``path``: ``add`` at most ``capacity``
    samples, then ``finish`` (or ``abort``)."""
    container: str = ""

    def __init__(self, path: str, *, sizes: tuple[int, ...], encoding: str, capacity: int,
                 fields: dict | None = None):
        """``fields``: the set's fields (name -> ``fastdata.fields.FieldKind``), whose values
        each ``add`` gives in that order."""
        self.path, self.tmp = path, temp_path(path)
        self.sizes, self.encoding, self.capacity = sizes, encoding, capacity
        self.fields = dict(fields or {})
        self.values: list[list] = [[] for _ in self.fields]
        self._columns: list | None = None
        self.labels: list[int] = []
        self.crcs = {s: np.zeros(capacity, np.uint32) for s in sizes}
        self.encoded: dict[int, list[bytes]] = {s: [] for s in sizes}    # JPEG, until finish
        with self._cleanup():
            self._begin()

    def __len__(self) -> int:
        return len(self.labels)

    def add(self, label: int, payloads, crcs, values=()) -> None:
        """One sample: a payload per size (bytes, or uint8 arrays that stay as they are until
        ``write_pending()`` or ``finish()`` returns) and its fields' parsed ``values``."""
        i = len(self.labels)
        if i == self.capacity:
            raise ValueError(f"{self.tmp}: shard is full ({self.capacity} samples)")
        if len(values) != len(self.fields):
            raise ValueError(f"{len(values)} field values for the {len(self.fields)} fields")
        for column, v in zip(self.values, values):
            column.append(v)
        with self._cleanup():
            if self.encoding == "raw":
                self._put(i, payloads)
            else:
                for s, p in zip(self.sizes, payloads):
                    self.encoded[s].append(p)
        for s, c in zip(self.sizes, crcs):
            self.crcs[s][i] = c
        self.labels.append(label)

    def write_pending(self) -> None:
        """Write the payloads ``add`` has kept back, if any."""

    def columns(self) -> list:
        """Each field's column (``fastdata.fields.Column``) of the samples added, packed once
        they are all added (at ``checksum`` or ``finish``)."""
        if self._columns is None:
            self._columns = [kind.pack(v) for kind, v in zip(self.fields.values(), self.values)]
            self.values = [[] for _ in self.fields]
        return self._columns

    def checksum(self) -> str:
        return shard_checksum(self.labels, [self.crcs[s][: len(self)] for s in self.sizes],
                              self.columns())

    def finish(self, meta: ShardMeta, options: dict | None = None, *, place: bool = True) -> int:
        """Complete the shard and rename it into place; return its size in bytes. ``options``:
        the conversion's, kept beside ``meta`` (see ``options``). ``place=False``: left
        complete at ``self.tmp``, for ``place()`` once its ``meta`` is known."""
        # written as a draft (its place in the set left out), then placed: the same steps
        # whichever engine writes (a Ray task does not know the place), so that every engine
        # writes the same bytes
        draft = dataclasses.replace(meta, index=0, start=0, sources=(0, 0), skipped=[])
        with self._cleanup():
            self.write_pending()
            self._finish(draft, json.dumps(options or {}, sort_keys=True))
            if not place:
                return os.path.getsize(self.tmp)
            return self.place(self.tmp, self.path, meta)

    @classmethod
    def place(cls, tmp: str, path: str, meta: ShardMeta) -> int:
        """A shard that ``finish(place=False)`` left at ``tmp``: ``meta`` written into it, then
        renamed to ``path``; returns its size in bytes."""
        cls._rewrite_meta(tmp, meta)
        os.replace(tmp, path)
        return os.path.getsize(path)

    @staticmethod
    def _rewrite_meta(path: str, meta: ShardMeta) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        """Drop the partial file (an interrupted or failed run)."""
        self._close()
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.tmp)

    @contextlib.contextmanager
    def _cleanup(self):
        try:
            yield
        except BaseException as e:      # e.g. a full disk: no partial file left taking space
            self.abort()
            # h5py reports a failed write at its close as a RuntimeError with the errno inside
            if _is(e, errno.ENOSPC):
                free = shutil.disk_usage(os.path.dirname(self.path)).free >> 20
                raise OSError(errno.ENOSPC, f"no space left on the device to write "
                              f"{os.path.basename(self.path)} ({free} MiB free); the shards "
                              f"before it are complete: make room, then run the same "
                              f"command with --resume") from e
            if _is(e, errno.EFBIG):     # h5py's message runs over several lines
                raise OSError(errno.EFBIG, f"{os.path.basename(self.path)} would be larger "
                              f"than this process may write (the file-size limit, `ulimit "
                              f"-f`, or the file system's largest file): raise it, or convert "
                              f"with a smaller --shard-size; then the same command with "
                              f"--resume") from e
            raise

    def _begin(self) -> None:
        raise NotImplementedError

    def _put(self, i: int, payloads) -> None:
        """Raw payloads of sample ``i`` into the file."""
        raise NotImplementedError

    def _finish(self, meta: ShardMeta, options: str) -> None:
        raise NotImplementedError

    @staticmethod
    def options(path: str) -> str:
        """The options JSON that the shard at ``path`` was written with."""
        raise NotImplementedError

    def _close(self) -> None:
        pass


def _meta_record(text: str, length: int | None = None) -> np.bytes_:
    """An HDF5 shard's metadata as a fixed-length record, blank-padded to ``length``
    (default: with room for the place in the set that ``place()`` writes in later): the
    rewrite then changes bytes in place, the same ones whichever engine wrote the shard, and
    needs no room on the disk."""
    data = text.encode()
    if length is None:
        length = -(-(len(data) + 512) // 512) * 512
    return np.bytes_(data.ljust(length))


def _is(e: BaseException, code: int) -> bool:
    """Whether ``e`` is the OS error ``code``: an OSError, or h5py's RuntimeError or OSError
    with the errno inside its message."""
    return (isinstance(e, OSError) and e.errno == code) or (
        isinstance(e, (OSError, RuntimeError)) and f"errno = {code}," in str(e))


def _allocate(fd: int, offset: int, length: int) -> None:
    """Disk blocks for a byte range of ``fd`` before it is written: a full disk is an OSError
    when the shard starts, not a failure halfway; and ext4 writes into allocated blocks with
    less CPU than into a sparse range. A file system (or OS) that cannot allocate ahead is left
    sparse."""
    try:
        if hasattr(os, "posix_fallocate"):      # not on macOS
            os.posix_fallocate(fd, offset, length)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            raise


def _open_direct(path: str) -> int | None:
    """A second descriptor of ``path`` that writes around the page cache (``O_DIRECT``), or
    ``None`` where the OS or file system has none (macOS, tmpfs before Linux 6.6)."""
    try:
        return os.open(path, os.O_WRONLY | os.O_DIRECT | _NOFOLLOW)
    except (AttributeError, OSError):
        return None


def _pwrite_all(fd: int, buffers, offset: int, fallback: int | None = None) -> None:
    """``buffers`` one after another from ``offset`` on, in as few system calls as the OS takes
    (a call per sample costs CPU). What an ``O_DIRECT`` ``fd`` refuses (``EINVAL``: memory
    off a page boundary, the rest of a write the OS cut short, a file system that opens files
    that way but does not write them so) goes through ``fallback``."""
    views = [memoryview(b).cast("B") for b in buffers]
    while views:
        try:
            n = os.pwritev(fd, views[:512], offset)     # IOV_MAX is 1024 on Linux
        except OSError as e:
            if e.errno != errno.EINVAL or fallback is None:
                raise
            fd, fallback = fallback, None
            continue
        offset += n
        while views and n >= len(views[0]):
            n -= len(views.pop(0))
        if n:
            views[0] = views[0][n:]


@register
class HDF5Writer(ShardWriter):
    container = "hdf5"
    _fd = _direct = None

    def _begin(self):
        self._pending: list = []    # raw payloads of the samples added last, written together
        if self.encoding != "raw":
            return
        import h5py

        # datasets allocated now and never filled: raw pixels are written at their offsets
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
        dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
        # a private name (see the reader); big datasets on page boundaries, for O_DIRECT
        with h5py.File(self.tmp, "w", locking=False, alignment_threshold=PAGE,
                       alignment_interval=PAGE) as f:
            self._offsets = {s: f.create_dataset(f"images/{s}", (self.capacity, s, s, 3), np.uint8,
                                                 dcpl=dcpl, track_times=False).id.get_offset()
                             for s in self.sizes}
        self._fd = os.open(self.tmp, os.O_WRONLY | _NOFOLLOW)
        self._direct = _open_direct(self.tmp)
        for s in self.sizes:
            _allocate(self._fd, self._offsets[s], self.capacity * 3 * s * s)

    def _put(self, i, payloads):
        self._pending.append(payloads)

    def write_pending(self):
        if not self._pending:
            return
        first = len(self) - len(self._pending)
        with self._cleanup():
            for k, s in enumerate(self.sizes):
                offset = self._offsets[s] + first * 3 * s * s
                direct = self._direct is not None and not offset % PAGE and not 3 * s * s % PAGE
                _pwrite_all(self._direct if direct else self._fd, [p[k] for p in self._pending],
                            offset, fallback=self._fd if direct else None)
        self._pending = []

    def _close(self):
        self._pending = []
        for fd in (self._fd, self._direct):
            if fd is not None:
                os.close(fd)
        self._fd = self._direct = None

    @staticmethod
    def options(path):
        import h5py

        with h5py.File(path, "r", locking=False) as f:
            return f.attrs["options"]

    def _finish(self, meta, options):
        import h5py

        self._close()
        n = len(self)
        if self.encoding == "raw" and n < self.capacity:
            self._shrink(n)
        with h5py.File(self.tmp, "r+" if self.encoding == "raw" else "w", locking=False) as f:
            f.attrs["meta"] = _meta_record(meta.to_json())
            f.attrs["options"] = options
            f.create_dataset("labels", data=np.asarray(self.labels, np.int64), track_times=False)
            for s in self.sizes:     # no chunks, no compression: contiguous, memory-mappable
                if self.encoding == "jpeg":
                    lens = np.fromiter(map(len, self.encoded[s]), np.int64, n)
                    offsets = np.concatenate([[0], np.cumsum(lens)])
                    flat = np.frombuffer(b"".join(self.encoded[s]), np.uint8)
                    f.create_dataset(f"jpeg/{s}", data=flat, track_times=False)
                    f.create_dataset(f"offsets/{s}", data=offsets, track_times=False)
                f.create_dataset(f"crc32/{s}", data=self.crcs[s][:n], track_times=False)
            for name, column in zip(self.fields, self.columns()):
                f.create_dataset(f"fields/{name}/values", data=column.values, track_times=False)
                if column.offsets is not None:
                    f.create_dataset(f"fields/{name}/offsets", data=column.offsets,
                                     track_times=False)

    @staticmethod
    def _rewrite_meta(path, meta):
        import h5py

        text = meta.to_json()
        with h5py.File(path, "r+", locking=False) as f:
            old = f.attrs["meta"]
            if isinstance(old, bytes) and len(text.encode()) <= len(old):
                f.attrs.modify("meta", _meta_record(text, len(old)))    # in place
            else:               # more skipped files than the record has room for
                f.attrs["meta"] = text

    def _shrink(self, n: int) -> None:
        """The last shard, short of the files it was sized for (some were skipped): copy its
        first ``n`` samples into a file of exactly that size, 64 MiB at a time."""
        import h5py

        part = temp_path(self.path)
        try:
            with h5py.File(self.tmp, "r", locking=False) as src, \
                    h5py.File(part, "w", locking=False) as dst:
                for s in self.sizes:
                    old = src[f"images/{s}"]
                    new = dst.create_dataset(f"images/{s}", (n, s, s, 3), np.uint8,
                                             track_times=False)
                    step = max(1, (64 << 20) // (3 * s * s))
                    for a in range(0, n, step):
                        b = min(n, a + step)
                        new[a:b] = old[a:b]
            os.replace(part, self.tmp)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.remove(part)
            raise


def _lmdb_bytes(values) -> int:
    """About the bytes an LMDB file takes for ``values`` (their lengths): a large value fills
    whole overflow pages after a 16-byte header, a small one shares a leaf page (its key and
    node header with it); then the tree's pages and the two meta pages."""
    total = 0
    for n in values:
        total += -(-(n + 16) // PAGE) * PAGE if n > PAGE // 2 else n + 32
    return total + total // 64 + 4 * PAGE


@register
class LMDBWriter(ShardWriter):
    container = "lmdb"
    _env = _txn = None

    def _begin(self):
        if self.encoding == "raw":
            sample = sum(3 * s * s for s in self.sizes)
            # a commit every ~64 KiB, at the same samples whatever batches the decoder hands
            # over: a resumed conversion writes the same file as one that was not interrupted
            self._every = max(1, COMMIT_BYTES // sample)
            self._open(self.capacity * _lmdb_bytes(3 * s * s for s in self.sizes))

    def _open(self, need: int) -> None:
        import lmdb

        # no writemap: values written through the map made the kernel read in (zero) the
        # file's pages on each write fault. A commit every few samples writes LMDB's dirty
        # pages with ``pwritev`` and frees them, for less of the writer's CPU
        # the map is address space only (no writemap: the file grows as pages are written);
        # what the data needs is allocated on the disk (a small set fits a small disk)
        map_size = int(need * 1.5) + (64 << 20)
        self._env = lmdb.open(self.tmp, subdir=False, map_size=map_size, lock=False, sync=False,
                              metasync=False)
        # allocated first: a full disk is an OSError now, not an LMDB error halfway, and ext4
        # writes into allocated blocks with less CPU. The file is cut back at the end.
        fd = os.open(self.tmp, os.O_RDWR | _NOFOLLOW)
        try:
            _allocate(fd, 0, need)
        finally:
            os.close(fd)
        self._txn = self._env.begin(write=True)

    def _put(self, i, payloads):
        for s, p in zip(self.sizes, payloads):
            self._txn.put(lmdb_key(s, i), memoryview(p))
        if (i + 1) % self._every == 0:
            self._txn.commit()
            self._txn = self._env.begin(write=True)

    def _close(self):
        if self._txn is not None:
            self._txn.abort()
        if self._env is not None:
            self._env.close()
        self._env = self._txn = None

    @staticmethod
    def options(path):
        import lmdb

        with lmdb.open(path, subdir=False, readonly=True, lock=False) as env, \
                env.begin() as txn:
            return txn.get(LMDB_OPTIONS).decode()

    def _finish(self, meta, options):
        n = len(self)
        fields = _lmdb_bytes(part.nbytes for c in self.columns() for part in (c.values, c.offsets)
                             if part is not None) if self.fields else 0
        if self.encoding == "jpeg":
            self._open(_lmdb_bytes(len(p) for s in self.sizes for p in self.encoded[s]) + fields)
            for s in self.sizes:
                for i, p in enumerate(self.encoded[s]):
                    self._txn.put(lmdb_key(s, i), p)
        elif fields:        # the map was sized for the pixels: room for the fields too
            self._txn.commit()
            self._env.set_mapsize(self._env.info()["map_size"] + int(fields * 1.5))
            self._txn = self._env.begin(write=True)
        txn, self._txn = self._txn, None
        for s in self.sizes:
            txn.put(lmdb_crc_key(s), self.crcs[s][:n].tobytes())
        txn.put(LMDB_LABELS, np.asarray(self.labels, np.int64).tobytes())
        for name, column in zip(self.fields, self.columns()):
            txn.put(lmdb_field_key(name, "values"), column.values.tobytes())
            if column.offsets is not None:
                txn.put(lmdb_field_key(name, "offsets"), column.offsets.tobytes())
        txn.put(LMDB_META, meta.to_json().encode())
        txn.put(LMDB_OPTIONS, options.encode())
        txn.commit()
        used = (self._env.info()["last_pgno"] + 1) * self._env.stat()["psize"]
        self._close()
        os.truncate(self.tmp, used)


    @staticmethod
    def _rewrite_meta(path, meta):
        import lmdb

        size = os.path.getsize(path)
        # no sync at the commit, as the writer's: a shard is complete once its manifest is
        with lmdb.open(path, subdir=False, map_size=size + (16 << 20), lock=False, sync=False,
                       metasync=False) as env:
            with env.begin(write=True) as txn:
                txn.put(LMDB_META, meta.to_json().encode())
            used = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        os.truncate(path, used)


