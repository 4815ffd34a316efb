"""Read a shard set: one ``ShardSet`` API over HDF5 and LMDB containers, raw and JPEG encodings.

Each shard file has a ``ShardReader`` (registered by container name) that opens its handle
lazily in the process that reads and reopens after a fork; pickling drops handles, so a
``ShardSet`` can be sent to ``spawn`` workers. Raw HDF5 data is read through ``np.memmap`` of
the contiguous dataset (h5py is only used once to find the byte offsets).
"""
from __future__ import annotations

import builtins
import contextlib
import errno
import functools
import io
import logging
import mmap
import os
import re
import stat
import threading
from typing import Iterator, Sequence

import numpy as np
import simplejpeg

from fastdata.env import available_memory
from fastdata.format import (LMDB_LABELS, LMDB_META, PAGE, ShardFormatError, ShardMeta,
                             check_size, label_kind, lmdb_crc_key, lmdb_key, read_manifest,
                             read_targets)


log = logging.getLogger("fastdata")

# Opening is serialised: reader threads (torch or DALI backend) may open the same shard at once,
# and LMDB allows one environment per file per process. A child of fork gets a fresh lock.
_OPEN_LOCK = threading.Lock()


def _reset_open_lock() -> None:
    global _OPEN_LOCK
    _OPEN_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_reset_open_lock)


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

    def __init__(self, path: str, *, sizes: Sequence[int], encoding: str, count: int | None):
        """``count``: the samples the manifest gives the shard (None: its own metadata's)."""
        self.path, self.sizes, self.encoding, self.count = path, tuple(sizes), encoding, count
        self._h: dict | None = None
        self._pid = -1

    @property
    def h(self) -> dict:
        h = self._h
        if h is None or self._pid != os.getpid():
            with _OPEN_LOCK:
                if self._h is None or self._pid != os.getpid():
                    self._h, self._pid = self._open_checked(), os.getpid()
                h = self._h
        return h

    def _open_checked(self) -> dict:
        """``_open``, with every failure an OSError that names the shard."""
        try:
            fd = _open_regular(self.path)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"shard {self.path} is missing (the manifest lists it): restore it, or run "
                f"`fastdata convert SRC OUT --resume`, which redoes it") from None
        try:
            return self._open(fd)
        except OSError as e:    # h5py's messages do not always name the file
            hint = ""
            if e.errno == errno.EMFILE or "Too many open files" in str(e):
                hint = (f" (each open shard keeps a file open: raise `ulimit -n`, now "
                        f"{_open_files_limit()}, or convert with a larger --shard-size)")
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
        with contextlib.suppress(Exception):     # at interpreter exit, modules may be gone
            self.close()

    def _meta(self, text) -> ShardMeta:
        meta = ShardMeta.from_json(text)
        if self.count is None:          # a shard looked at on its own (convert --resume)
            self.count = meta.count
        return meta

    def _checked(self, h: dict, fd: int, meta: ShardMeta, labels, crcs: dict) -> dict:
        """``h`` with the records every container has, checked against the count the
        manifest gives."""
        n = self.count
        if meta.count != n:
            raise ShardFormatError(f"its metadata says {meta.count} samples, the manifest {n}")
        if labels.shape != (n,):
            raise ShardFormatError(f"labels: {labels.shape[0] if labels.ndim else 0} of them "
                                   f"for {n} samples")
        for s, c in crcs.items():
            if c.shape != (n,):
                raise ShardFormatError(f"crc32 at size {s}: {c.size} values for {n} samples")
        st = os.fstat(fd)
        return {**h, "fd": fd, "mtime": st.st_mtime_ns, "meta": meta, "labels": labels,
                "crc32": crcs}

    # --- record access (all indices are local to the shard) ---
    def meta(self) -> ShardMeta:
        return self.h["meta"]

    def labels(self) -> np.ndarray:
        return self.h["labels"]

    def crcs(self, size: int) -> np.ndarray:
        return self.h["crc32"][size]

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


