"""The node-local cache of remote shards: one copy of each shard per node, whichever process
asks first fetching it for all, never above its limit, never evicting a shard a reader has open.

Layout under the cache folder (``cache_dir``; default ``$FASTDATA_CACHE``, else
``~/.cache/fastdata``), a folder of its own (not a link), marked by a ``CACHEDIR.TAG``
written when it was empty: a folder that holds anything else is refused, never written to:

* ``objects/<key>``: the shards, named by their content (``key``: the manifest's whole-file
  SHA-256 where it has one, else a digest of the shard's content checksum, size and
  container), so two sets or jobs never confuse theirs and share identical ones;
* ``stamps/<key>``: what the shard file was when it checked out (size, inode, modification
  time); a file that no longer matches its stamp (altered on disk) is fetched again. The
  stamp's own time is the shard's last use (touched at each), for least-recently-used order;
* ``locks/<key>``: one lock per shard, held by the process fetching it; ``lock``: held while
  room is made, so two processes never both fill the last bytes (POSIX locks, which a forked
  child does not inherit);
* ``tmp/``: downloads in progress, each at its full size from the start (the limit counts
  them), renamed into ``objects/`` only once checked: nothing half-written is ever read;
* ``sets/<digest of the URL>``: each remote set's manifest and label files, fetched at each
  open;
* ``uploads/<digest of the URL>``: a conversion into a store stages its shards there.

Readers hold a shared ``flock`` on each cached shard they have open; eviction (least recently
used first) skips a shard it cannot lock exclusively. The cache deletes only files under
``objects/`` that have a stamp, their stamps, and files under ``tmp/`` with its own names.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Callable

from fastdata.outdir import replace_atomically

log = logging.getLogger("fastdata")
SUBFOLDERS = ("objects", "stamps", "locks", "tmp", "sets", "uploads")
#: the cache folder's mark (the Cache Directory Tagging Specification's: backup tools skip
#: the folder): a folder without it is never written to or cleared
TAG, TAG_TEXT = "CACHEDIR.TAG", ("Signature: 8a477f597d28d172789f06886806bc55\n"
                                 "# the node cache of fastdata's remote shards\n")
_NOT_OURS = ("{root} is not a fastdata cache (it holds other files and no CACHEDIR.TAG of "
             "fastdata's): refused; give cache_dir a new or empty folder")
_KEY = re.compile(r"[0-9a-z-]{8,80}")
_TMP = re.compile(r"[0-9a-z-]{8,80}\.[0-9]+\.[0-9a-f]{8}")
#: how long a download waits for readers to let go of shards when the cache is at its limit
ROOM_WAIT_S = 30.0


def default_cache_dir() -> str:
    """``$FASTDATA_CACHE``, else ``~/.cache/fastdata`` (read when a remote set opens)."""
    return os.environ.get("FASTDATA_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "fastdata")


def shard_key(entry: dict, container: str) -> str:
    """The cache name of a shard: its whole-file SHA-256 where the manifest has it, else a
    digest of what the manifest says of its content."""
    if isinstance(entry.get("file_sha256"), str):
        return "f-" + entry["file_sha256"]
    text = f"{entry['sha256']}:{entry['bytes']}:{container}"
    return "c-" + hashlib.sha256(text.encode()).hexdigest()


def _is_cache(root: str) -> bool:
    """Whether ``root`` is a folder (not a link) marked as fastdata's cache."""
    if os.path.islink(root) or not os.path.isdir(root):
        return False
    try:
        with open(os.path.join(root, TAG), encoding="utf-8", errors="replace") as f:
            return f.read(len(TAG_TEXT) + 1) == TAG_TEXT
    except OSError:
        return False


def _claim(root: str) -> None:
    """Mark ``root`` as the cache's where it is an empty folder; refuse one that is a link or
    holds anything but a cache."""
    if os.path.islink(root) or not os.path.isdir(root):
        raise OSError(f"cache folder {root} is a link or not a folder: refused (give the "
                      f"folder it names)")
    if _is_cache(root):
        return
    if any(not name.startswith(f"{TAG}.tmp-") for name in os.listdir(root)):  # another's
        raise OSError(_NOT_OURS.format(root=root))
    replace_atomically(os.path.join(root, TAG), TAG_TEXT.encode(), durable=False)


