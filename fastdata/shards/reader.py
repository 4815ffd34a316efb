"""The base of shard readers: one ``ShardReader`` per shard file, registered by container
name in ``READERS``.

A reader opens its handles lazily in the process that reads and reopens after a fork; pickling
drops handles, so a ``ShardSet`` can be sent to ``spawn`` workers.
"""
from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Callable, Sequence

import numpy as np

from fastdata.fields import Column, FieldError, FieldKind
from fastdata.format import (
    ShardFormatError,
    ShardMeta,
)
from fastdata.outdir import same_file
from fastdata.shards.cache import hold
from fastdata.shards.mapped import open_files_limit, open_regular, unguard

# Opening is serialised: reader threads (torch or DALI backend) may open the same shard at once,
# and LMDB allows one environment per file per process. A child of fork gets a fresh lock.
OPEN_LOCK = threading.Lock()


def _reset_open_lock() -> None:
    global OPEN_LOCK
    OPEN_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_reset_open_lock)


class _Evicted(Exception):
    """A cached shard was evicted between its fetch and its reader's hold on it."""


class ShardReader:
    """One shard file. Subclasses implement ``_open`` → a dict of per-process handles."""

    container = ""
    zero_copy = False       # ``payload`` of a raw sample is an (S, S, 3) view of a memory map
    #: how the shard will be read: ``"random"`` (a shuffled order; the default) or
    #: ``"sequential"`` (file order: ``verify``, an unshuffled ``Loader``). Set before it opens
    access = "random"
    #: whether the whole set fits in half the memory available when it opened (``ShardSet``)
    fits = False

    @property
    def readahead(self) -> bool:
        """Whether the kernel reads ahead of the shard's maps, resolved once where the shard
        opens (an open LMDB env serves every reader of its file in the process): in file order
        always; at random where the set fits, so its first pass comes from the disk in large
        windows. On a larger set each window would read many times the bytes wanted and push
        out what is cached: there a batch asks for its samples' pages at once instead
        (``docs/performance.md``, "Reading from the disk")."""
        return self.access == "sequential" or self.fits

    def __init__(self, path: str, *, sizes: Sequence[int], encoding: str, count: int | None,
                 start: int | None = None, fields: dict[str, FieldKind] | None = None):
        """``count``, ``start``: the samples the manifest gives the shard and the set's index
        of its first (None: its own metadata's, not checked); ``fields``: the set's fields
        (name -> kind), whose columns the shard holds."""
        self.path, self.sizes, self.encoding, self.count = path, tuple(sizes), encoding, count
        self.start = start
        self.fields = dict(fields or {})
        #: a remote set's shard: makes it local (the node's cache) and returns its path
        self.fetch: Callable[[], str] | None = None
        self._h: dict | None = None
        self._pid = -1

    @property
    def h(self) -> dict:
        h = self._h
        if h is not None and self._pid == os.getpid():
            return h
        for _ in range(3):
            if self.fetch is not None:      # outside the lock: a download holds no other reader
                self.path = self.fetch()
            with OPEN_LOCK:
                try:
                    if self._h is None or self._pid != os.getpid():
                        self._h, self._pid = self._open_checked(), os.getpid()
                    return self._h
                except _Evicted:            # between its fetch and its hold: fetched again
                    pass
        raise OSError(f"shard {self.path} was evicted from the cache as it opened, three "
                      f"times: raise cache_limit")

    @property
    def is_open(self) -> bool:
        """Whether this process holds the shard open."""
        return self._h is not None and self._pid == os.getpid()

    def _open_checked(self) -> dict:
        """``_open``, with every failure an OSError that names the shard."""
        try:
            fd = open_regular(self.path)
        except FileNotFoundError:
            if self.fetch is not None:
                raise _Evicted from None
            raise FileNotFoundError(
                f"shard {self.path} is missing (the manifest lists it): restore it, or run "
                f"`fastdata convert SRC OUT --resume`, which redoes it") from None
        if self.fetch is not None:
            try:
                hold(fd)        # the cache evicts no shard a reader holds open
                evicted = not same_file(fd, self.path)
            except BaseException:
                os.close(fd)
                raise
            if evicted:         # between its fetch and the hold: fetched again by h
                os.close(fd)
                raise _Evicted
        try:
            return self._open(fd)
        except OSError as e:    # h5py's messages do not always name the file
            hint = ""
            if e.errno == errno.EMFILE or "Too many open files" in str(e):
                hint = (f" (each open shard keeps a file open: raise `ulimit -n`, now "
                        f"{open_files_limit()}, or convert with a larger --shard-size)")
            os.close(fd)
            raise OSError(f"cannot open shard {self.path}: {e}{hint}") from e
        except Exception as e:  # noqa: BLE001 - a damaged or foreign file: any library error
            os.close(fd)
            raise OSError(f"cannot open shard {self.path}: {type(e).__name__}: {e}") from e

    def check_intact(self) -> None:
        """Raise an OSError naming the shard if its file was cut short or written to since it
        was opened: its memory maps would end in a SIGBUS that kills the process. One
        ``fstat`` of the open file."""
        h = self.h
        st = os.fstat(h["fd"])
        if st.st_size < h["end"] or st.st_mtime_ns != h["mtime"]:
            raise OSError(f"shard {self.path} changed while it was read (now {st.st_size} "
                          f"bytes, {h['end']} when opened): a shard set must not change "
                          f"while a loader reads it; check it with `fastdata verify`")

    def __getstate__(self):
        return {**self.__dict__, "_h": None, "_pid": -1}

    def _open(self, fd: int) -> dict:
        """Per-process handles of the shard open as ``fd`` (a regular file, kept open for
        ``check_intact``): a dict with at least ``fd``, ``end`` (the bytes the handles
        read up to), ``mtime``, ``meta``, ``labels`` and ``crc32``."""
        raise NotImplementedError

    def close(self) -> None:
        h, self._h = self._h, None
        if h is not None and "fd" in h and self._pid == os.getpid():
            with contextlib.suppress(OSError):
                os.close(h["fd"])
            for slot in h.get("guards", ()):
                unguard(slot)

    def __del__(self):
        try:        # at interpreter exit, modules (contextlib among them) may be gone
            self.close()
        except Exception:  # noqa: BLE001, S110 - nothing left to tell
            pass

    def _meta(self, text) -> ShardMeta:
        meta = ShardMeta.from_json(text)
        if self.count is None:          # a shard looked at on its own (convert --resume)
            self.count = meta.count
        return meta

    def _with_records(self, h: dict, fd: int, meta: ShardMeta, labels, crcs: dict,
                      columns: dict[str, Column]) -> dict:
        """``h`` with the records every container has and the fields' ``columns``, checked
        against the count the manifest gives (a fixed-size field's values too; a
        variable-length one's as each is read)."""
        n = self.count
        if meta.count != n:
            raise ShardFormatError(f"its metadata says {meta.count} samples, the manifest {n}")
        if self.start is not None and meta.start != self.start:
            raise ShardFormatError(f"its metadata says it starts at sample {meta.start}, the "
                                   f"manifest {self.start} (another shard's copy)")
        if labels.shape != (n,):
            raise ShardFormatError(f"labels: {labels.shape[0] if labels.ndim else 0} of them "
                                   f"for {n} samples")
        for s, c in crcs.items():
            if c.shape != (n,):
                raise ShardFormatError(f"crc32 at size {s}: {c.size} values for {n} samples")
        for name, kind in self.fields.items():
            try:
                (kind.check if kind.fixed else kind.check_layout)(columns[name], n,
                                                                  f"field {name}")
            except FieldError as e:
                raise ShardFormatError(str(e)) from None
        st = os.fstat(fd)
        return {**h, "fd": fd, "mtime": st.st_mtime_ns, "meta": meta, "labels": labels,
                "crc32": crcs, "fields": columns}

    # --- record access (all indices are local to the shard) ---
    def meta(self) -> ShardMeta:
        return self.h["meta"]

    def labels(self) -> np.ndarray:
        return self.h["labels"]

    def crcs(self, size: int) -> np.ndarray:
        return self.h["crc32"][size]

    def column(self, name: str) -> Column:
        """The column of field ``name`` (its layout checked as the shard opened)."""
        return self.h["fields"][name]

    def field_values(self, name: str, local: np.ndarray, moved: tuple | None = None
                     ) -> list | np.ndarray:
        """Field ``name``'s values of samples ``local``: an array (a fixed-size kind's), else
        a list; ``moved``: ``(crops, flips, stored, out)``, each value through its image's
        crop and flip (``FieldKind.read_moved``).

        Raises:
            OSError: a stored value that is not of the field's kind (naming the shard).
        """
        kind = self.fields[name]
        try:
            if moved is not None:
                return kind.read_moved(self.column(name), local, *moved)
            return kind.read(self.column(name), local)
        except FieldError as e:
            raise OSError(f"{self.path}: field {name}: {e}; check the set with `fastdata "
                          f"verify`") from None

    def payload(self, size: int, i: int):
        """The stored bytes of sample ``i`` (a buffer: bytes, memoryview or uint8 array)."""
        raise NotImplementedError

    def payloads(self, size: int, local: np.ndarray) -> list:
        """``payload`` of each of the samples ``local``."""
        return [self.payload(size, i) for i in local.tolist()]

    def read_raw(self, size: int, local: np.ndarray, out: np.ndarray, rows: np.ndarray) -> None:
        """Copy raw sample ``local[k]`` straight into ``out[rows[k]]``, in ascending-index order
        (locality) and with no intermediate buffer."""
        raise NotImplementedError

    def raw_views(self, size: int, local: np.ndarray,
                  hold: contextlib.ExitStack | None) -> list:
        """Raw samples ``local`` as (S, S, 3) uint8 views of the shard's memory map, valid until
        ``hold`` closes (a ``zero_copy`` reader's as long as the map)."""
        return self.payloads(size, local)


READERS: dict[str, type[ShardReader]] = {}


def register(cls: type[ShardReader]) -> type[ShardReader]:
    """Class decorator: ``cls`` reads the shards of its ``container``."""
    READERS[cls.container] = cls
    return cls
