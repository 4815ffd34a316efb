"""Writing into a folder that fastdata owns (a conversion's OUT, a training run's checkpoint
folder) without trusting what is already there.

* One writer at a time: an exclusive ``flock`` on ``<folder>/.fastdata.lock`` for the whole run,
  released by the kernel when the process exits, however it exits (the file is removed at a
  normal end; one left by a killed run is simply locked again). A second run is refused with
  the first one's pid, host and command.
* Nothing is written through a link: new files get names no one can have planted
  (``tempfile.mkstemp``: ``O_CREAT | O_EXCL | O_NOFOLLOW``) and are renamed into place, which
  replaces a directory entry rather than following it.
* Nothing is deleted that fastdata did not write: only regular files (never a link, never a
  directory) whose names fastdata's own naming scheme produces.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Callable

log = logging.getLogger("fastdata")

LOCK = ".fastdata.lock"
#: the names fastdata writes into a conversion's folder: the manifest, shards and the
#: temporary files each is written to before it is renamed into place
CONVERT_NAMES = re.compile(r"(manifest\.json|targets\.npy|annotations\.bin|shard-\d{5,}\.(h5|lmdb))"
                           r"(\.tmp(\.part)?|\.tmp-[A-Za-z0-9_]{1,16}(\.part)?)?")
TEMP_SUFFIX = re.compile(r"\.tmp(\.part)?$|\.tmp-[A-Za-z0-9_]{1,16}(\.part)?$")
#: the names a conversion reads back (``--resume``) or renames a new file onto
FINAL_NAMES = re.compile(r"manifest\.json|targets\.npy|annotations\.bin|shard-\d{5,}\.(h5|lmdb)")


class FolderBusyError(OSError):
    """Another process holds the folder's lock."""


class FolderLock:
    """An exclusive lock on ``folder`` for ``what`` (e.g. "fastdata convert"), held from
    ``acquire`` until ``release`` or the process's exit.

    Raises:
        FolderBusyError: another process holds it (the message names it).
        OSError: the lock file is a link or cannot be made.
    """

    def __init__(self, folder: str, what: str):
        self.folder, self.what, self._fd = folder, what, None
        self.path = os.path.join(folder, LOCK)

    def acquire(self) -> FolderLock:
        import fcntl

        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise OSError(f"{self.path} is a symbolic link, not fastdata's lock file: "
                              f"refused (remove it)") from None
            raise
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(f"{self.path} is not a regular file: refused")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "unknown"
                raise FolderBusyError(errno.EBUSY, f"{self.folder} is in use by another "
                                      f"{self.what} ({holder}); wait for it to end, or use "
                                      f"another folder") from None
            if not same_file(fd, self.path):   # its holder removed it as we opened it
                os.close(fd)
                return self.acquire()
            note = (f"pid {os.getpid()} on {socket.gethostname()}, since "
                    f"{time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(sys.argv)[:300]}")
            os.ftruncate(fd, 0)
            os.pwrite(fd, note.encode("utf-8", "replace") + b"\n", 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd  # type: ignore[assignment]
        return self

    def release(self) -> None:
        """Remove the lock file and drop the lock (removed first: a run that opened the file
        meanwhile sees that it is gone, and makes a new one)."""
        if self._fd is not None:
            if same_file(self._fd, self.path):
                os.remove(self.path)
            os.close(self._fd)      # closing drops the flock
            self._fd = None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def same_file(fd: int, path: str) -> bool:
    """Whether ``path`` (not followed if a link) is the file open as ``fd``."""
    try:
        a, b = os.fstat(fd), os.lstat(path)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def temp_path(path: str) -> str:
    """A new, empty regular file beside ``path`` (``<name>.tmp-XXXXXXXX``), made with
    ``O_EXCL | O_NOFOLLOW``: a name no one could have planted a link at."""
    folder, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(prefix=name + ".tmp-", dir=folder or ".")
    try:        # mkstemp's 0600 would keep the set from its other readers
        mask = os.umask(0o022)
        os.umask(mask)
        os.fchmod(fd, 0o666 & ~mask)
    finally:
        os.close(fd)
    return tmp


def replace_atomically(path: str, data: bytes | Callable[[str], None], *,
                       durable: bool = True) -> None:
    """Write ``path`` through a fresh temporary file beside it (``temp_path``) renamed into
    place: ``path`` is the old file or the whole new one, nothing is written through a link
    planted at either name, and a failure (a full disk, Ctrl-C) leaves no temporary file.

    Args:
        path: the file to write.
        data: its bytes, or a function that writes the temporary file given its path
            (``torch.save``).
        durable: synced to the disk before the rename (a record that must outlive a crash;
            a cache's copy need not).
    """
    tmp = temp_path(path)
    try:
        if callable(data):
            data(tmp)
        else:
            with open(tmp, "wb") as f:
                f.write(data)
        if durable:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def is_regular(path: str) -> bool:
    """Whether ``path`` is a regular file itself (not a link to one)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def foreign_at_own_names(folder: str, names=FINAL_NAMES) -> list[str]:
    """Entries of ``folder`` at the names of a shard set's files that are not regular files
    (links, folders, FIFOs): fastdata did not make them, and would read through or replace
    them. (Temporary files get fresh names: whatever sits at old ones is left alone.)"""
    return sorted(n for n in os.listdir(folder) if names.fullmatch(n)
                  and not is_regular(os.path.join(folder, n)))


def remove_own(folder: str, names: list[str]) -> list[str]:
    """Delete those of ``names`` in ``folder`` that are regular files (a link or a folder of
    that name is left alone); return the names deleted."""
    gone = []
    for n in names:
        p = os.path.join(folder, n)
        if is_regular(p):
            with contextlib.suppress(FileNotFoundError):
                os.remove(p)
                gone.append(n)
    return gone


def leftover_temps(folder: str) -> list[str]:
    """Temporary files an interrupted run left in ``folder``."""
    return sorted(n for n in os.listdir(folder) if CONVERT_NAMES.fullmatch(n)
                  and TEMP_SUFFIX.search(n))
