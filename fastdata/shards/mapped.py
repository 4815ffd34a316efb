"""Memory-mapped shard I/O: the fault guard over maps, read-ahead advice, page-aligned
buffers, files opened only when regular, and room for many open files.

A page of a map past its file's end (a shard cut short under a reader) is SIGBUS, which kills
the process: maps registered with ``guard`` read zeros there instead and ``guard_faults()``
counts it, so the reader can name the shard that changed (``kernels/_guard.c``).
"""
from __future__ import annotations

import builtins
import functools
import logging
import mmap
import os
import re
import stat

import numpy as np

from fastdata import kernels
from fastdata.format import (
    PAGE,
)

log = logging.getLogger("fastdata")


def guard(address: int, length: int) -> int | None:
    """Register a shard's map: a page of it that faults (its file cut short) reads as zeros
    instead of killing the process, and ``guard_faults()`` counts it (``kernels/_guard.c``). Returns
    the slot to ``unguard``; None where the extension is not built (a fault then kills the
    process, as it would)."""
    m = kernels.guard()
    slot = None if m is None or not address else m.guard(address, length)
    return None if slot is None or slot < 0 else slot


def unguard(slot: int | None) -> None:
    if slot is not None and kernels.guard() is not None:
        kernels.guard().unguard(slot)


def guard_faults() -> int:
    """Faults in guarded maps so far in this process (0 without the extension)."""
    m = kernels.guard()
    return 0 if m is None else m.faults()


def mapped_ranges(st: os.stat_result) -> list[tuple[int, int]]:
    """The address ranges where this process maps the file ``st`` describes (Linux's
    ``/proc/self/maps``; none elsewhere)."""
    if kernels.guard() is None:
        return []
    try:
        with builtins.open("/proc/self/maps") as f:
            text = f.read()
    except OSError:
        return []
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
    return [(int(lo, 16), int(hi, 16)) for lo, hi in re.findall(
        rf"^([0-9a-f]+)-([0-9a-f]+) \S+ \S+ {dev} {st.st_ino} ", text, re.MULTILINE)]


def will_need(spans) -> None:
    """Tell the kernel that the pages under ``spans`` (``(address, bytes)`` in memory maps) are
    wanted now (``madvise(MADV_WILLNEED)``): it starts reading them all at once, so that the
    reads overlap, where touching them would fault them in one 4 KiB page at a time, each read
    waiting for the one before (an order of magnitude slower from the disk; docs/performance.md,
    "Reading from the disk"). Advice only: nothing where the platform lacks it; an address no
    longer mapped is refused, not a fault."""
    madvise = libc_madvise()
    if madvise is None:
        return
    for a, n in spans:
        start = a - a % mmap.PAGESIZE
        madvise(start, a + n - start, mmap.MADV_WILLNEED)


def address(v: np.ndarray) -> int:
    return v.__array_interface__["data"][0]


@functools.cache
def libc_madvise():
    if not hasattr(mmap, "MADV_WILLNEED"):
        return None
    import ctypes

    try:
        f = ctypes.CDLL(None).madvise
    except (OSError, AttributeError):
        return None
    f.argtypes, f.restype = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int), ctypes.c_int
    return f


def page_aligned(shape: tuple[int, ...]) -> np.ndarray:
    """An uninitialised uint8 array whose data starts on a page: ``np.empty``'s large arrays
    start 16 bytes into one, and on some CPUs copying samples out of raw HDF5 shards (which
    start on a page) into such an array is much slower than into one that starts on a page
    or a cache line."""
    n = int(np.prod(shape))
    buf = np.empty(n + PAGE, np.uint8)
    k = -buf.ctypes.data % PAGE
    return buf[k:k + n].reshape(shape)


def open_regular(path: str) -> int:
    """``path`` open for reading, if it is a regular file: a FIFO or a device is refused
    before anything reads it (a FIFO would block every reader)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"shard {path} is not a regular file")
    return fd


def open_files_limit() -> int | None:
    try:
        import resource
    except ImportError:         # not on Unix
        return None
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def make_room_for_files(n: int) -> None:
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
    if new <= soft:         # at the hard limit already: opening says so if it runs out
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    except (ValueError, OSError):
        return
    log.info("raised this process's open-file limit from %d to %d for %d more shard files",
             soft, new, n)