class HDF5ShardReader(ShardReader):
    container = "hdf5"
    zero_copy = True

    def _open(self, fd):
        guards: list = []
        try:
            return self._open_maps(fd, guards)
        except BaseException:
            for slot in guards:
                unguard(slot)
            raise

    def _open_maps(self, fd: int, guards: list) -> dict:
        import h5py

        maps, offsets, end = {}, {}, 0
        size = os.fstat(fd).st_size
        # no HDF5 file lock: a finished shard never changes, and locking fails on many network
        # file systems ("unable to lock file, errno = 37") and while any process holds one
        with h5py.File(self.path, "r", locking=False) as f:
            meta = self._meta(f.attrs["meta"])
            labels = _dataset(f, "labels", np.int64, 1)[()]
            crcs = {s: _dataset(f, f"crc32/{s}", np.uint32, 1)[()] for s in self.sizes}
            for s in self.sizes:
                name = f"images/{s}" if self.encoding == "raw" else f"jpeg/{s}"
                ds = _dataset(f, name, np.uint8, 4 if self.encoding == "raw" else 1)
                off = ds.id.get_offset()
                if self.encoding == "raw" and ds.shape != (self.count, s, s, 3):
                    raise ShardFormatError(f"dataset {name} is {ds.shape}, expected "
                                           f"{(self.count, s, s, 3)}")
                if ds.size and (off is None or off + ds.size > size):
                    raise ShardFormatError(f"dataset {name} lies past the file's end "
                                           f"({size} bytes): the file is cut short")
                end = max(end, (off or 0) + ds.size)
                maps[s] = self._map(fd, off or 0, ds.shape, guards)
                if self.encoding == "jpeg":
                    o = offsets[s] = _dataset(f, f"offsets/{s}", np.int64, 1)[()]
                    if (o.shape != (self.count + 1,) or o[0] != 0 or o[-1] != ds.size
                            or (np.diff(o) < 0).any()):
                        raise ShardFormatError(f"offsets/{s} do not cut jpeg/{s} into "
                                               f"{self.count} records")
        return self._checked({"maps": maps, "offsets": offsets, "end": end, "guards": guards},
                             fd, meta, labels, crcs)

    def _map(self, fd: int, offset: int, shape, guards: list) -> np.ndarray:
        """A plain ndarray over the file's bytes (np.memmap's Python-level __getitem__ ran per
        row). Copy-on-write, so that its views can become torch tensors (torch warns on
        read-only arrays); nothing writes through them. Without ``readahead``, a fault reads
        just its page (reads at random)."""
        n = int(np.prod(shape))
        if not n:
            return np.zeros(shape, np.uint8)
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        mm = mmap.mmap(fd, offset - start + n, access=mmap.ACCESS_COPY, offset=start)
        if not self.readahead and hasattr(mmap, "MADV_RANDOM"):
            mm.madvise(mmap.MADV_RANDOM)
        whole = np.frombuffer(mm, np.uint8)
        guards.append(guard(whole.ctypes.data, whole.nbytes))
        return whole[offset - start:offset - start + n].reshape(shape)

    def payload(self, size, i):
        if self.encoding == "raw":
            return self.h["maps"][size][i]
        o = self.h["offsets"][size]
        return self.h["maps"][size][o[i]:o[i + 1]]

    def payloads(self, size, local):
        views = super().payloads(size, local)
        if not self.readahead:      # else a copy or decode faults them in one page at a time
            will_need((_address(v), v.nbytes) for v in views)
        return views

    def read_raw(self, size, local, out, rows):
        order = np.argsort(local, kind="stable")
        for r, v in zip(rows[order].tolist(), self.payloads(size, local[order])):
            out[r] = v


# LMDB (and py-lmdb's guard) allow one env per file per process: readers of one file share it.
# (dev, inode) -> [pid, env, users, end, guards]. An entry made before a fork is the parent's:
# the child closes its inherited copy (munmap/close of the child's own mapping and fds) and
# reopens. Changed only under ``_OPEN_LOCK``.
_LMDB_ENVS: dict[tuple, list] = {}
# Keys whose reader was garbage collected. The collector runs in any thread, even inside an open
# of another shard (lock held, registry half read): it only appends here; opens and closes drain.
_LMDB_COLLECTED: list[tuple] = []