# a lock is a POSIX record lock (``lockf``): one a forked child never inherits (an ``flock``
# would live on in a child's copy of its descriptor, forked while a download ran); POSIX locks
# are per process, so the threads of one take a ``threading.Lock`` per file first, replaced
# in a forked child (one held by another thread at the fork would never be released there)
_THREAD_LOCKS: dict[str, threading.Lock] = {}
_GUARD = threading.Lock()


def _fresh_locks() -> None:
    global _THREAD_LOCKS, _GUARD
    _THREAD_LOCKS, _GUARD = {}, threading.Lock()


os.register_at_fork(after_in_child=_fresh_locks)


def _lock(fd: int) -> None:
    """``lockf`` ``fd``, taken again where the kernel calls it a deadlock: it judges by
    process, and two processes whose threads hold and wait for a shard's lock and the cache's
    (always taken in that order: no real deadlock) look like one."""
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX)
            return
        except OSError as e:
            if e.errno != errno.EDEADLK:
                raise
            time.sleep(0.005 + 0.01 * secrets.randbelow(100) / 100)


@contextlib.contextmanager
def _locked(path: str):
    """``path`` locked against every other thread and process of the node."""
    with _GUARD:
        mine = _THREAD_LOCKS.setdefault(path, threading.Lock())
    with mine:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
                     | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            _lock(fd)
            yield fd
        finally:
            os.close(fd)


class ShardCache:
    """Remote shards fetched once per node into ``root``, at most ``limit`` bytes of them.

    Args:
        root: the cache folder (created; default ``default_cache_dir()``).
        limit: the most bytes of shards kept (None: no limit).

    Raises:
        ValueError: a negative ``limit``.
        OSError: the folder cannot be made or is a link.
    """

    def __init__(self, root: str | os.PathLike | None = None, limit: int | None = None):
        if root is not None and not os.fspath(root):
            raise ValueError("cache_dir='' is not valid; give a folder, or None (the default, "
                             f"{default_cache_dir()})")
        self.root = os.path.abspath(os.fspath(root) if root is not None else
                                    default_cache_dir())
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                                  or limit < 0):
            raise ValueError(f"cache_limit={limit!r} is not valid; use a number of bytes >= 0 "
                             f"or None (no limit)")
        self.limit = limit
        with disk_errors(self.root, "a shard"):
            os.makedirs(self.root, exist_ok=True)
            _claim(self.root)
        for sub in SUBFOLDERS:
            path = os.path.join(self.root, sub)
            with disk_errors(self.root, "a shard"):
                os.makedirs(path, exist_ok=True)
            if os.path.islink(path) or not os.path.isdir(path):
                raise OSError(f"cache folder {path} is not a folder of its own: refused")

    @classmethod
    def existing(cls, root: str | os.PathLike) -> ShardCache | None:
        """The cache at ``root`` if there is one (None: no folder there), making nothing.

        Raises:
            OSError: ``root`` holds something that is not a fastdata cache.
        """
        root = os.path.abspath(os.fspath(root))
        if not os.path.lexists(root) or (os.path.isdir(root) and not os.path.islink(root)
                                         and not os.listdir(root)):
            return None
        if not _is_cache(root):
            raise OSError(_NOT_OURS.format(root=root))
        return cls(root)

    def __repr__(self) -> str:
        return f"ShardCache({self.root!r}, limit={self.limit})"

    def path(self, key: str) -> str:
        if not _KEY.fullmatch(key):
            raise ValueError(f"not a cache key: {key!r}")
        return os.path.join(self.root, "objects", key)

    def get(self, key: str, size: int, fetch: Callable[[int], None],
            check: Callable[[str], str | None], what: str) -> str:
        """The cached file of ``key`` (``size`` bytes), fetched first if absent: ``fetch(fd)``
        writes it, ``check(path)`` says what is wrong with it (None: sound). A download that
        does not check out is fetched once more, then refused.

        Raises:
            OSError: the fetch failed, or the shard came twice damaged (named by ``what``), or
                ``size`` does not fit the limit beside the shards readers hold open.
        """
        with disk_errors(self.root, what):
            return self._get(key, size, fetch, check, what)

    def _get(self, key: str, size: int, fetch, check, what: str) -> str:
        final = self.path(key)
        if self._present(key, size):
            return final
        with _locked(os.path.join(self.root, "locks", key)):
            if self._present(key, size):        # another process fetched it meanwhile
                return final
            if os.path.lexists(final):
                log.warning("%s: the cached copy %s was altered on disk: fetched again", what,
                            final)
                self._remove(key)
            wrong = None
            for attempt in (1, 2):
                tmp = self._reserve(key, size)
                try:
                    wrong = self._fill(tmp, fetch, check)
                    if wrong is None:
                        # under the cache's lock: a count of its bytes sees the shard in
                        # tmp/ or in objects/, never in neither; and room is made only once
                        # it has its stamp (a shard without one is not counted)
                        with self._room_locked():
                            os.replace(tmp, final)
                            try:
                                self._stamp(key)
                            except BaseException:   # no stamp: not a shard that checked out
                                self._remove(key)
                                raise
                        return final
                finally:
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(tmp)
                log.warning("%s: %s (attempt %d of 2)", what, wrong, attempt)
            raise OSError(f"{what}: {wrong}, twice: refused (the store holds a damaged copy, or "
                          f"something alters the download)")

    @staticmethod
    def _facts(st: os.stat_result) -> str:
        return f"{st.st_size} {st.st_ino} {st.st_mtime_ns}"

    def _stamp(self, key: str) -> None:
        facts = self._facts(os.lstat(self.path(key)))
        # beside the stamps, not in tmp/: a shard's room counts every file in tmp/
        replace_atomically(os.path.join(self.root, "stamps", key), facts.encode(), durable=False)

    def _present(self, key: str, size: int) -> bool:
        """The shard is cached as it checked out: a regular file (not a link, whatever its
        stamp says) matching its stamp, which is touched (the latest use)."""
        stamp = os.path.join(self.root, "stamps", key)
        try:
            st = os.lstat(self.path(key))
            with open(stamp, "rb") as f:
                ok = stat.S_ISREG(st.st_mode) and st.st_size == size and \
                    f.read(100) == self._facts(st).encode()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return False
        if ok:
            with contextlib.suppress(FileNotFoundError):
                os.utime(stamp)
        return ok

    def retire(self, key: str) -> None:
        """Mark the shard ``key`` the first to evict (a reader is done with it); a reader that
        still holds it keeps it."""
        with contextlib.suppress(FileNotFoundError):
            os.utime(os.path.join(self.root, "stamps", key), (0, 0))

    def _remove(self, key: str) -> None:
        for path in (self.path(key), os.path.join(self.root, "stamps", key)):
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)

    def _fill(self, tmp: str, fetch, check) -> str | None:
        # read too: a forked process's download is checksummed from the file its helper wrote
        fd = os.open(tmp, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        try:        # no fsync: a cache is not a record, and a process killed mid-way leaves
            fetch(fd)   # only its temporary file, never renamed
        except OSError as e:
            if e.errno is None and "No space left" in str(e):    # the helper process's
                raise OSError(errno.ENOSPC, "No space left on device") from None
            raise
        finally:
            os.close(fd)
        return check(tmp)

    def _reserve(self, key: str, size: int) -> str:
        """A temporary file of ``size`` bytes, made once the cache has room for it (waiting
        up to ``ROOM_WAIT_S`` for readers to let go of shards)."""
        deadline = time.monotonic() + ROOM_WAIT_S
        while True:
            with self._room_locked():
                self._sweep()
                used = self._make_room(size)
                if used is None:
                    return self._new_tmp(key, size)
            if time.monotonic() > deadline:
                raise OSError(f"cache_limit={self.limit} bytes cannot hold a shard of {size} "
                              f"more: {used} bytes of shards are open in readers or being "
                              f"fetched (raise cache_limit, or read with fewer shards open)")
            time.sleep(0.05)

    def _new_tmp(self, key: str, size: int) -> str:
        st = os.statvfs(self.root)
        if size > st.f_bavail * st.f_frsize:    # a sparse file would fit, and then fill it
            raise OSError(errno.ENOSPC, f"No space left on device for a shard of {size} bytes "
                                        f"({st.f_bavail * st.f_frsize} free)")
        tmp = os.path.join(self.root, "tmp", f"{key}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                     0o644)
        try:
            os.ftruncate(fd, size)      # counted by the next _make_room at its full size
        finally:
            os.close(fd)
        return tmp

    def _sweep(self) -> None:
        """Remove the temporary files of processes that are gone (killed mid-download)."""
        for _, name, _ in self._entries("tmp"):
            pid = int(name.split(".")[1])
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(self.root, "tmp", name))
            except PermissionError:     # alive, another user's
                pass

    def _room_locked(self):
        """The cache's own lock, held while room is made and while a count of its bytes must
        see a stable set of files."""
        return _locked(os.path.join(self.root, "lock"))

    def used(self) -> int:
        """Bytes of cached and in-flight shards, counted while no process changes them."""
        _, nbytes, in_flight = self.contents()
        return nbytes + in_flight

    def contents(self) -> tuple[int, int, int]:
        """``(shards, their bytes, bytes of downloads in progress)``, counted while no process
        changes them."""
        with self._room_locked():
            objects = self._entries("objects")
            return len(objects), sum(size for _, _, size in objects), self._in_flight()

    def clear(self) -> tuple[int, int]:
        """Delete every cached shard that no reader holds open, and the downloads left by
        processes that are gone. Returns ``(shards deleted, shards kept)``: a shard a running
        reader holds stays, as a download in progress does."""
        with self._room_locked():
            self._sweep()
            gone = [self._evict(key) for _, key, _ in self._entries("objects")]
        return sum(gone), len(gone) - sum(gone)

    def _in_flight(self) -> int:
        return sum(size for _, _, size in self._entries("tmp"))

    def _entries(self, sub: str) -> list[tuple[float, str, int]]:
        """``(last use, name, bytes)`` of the cache's own files in ``sub``: downloads in
        ``tmp/``; shards with a stamp in ``objects/`` (a shard's last use: its stamp's time).
        Nothing else is counted or deleted."""
        name_ok = _KEY.fullmatch if sub == "objects" else _TMP.fullmatch
        out = []
        with os.scandir(os.path.join(self.root, sub)) as it:
            for e in it:
                if not (name_ok(e.name) and e.is_file(follow_symlinks=False)):
                    continue
                try:
                    size = e.stat(follow_symlinks=False).st_size
                    used = os.lstat(os.path.join(self.root, "stamps", e.name)).st_mtime \
                        if sub == "objects" else 0.0
                except FileNotFoundError:
                    continue
                out.append((used, e.name, size))
        return out

    def _make_room(self, size: int) -> int | None:
        """Evict least recently used shards no reader holds until ``size`` more bytes fit;
        None once they do, else the bytes that stay held."""
        if self.limit is None:
            return None
        if size > self.limit:
            raise OSError(f"a shard of {size} bytes does not fit cache_limit={self.limit}")
        objects = sorted(self._entries("objects"))      # least recently used first
        used = sum(nbytes for _, _, nbytes in objects) + self._in_flight()
        for _, key, nbytes in objects:
            if used + size <= self.limit:
                return None
            if self._evict(key):
                used -= nbytes
        return None if used + size <= self.limit else used

    def _evict(self, key: str) -> bool:
        """Delete the shard ``key`` unless a reader holds it (its shared lock)."""
        try:
            fd = os.open(self.path(key), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        else:
            self._remove(key)
            return True
        finally:
            os.close(fd)


#: what a cache folder's disk refuses: full, read-only, over quota, not ours to write
_DISK_ERRORS = (errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES, errno.EPERM,
                errno.EFBIG)


@contextlib.contextmanager
def disk_errors(root: str, what: str):
    """The disk's refusals inside as one ``OSError`` naming the cache folder and ``what`` it
    could not hold."""
    try:
        yield
    except OSError as e:
        if e.errno not in _DISK_ERRORS:
            raise
        hint = ("make room there, or give another cache_dir" if e.errno in (
            errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else "give a cache_dir this process may "
                                                          "write")
        raise OSError(e.errno, f"cache folder {root}: {e.strerror}: cannot hold {what} "
                               f"({hint})") from None


def hold(fd: int) -> None:
    """Mark the cached shard open as ``fd`` in use: eviction skips it while ``fd`` is open."""
    fcntl.flock(fd, fcntl.LOCK_SH)