def _release_env(key: tuple) -> None:
    """One user fewer of the file's env; the last one closes it. Under ``_OPEN_LOCK``."""
    entry = _LMDB_ENVS.get(key)
    if entry is not None and entry[0] == os.getpid():
        entry[2] -= 1
        if entry[2] == 0:
            del _LMDB_ENVS[key]
            entry[1].close()
            for slot in entry[4]:
                unguard(slot)


def _release_collected() -> None:
    while _LMDB_COLLECTED:
        _release_env(_LMDB_COLLECTED.pop())


class LMDBShardReader(ShardReader):
    container = "lmdb"

    def _open(self, fd):
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        _release_collected()
        entry = _LMDB_ENVS.get(key)
        if entry is not None and entry[0] != os.getpid():
            entry[1].close()
            entry = None
        if entry is None:
            entry = _LMDB_ENVS[key] = self._new_env(st)
        entry[2] += 1
        env = entry[1]
        try:
            with env.begin() as txn:
                meta = self._meta(_value(txn, LMDB_META))
                labels = _array(txn, LMDB_LABELS, np.int64)
                crcs = {s: _array(txn, lmdb_crc_key(s), np.uint32) for s in self.sizes}
            # where each raw value lies in this process's map of the file, once read (0: not yet)
            where = {s: np.zeros(self.count, np.int64) for s in self.sizes}
            return self._checked({"env": env, "key": key, "where": where, "end": entry[3]}, fd,
                                 meta, labels, crcs)
        except BaseException:
            _release_env(key)
            raise

    def _new_env(self, st: os.stat_result) -> list:
        import lmdb

        if not st.st_size:
            raise OSError("empty file (0 bytes)")
        try:
            env = lmdb.open(self.path, subdir=False, readonly=True, lock=False,
                            readahead=self.readahead, max_readers=1024)
        except lmdb.Error as e:         # not an OSError: callers catch that for damage
            raise OSError(str(e).removeprefix(f"{self.path}: ")) from e
        # reading a page past a truncated file's end through the map is SIGBUS: refuse it
        end = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        if st.st_size < end:
            env.close()
            raise OSError(f"truncated: {st.st_size} bytes, its last page ends at {end}")
        # LMDB does not say where it mapped the file: the process's map list does
        return [os.getpid(), env, 0, end, [guard(lo, hi - lo) for lo, hi in _mapped(st)]]

    def close(self):
        with _OPEN_LOCK:
            _release_collected()
            if self._h is not None and self._pid == os.getpid():
                _release_env(self._h["key"])
            super().close()

    def __del__(self):
        with contextlib.suppress(Exception):     # at interpreter exit, modules may be gone
            if self._h is not None and self._pid == os.getpid():
                _LMDB_COLLECTED.append(self._h["key"])
            ShardReader.close(self)

    def payload(self, size, i):
        with self.h["env"].begin() as txn:
            return self._get(txn, size, i)

    def _get(self, txn, size: int, i: int):
        """Sample ``i``'s value; a damaged page is an OSError naming the shard (py-lmdb raises
        its own errors, which are not)."""
        import lmdb

        try:
            v = txn.get(lmdb_key(size, i))
        except lmdb.Error as e:
            self.check_intact()         # a file cut short under the map says so first
            raise OSError(f"{self.path}: sample {i} at size {size} cannot be read ({e}); check "
                          f"the set with `fastdata verify`") from None
        if v is None:
            raise OSError(f"{self.path}: sample {i} at size {size} is missing")
        return v

    def read_raw(self, size, local, out, rows):
        order = np.argsort(local, kind="stable")
        with self.h["env"].begin(buffers=True) as txn:     # one transaction per shard
            for r, v in zip(rows[order].tolist(), self._values(txn, size, local[order])):
                out[r] = v

    def raw_views(self, size, local, hold):
        # a value lives as long as its transaction: ``hold`` keeps it open
        return list(self._values(hold.enter_context(self.h["env"].begin(buffers=True)), size,
                                 local))

    def _values(self, txn, size, local):
        """Where nothing reads ahead, the pages of the values are asked for at once first.
        py-lmdb's ``get`` touches every page of a value before it returns, one 4 KiB fault at
        a time, so only reads say where values lie: an earlier read of the value, or of the
        values around it (``_places``)."""
        where = None if self.readahead else self.h["where"][size]
        if where is not None:
            will_need(_places(where, local, size * size * 3))
        for i in local.tolist():
            v = self._get(txn, size, i)
            if len(v) != 3 * size * size:
                raise OSError(f"{self.path}: sample {i} at size {size} is {len(v)} bytes, not "
                              f"{3 * size * size}; check the set with `fastdata verify`")
            v = np.frombuffer(v, np.uint8).reshape(size, size, 3)
            if where is not None:
                where[i] = _address(v)
            yield v


@functools.cache
def _native():
    """fastdata's C extension where it was built with the map guard (no torch in it)."""
    try:
        from fastdata import _native as module
    except ImportError:
        return None
    return module if hasattr(module, "guard") else None


def guard(address: int, length: int) -> int | None:
    """Register a shard's map: a page of it that faults (its file cut short) reads as zeros
    instead of killing the process, and ``guard_faults()`` counts it (``_native.c``). Returns
    the slot to ``unguard``; None where the extension is not built (a fault then kills the
    process, as it would)."""
    m = _native()
    slot = None if m is None or not address else m.guard(address, length)
    return None if slot is None or slot < 0 else slot


def unguard(slot: int | None) -> None:
    if slot is not None and _native() is not None:
        _native().unguard(slot)


def guard_faults() -> int:
    """Faults in guarded maps so far in this process (0 without the extension)."""
    m = _native()
    return 0 if m is None else m.faults()


def _mapped(st: os.stat_result) -> list[tuple[int, int]]:
    """The address ranges where this process maps the file ``st`` describes (Linux's
    ``/proc/self/maps``; none elsewhere)."""
    if _native() is None:
        return []
    try:
        with builtins.open("/proc/self/maps") as f:
            text = f.read()
    except OSError:
        return []
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
    return [(int(lo, 16), int(hi, 16)) for lo, hi in re.findall(
        rf"^([0-9a-f]+)-([0-9a-f]+) \S+ \S+ {dev} {st.st_ino} ", text, re.MULTILINE)]


def _open_regular(path: str) -> int:
    """``path`` open for reading, if it is a regular file: a FIFO or a device is refused
    before anything reads it (a FIFO would block every reader)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"shard {path} is not a regular file")
    return fd


def _dataset(f, name: str, dtype, ndim: int):
    """HDF5 dataset ``name`` of ``f``, if it is one the writer makes: stored in the shard file
    itself, contiguous (or compact) and unfiltered, with ``dtype`` and ``ndim``. A link to
    another file, external storage or a virtual dataset would make the reader read whatever
    file it names (a FIFO there blocks)."""
    import h5py

    parent = name.rpartition("/")[0]
    if parent and not isinstance(f.get(parent, getlink=True), h5py.HardLink):
        raise ShardFormatError(f"group {parent} is not a group in the shard file")
    link = f.get(name, getlink=True)
    if not isinstance(link, h5py.HardLink):
        kind = "missing" if link is None else f"a {type(link).__name__}"
        raise ShardFormatError(f"dataset {name} is {kind}, not a dataset in the shard file")
    ds = f[name]
    if not isinstance(ds, h5py.Dataset):
        raise ShardFormatError(f"{name} is not a dataset")
    dcpl = ds.id.get_create_plist()
    layout = dcpl.get_layout()
    if (layout not in (h5py.h5d.CONTIGUOUS, h5py.h5d.COMPACT) or dcpl.get_external_count()
            or dcpl.get_nfilters()):
        raise ShardFormatError(f"dataset {name} is not stored contiguously in the shard file "
                               f"(external, virtual, chunked or filtered): not a shard "
                               f"fastdata wrote")
    if ds.dtype != dtype or ds.ndim != ndim:
        raise ShardFormatError(f"dataset {name} is {ds.dtype} with {ds.ndim} dimensions, "
                               f"expected {np.dtype(dtype)} with {ndim}")
    return ds


def _value(txn, key: bytes) -> bytes:
    v = txn.get(key)
    if v is None:
        raise ShardFormatError(f"record {key.decode()} is missing")
    return v


def _array(txn, key: bytes, dtype) -> np.ndarray:
    v = _value(txn, key)
    if len(v) % np.dtype(dtype).itemsize:
        raise ShardFormatError(f"record {key.decode()} is {len(v)} bytes, not a whole number "
                               f"of {np.dtype(dtype)}")
    return np.frombuffer(v, dtype)


def _places(where: np.ndarray, local: np.ndarray, nbytes: int) -> list:
    """``(address, bytes)`` spans that hold the raw LMDB values ``local`` of ``nbytes``, from
    ``where`` (each value's address once read, else 0): exact for a value read before; else
    guessed from the nearest value below it that was read, since a shard's values lie in key
    order, each the same number of pages after the one before (its sizes together, 49 pages
    at 256 px), with a tree page between now and then (1.4% of the steps at 256 px): a span
    from the smallest step seen between read values, widened by the largest, at most twice
    the value. A wrong guess costs those bytes; an address outside the map is refused."""
    at = where[local]
    spans = [(a, nbytes) for a in at[at != 0].tolist()]
    todo = local[at == 0]
    known = np.flatnonzero(where) if len(todo) else todo
    if len(known) > 1:
        steps = np.diff(where[known]) // np.diff(known)
        lo, hi = int(steps.min()) // PAGE * PAGE, int(steps.max())
        below = np.searchsorted(known, todo) - 1
        ok = below >= 0
        if lo > 0 and ok.any():
            j = known[below[ok]]
            d = todo[ok] - j
            spans += zip((where[j] + d * lo).tolist(),
                         (nbytes + PAGE + np.minimum(d * (hi - lo), nbytes)).tolist())
    return spans


READERS: dict[str, type[ShardReader]] = {r.container: r for r in (HDF5ShardReader,
                                                                  LMDBShardReader)}


def decode_jpeg(buf, out: np.ndarray) -> None:
    """Decode a stored JPEG straight into ``out`` (H, W, 3 uint8).

    simplejpeg (libjpeg-turbo, no intermediate copies, releases the GIL) gives identical pixels
    to PIL, faster. PIL stays as the fallback for what libjpeg-turbo refuses.
    """
    try:
        h, w, _, _ = simplejpeg.decode_jpeg_header(buf)
        if (h, w) != out.shape[:2]:
            raise ValueError(f"JPEG is {w}x{h}, expected {out.shape[1]}x{out.shape[0]}")
        simplejpeg.decode_jpeg(buf, colorspace="RGB", buffer=out)
        return
    except ValueError:
        pass
    from PIL import Image

    with Image.open(io.BytesIO(buf)) as im:
        out[...] = np.asarray(im.convert("RGB") if im.mode != "RGB" else im)


def will_need(spans) -> None:
    """Tell the kernel that the pages under ``spans`` (``(address, bytes)`` in memory maps) are
    wanted now (``madvise(MADV_WILLNEED)``): it starts reading them all at once, so that the
    reads overlap, where touching them would fault them in one 4 KiB page at a time, each read
    waiting for the one before (an order of magnitude slower from the disk; docs/performance.md,
    "Reading from the disk"). Advice only: nothing where the platform lacks it; an address no
    longer mapped is refused, not a fault."""
    madvise = _madvise()
    if madvise is None:
        return
    for a, n in spans:
        start = a - a % mmap.PAGESIZE
        madvise(start, a + n - start, mmap.MADV_WILLNEED)


def _address(v: np.ndarray) -> int:
    return v.__array_interface__["data"][0]


@functools.cache
def _madvise():
    if not hasattr(mmap, "MADV_WILLNEED"):
        return None
    import ctypes

    try:
        f = ctypes.CDLL(None).madvise
    except (OSError, AttributeError):
        return None
    f.argtypes, f.restype = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int), ctypes.c_int
    return f


def _open_files_limit() -> int | None:
    try:
        import resource
    except ImportError:         # not on Unix
        return None
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _make_room_for_files(n: int) -> None:
    """Raise this process's soft limit on open files (``ulimit -n``; workers inherit it) to the
    hard limit when ``n`` more would not fit: a common default of 1024 is below the shard count
    of a large set (ImageNet at 512 px raw: ~3800 shards of 256 MiB). To the hard limit, not
    to what fits now: sets opened before any of them reads add up."""
    try:
        import resource
    except ImportError:         # not on Unix
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fds = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"     # Linux, macOS
    need = (len(os.listdir(fds)) if os.path.isdir(fds) else 0) + n + 64
    inf = resource.RLIM_INFINITY
    if soft == inf or soft >= need:
        return
    new = max(need, 1 << 16) if hard == inf else hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    except (ValueError, OSError):
        return
    log.info("raised this process's open-file limit from %d to %d for %d more shard files",
             soft, new, n)


class ShardSet:
    """A shard set on disk: ``len(ds)``, ``ds.classes``, ``ds.labels``, ``ds.label_kind``,
    ``ds.sizes``, ``ds[i] -> (image, label)`` and ``ds.read_batch(indices)``; made by
    ``fastdata.open`` (its arguments and errors). Picklable: a worker process reopens the shards
    it reads."""

    def __init__(self, root: str | os.PathLike, *, size: int | None = None):
        self.root = os.path.abspath(os.fspath(root))
        self.manifest = m = read_manifest(self.root)
        self.container, self.encoding = m["container"], m["encoding"]
        self.sizes: tuple[int, ...] = tuple(m["sizes"])
        self.classes: list[str] = list(m["classes"])
        #: "class" (``labels`` int64 (N,)), "multi_label" or "regression" (float32 (N, K);
        #: ``classes`` then names the K columns)
        self.label_kind = label_kind(m)
        reader = READERS[self.container]
        self.shards = [reader(os.path.join(self.root, s["file"]), sizes=self.sizes,
                              encoding=self.encoding, count=s["count"]) for s in m["shards"]]
        self._starts = np.array([s["start"] for s in m["shards"]], np.int64)
        self._n = int(m["num_samples"])
        self._check_files()
        # an open shard keeps a file descriptor per memory map (HDF5: one per size) or LMDB env
        _make_room_for_files(len(self.shards) * (len(self.sizes) if self.container == "hdf5"
                                                 else 1))
        self.size = self.sizes[-1] if size is None else self.stored_size(size)
        self._labels: np.ndarray | None = None
        # half the memory available: the rest is room for what the program holds later (its
        # loader's buffers, its model), which the page cache cannot have
        memory = available_memory()
        nbytes = sum(s.get("bytes", 0) for s in m["shards"])
        self.readahead = memory is not None and 2 * nbytes <= memory     # at random
        for reader in self.shards:
            reader.fits = self.readahead

    def _check_files(self) -> None:
        """Each shard file that exists must be a regular file inside the set's folder (a link
        within it is fine); no shard may claim more samples than its bytes can hold (labels and
        CRCs at least): a damaged or hostile manifest is refused here, not read from another
        set or allocated in TiB. A missing or damaged file is left to the read that needs it
        (``verify`` lists them all)."""
        real_root = os.path.realpath(self.root)
        least = 8 + 4 * len(self.sizes)         # a label and a CRC per size, per sample
        manifest = os.path.join(self.root, "manifest.json")
        for reader, entry in zip(self.shards, self.manifest["shards"]):
            name = entry["file"]
            if reader.count * least > entry["bytes"]:
                raise ShardFormatError(f"{manifest}: {name} cannot hold the {reader.count} "
                                       f"samples it is given in {entry['bytes']} bytes")
            try:
                st = os.stat(reader.path)
            except FileNotFoundError:
                continue
            except OSError as e:
                raise ShardFormatError(f"shard {reader.path}: {e.strerror}") from None
            real = os.path.realpath(reader.path)
            if os.path.dirname(real) != real_root:
                raise ShardFormatError(f"shard {reader.path} is a link to {real}, outside the "
                                       f"set's folder: refused")
            if not stat.S_ISREG(st.st_mode):
                raise ShardFormatError(f"shard {reader.path} is not a regular file")

    def stored_size(self, size) -> int:
        """``size`` as an int, or a ValueError naming the sizes this set stores."""
        s = check_size(size)
        if s not in self.sizes:
            raise ValueError(f"size {size!r} is not stored in {self.root}; stored sizes: "
                             f"{', '.join(map(str, self.sizes))}")
        return s

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        return (f"ShardSet({self.root!r}, {self._n} samples, {len(self.classes)} classes, "
                f"{self.container}/{self.encoding}, sizes={list(self.sizes)})")

    @property
    def labels(self) -> np.ndarray:
        """Each sample's label: int64 ``(N,)`` class indices, or float32 ``(N, K)`` multi-hot
        rows or regression targets (``label_kind``)."""
        if self._labels is None and self.label_kind != "class":
            self._labels = read_targets(self.root, self.manifest["targets"])
        if self._labels is None:
            parts = [s.labels() for s in self.shards]
            for shard, part in zip(self.shards, parts):     # else a loss fails far from here
                if len(part) != shard.count or (part.size and not (
                        0 <= part.min() and part.max() < len(self.classes))):
                    raise OSError(f"{shard.path}: its labels are damaged (not {shard.count} "
                                  f"labels in 0..{len(self.classes) - 1}); check the set with "
                                  f"`fastdata verify {self.root}`")
            self._labels = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return self._labels

    def locate(self, indices) -> tuple[np.ndarray, np.ndarray]:
        idx = np.asarray(indices)
        if idx.size and not np.issubdtype(idx.dtype, np.integer):
            raise TypeError(f"sample indices must be integers, got {idx.dtype} "
                            f"(e.g. {idx.reshape(-1)[0]!r})")
        if idx.ndim > 1:        # numpy would give (2, 3, S, S, 3) for (2, 3): not a batch
            raise ValueError(f"sample indices must be one sequence, got shape {idx.shape}")
        idx = idx.astype(np.int64, copy=False).reshape(-1)
        lo, n = (idx.min() if idx.size else 0), self._n
        if idx.size and (lo < -n or idx.max() >= n):
            bad = idx[(idx < -n) | (idx >= n)][0]
            raise IndexError(f"sample index {bad} out of range for {n} samples")
        if lo < 0:                                      # from the end, as Python and numpy
            idx = np.where(idx < 0, idx + n, idx)
        shard = np.searchsorted(self._starts, idx, side="right") - 1
        return shard, idx - self._starts[shard]

    def __getitem__(self, i: int) -> tuple[np.ndarray, int | np.ndarray]:
        image = self.read_batch([i])[0]         # checks i
        label = self.labels[i]
        return image, int(label) if label.ndim == 0 else label

    def read_batch(self, indices, size: int | None = None, out: np.ndarray | None = None
                   ) -> np.ndarray:
        """Samples ``indices`` (in that order) as one ``(B, S, S, 3)`` uint8 array."""
        faults = guard_faults()
        out = self._read_batch(indices, size, out)
        if guard_faults() != faults:        # a shard cut short under the copy: which one
            self.check_intact(indices)
        return out

    def check_intact(self, indices) -> None:
        """``ShardReader.check_intact`` of each shard that holds some of ``indices``: after a
        read during which a guarded map faulted (``guard_faults()`` moved), it names the
        shard that was cut short or rewritten."""
        shard, _ = self.locate(indices)
        for sh, _ in _by_shard(shard):
            self.shards[sh].check_intact()

    def _read_batch(self, indices, size, out) -> np.ndarray:
        s = self.size if size is None else self.stored_size(size)
        shard, local = self.locate(indices)
        if out is None:
            out = page_aligned((len(local), s, s, 3))
        elif out.shape != (len(local), s, s, 3) or out.dtype != np.uint8:
            raise ValueError(f"out must be uint8 {(len(local), s, s, 3)}, got "
                             f"{out.dtype} {out.shape}")
        for sh, rows in _by_shard(shard):
            reader = self.shards[sh]
            reader.check_intact()
            if self.encoding == "raw":
                reader.read_raw(s, local[rows], out, rows)
            else:                               # an unopenable shard says so
                for r, buf in zip(rows.tolist(), reader.payloads(s, local[rows])):
                    try:
                        decode_jpeg(buf, out[r])
                    except Exception as e:      # noqa: BLE001 - damaged data, named below
                        raise OSError(f"{reader.path}: sample {int(local[r])} (of that shard) "
                                      f"at size {s} is not a readable JPEG ({e}); check the "
                                      f"set with `fastdata verify {self.root}`") from e
        return out

    def raw_views(self, indices, size: int | None = None,
                  hold: contextlib.ExitStack | None = None) -> list[np.ndarray] | None:
        """Samples ``indices`` as (S, S, 3) uint8 views of the shards' memory maps, with no
        copy (a transform that crops reads only its crop), valid until ``hold`` closes; None
        where this set cannot give them (JPEG; LMDB without ``hold``, since a value lives only
        as long as its transaction, which ``hold`` keeps open)."""
        if self.encoding != "raw" or (hold is None and not READERS[self.container].zero_copy):
            return None
        # LMDB: one transaction per shard
        return self._per_shard(indices, size, lambda sh, s, local: sh.raw_views(s, local, hold))

    def read_encoded(self, indices, size: int | None = None) -> list:
        """The stored payloads (JPEG bytes, or raw HWC bytes) of ``indices``, in that order."""
        return self._per_shard(indices, size, lambda sh, s, local: sh.payloads(s, local))

    def _per_shard(self, indices, size, fetch) -> list:
        """``fetch(reader, size, local)`` for each shard's share of ``indices``, in their order."""
        s = self.size if size is None else self.stored_size(size)
        shard, local = self.locate(indices)
        out: list = [None] * len(local)
        for sh, rows in _by_shard(shard):
            self.shards[sh].check_intact()
            for r, v in zip(rows.tolist(), fetch(self.shards[sh], s, local[rows])):
                out[r] = v
        return out

    def close(self) -> None:
        """Drop every shard's handles and memory maps (they reopen on the next read)."""
        for sh in self.shards:
            sh.close()

    def iter_shards(self) -> Iterator[tuple[dict, ShardReader]]:
        return zip(self.manifest["shards"], self.shards)


def _by_shard(shard: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """``(shard, positions)`` for each shard that ``shard`` (a shard index per sample) names."""
    for sh in np.unique(shard):
        yield int(sh), np.flatnonzero(shard == sh)


def page_aligned(shape: tuple[int, ...]) -> np.ndarray:
    """An uninitialised uint8 array whose data starts on a page: ``np.empty``'s large arrays
    start 16 bytes into one, and copying 256 px samples out of raw HDF5 shards (which start on
    a page) into such an array ran at half the speed of a copy into one starting on a page
    or a cache line (seen on AMD Zen 4)."""
    n = int(np.prod(shape))
    buf = np.empty(n + PAGE, np.uint8)
    k = -buf.ctypes.data % PAGE
    return buf[k:k + n].reshape(shape)


def open(root: str | os.PathLike, *, size: int | None = None) -> ShardSet:  # noqa: A001
    """Open the shard set at ``root`` (a directory with ``manifest.json``).

    Args:
        root: the set's folder.
        size: the stored size ``ds[i]`` and ``read_batch`` read by default (default: the
            largest).

    Returns:
        The ``ShardSet``; shards open lazily, in the process that reads them.

    Raises:
        ShardFormatError: no manifest (or an unfinished conversion), a manifest of another
            format or version, or a field or shard file that does not check out (named).
        ValueError: ``size`` is not one the set stores.
    """
    return ShardSet(root, size=size)
