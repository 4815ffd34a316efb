"""The files a source is made of (tars, parquet files): found on disk or in a store (a file, a
folder of them, or a pattern such as ``shard-{000000..000127}.tar``), read in order or by
byte range without a local copy, and named in a fingerprint by size and version."""
from __future__ import annotations

import fnmatch
import os
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from fastdata.shards.stores import is_url, open_store, redact

#: bytes a sequential read of a local file asks for at a time
READ_BYTES = 1 << 20
#: decompressed bytes a gzip stream gives at a time: what comes before damage is read
INFLATE_BYTES = 64 << 10
_BRACE = re.compile(r"\{([^{}]*)\}")


def expand(pattern: str) -> list[str]:
    """A brace pattern's names in order: ``a-{000..002}.tar`` (a range, zero-padded as
    written) or ``{train,val}.tar`` (a list); a name without braces is itself.

    Raises:
        ValueError: a range that is not of integers, or of more than a million names.
    """
    m = _BRACE.search(pattern)
    if m is None:
        return [pattern]
    body, head, tail = m.group(1), pattern[:m.start()], pattern[m.end():]
    if ".." in body:
        lo, _, hi = body.partition("..")
        if not (lo.isdigit() and hi.isdigit()) or int(hi) < int(lo):
            raise ValueError(f"{pattern!r}: {{{body}}} is not a range of integers "
                             f"{{FIRST..LAST}}")
        if int(hi) - int(lo) >= 1 << 20:
            raise ValueError(f"{pattern!r}: {{{body}}} names more than a million files")
        width = len(lo) if lo.startswith("0") else 0
        parts = [str(k).zfill(width) for k in range(int(lo), int(hi) + 1)]
    else:
        parts = body.split(",")
    return [name for part in parts for name in expand(head + part + tail)]


def is_pattern(name: str) -> bool:
    """Whether ``name`` is a brace or glob pattern, not a file's name."""
    return bool(_BRACE.search(name)) or any(c in name for c in "*?[")


@dataclass(frozen=True)
class Piece:
    """One file of a source.

    Attributes:
        name: its name as shown and in sample keys (a path relative to the source, or the
            object's name in its store folder).
        where: the local file's path, or the URL of the store folder that holds ``name``.
        size: its size in bytes.
        version: what tells a changed file (the modification time, the store's ETag).
    """

    name: str
    where: str
    size: int
    version: str = ""

    @property
    def remote(self) -> bool:
        return is_url(self.where)

    @property
    def compressed(self) -> bool:
        """Whether it is gzip-compressed (``.gz``, ``.tgz``): read in order only."""
        return self.name.lower().endswith((".gz", ".tgz"))

    @property
    def shown(self) -> str:
        return f"{redact(self.where)}/{self.name}" if self.remote else self.where

    def reader(self, offset: int = 0) -> Reader:
        """Its bytes (decompressed, for a compressed piece) in order from ``offset``."""
        if self.compressed:
            reader: Reader = GzipReader(self._raw(0), self.shown)
            reader.skip(offset)
            return reader
        return self._raw(offset)

    def _raw(self, offset: int) -> Reader:
        if self.remote:
            return ChunkReader(_store(self.where).chunks_from(self.name, offset), offset)
        return FileReader(self.where, offset)

    def read(self, start: int, end: int) -> bytes:
        """Its bytes ``start`` to ``end - 1`` (a byte range of the stored file).

        Raises:
            OSError: the piece ends before ``end``.
        """
        if self.remote:
            data = _store(self.where).read_range(self.name, start, end)
        else:
            with open(self.where, "rb") as f:
                f.seek(start)
                data = f.read(end - start)
        if len(data) != end - start:
            raise OSError(f"{self.shown}: {len(data)} bytes at byte {start}, not "
                          f"{end - start}: the file changed or is cut short")
        return data


_STORES: dict[str, object] = {}


def _store(url: str):
    """One store object per folder URL and process (each makes its own client)."""
    if url not in _STORES:
        _STORES[url] = open_store(url)
    return _STORES[url]


class Reader:
    """Bytes in order: ``read(n)`` (fewer only at the end), ``skip(n)``, ``tell()``."""

    def __init__(self, offset: int = 0):
        self.offset = offset

    def tell(self) -> int:
        return self.offset

    def read(self, n: int) -> bytes:
        raise NotImplementedError

    def skip(self, n: int) -> int:
        """Pass ``n`` bytes; returns how many there were."""
        done = 0
        while done < n:
            got = len(self.read(min(n - done, READ_BYTES)))
            if not got:
                break
            done += got
        return done


class FileReader(Reader):
    """A local file: a skip is a seek, a read one ``pread``."""

    def __init__(self, path: str, offset: int = 0):
        super().__init__(offset)
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)
        self.size = os.fstat(self.fd).st_size

    def __del__(self):
        fd = getattr(self, "fd", None)
        if fd is not None:
            os.close(fd)
            self.fd = None

    def read(self, n: int) -> bytes:
        data = os.pread(self.fd, n, self.offset)
        while data and len(data) < n:      # a short read before the end
            more = os.pread(self.fd, n - len(data), self.offset + len(data))
            if not more:
                break
            data += more
        self.offset += len(data)
        return data

    def skip(self, n: int) -> int:
        n = max(0, min(n, self.size - self.offset))
        self.offset += n
        return n


class ChunkReader(Reader):
    """Bytes as an iterator of chunks gives them (a store's stream)."""

    def __init__(self, chunks: Iterator[bytes], offset: int = 0):
        super().__init__(offset)
        self.chunks = chunks
        self.buffer = memoryview(b"")

    def read(self, n: int) -> bytes:
        parts = []
        while n > 0:
            if not self.buffer:
                chunk = next(self.chunks, b"")
                if not chunk:
                    break
                self.buffer = memoryview(chunk)
            parts.append(self.buffer[:n])
            self.buffer = self.buffer[len(parts[-1]):]
            n -= len(parts[-1])
        data = b"".join(parts)
        self.offset += len(data)
        return data


class GzipReader(Reader):
    """A gzip stream's decompressed bytes (several members one after another, as ``gzip``
    writes appended files), offsets counted in decompressed bytes; never more than a read's
    worth decompressed at a time (a small file that inflates to terabytes fills nothing)."""

    def __init__(self, raw: Reader, shown: str):
        super().__init__(0)
        self.raw, self.shown = raw, shown
        self.inflate = zlib.decompressobj(wbits=31)
        self.pending = b""          # compressed bytes not yet fed
        self.buffer = bytearray()
        self.open = False           # a member has begun and not ended

    def _more(self) -> bool:
        """Decompress more into the buffer; False at the end of the stream."""
        while True:
            if self.inflate.eof:        # the member ended: a next one, where bytes follow
                self.pending = self.inflate.unused_data    # (its unconsumed_tail holds them too)
                self.inflate, self.open = zlib.decompressobj(wbits=31), False
            if not self.pending:
                self.pending = self.raw.read(INFLATE_BYTES)
                if not self.pending:
                    if self.open:
                        raise OSError(f"{self.shown}: its gzip stream ends early (after "
                                      f"{self.raw.tell()} compressed bytes)")
                    return False
            self.open = True
            try:
                out = self.inflate.decompress(self.pending, INFLATE_BYTES)
            except zlib.error as e:
                raise OSError(f"{self.shown}: its gzip data is damaged near compressed byte "
                              f"{self.raw.tell()} ({e})") from None
            self.pending = self.inflate.unconsumed_tail
            if out:
                self.buffer += out
                return True

    def read(self, n: int) -> bytes:
        while len(self.buffer) < n and self._more():
            pass
        data = bytes(self.buffer[:n])
        del self.buffer[:n]
        self.offset += len(data)
        return data


def holds(src: str, suffixes: tuple[str, ...], also: tuple[str, ...] = ()) -> bool:
    """Whether ``src`` names files ending in ``suffixes``: one such file, a pattern of them,
    or a folder (on disk or in a store) with one directly in it or in a subfolder ``also``
    names."""
    name = src.rstrip("/").rsplit("/", 1)[-1].lower()
    if name.endswith(suffixes) or (is_pattern(name) and any(s in name for s in suffixes)):
        return True
    try:
        if is_url(src):
            return any(n.lower().endswith(suffixes) for n in _store(src.rstrip("/")).objects())
        folders = [src] + [os.path.join(src, a) for a in also]
        return any(n.lower().endswith(suffixes) for f in folders if os.path.isdir(f)
                   for n in os.listdir(f))
    except (OSError, ValueError):
        return False


def find(src: str, suffixes: tuple[str, ...], what: str) -> list[Piece]:
    """The pieces ``src`` names: a file, a folder's files with one of ``suffixes`` (sorted by
    their path in it), or a pattern of names (``a-{000..009}.tar``, ``*.parquet``); on disk
    or in a store (a URL).

    Raises:
        FileNotFoundError: nothing there, or a file a brace pattern names is missing.
        ValueError: a folder or pattern without a single such file (``what`` names them).
    """
    if is_url(src):
        return _in_store(src.rstrip("/"), suffixes, what)
    return _on_disk(os.path.abspath(src), suffixes, what)


def _on_disk(src: str, suffixes: tuple[str, ...], what: str) -> list[Piece]:
    folder, name = os.path.split(src)
    if is_pattern(name):
        pieces = _matching(folder, name, sorted(os.listdir(folder)) if os.path.isdir(folder)
                           else [], lambda n: _local(os.path.join(folder, n), n))
    elif os.path.isfile(src):
        pieces = [_local(src, name)]
    elif os.path.isdir(src):
        pieces = [_local(os.path.join(src, rel), rel) for rel in _walk(src, suffixes)]
    else:
        raise FileNotFoundError(f"source {src!r} does not exist")
    if not pieces:
        raise ValueError(f"{src}: no {what} in it (files ending in {', '.join(suffixes)})")
    return pieces


def _walk(root: str, suffixes: tuple[str, ...]) -> list[str]:
    """The files under ``root`` ending in ``suffixes``, as sorted relative paths (hidden
    entries left out)."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        rel = os.path.relpath(folder, root)
        found += [os.path.normpath(os.path.join(rel, f)) for f in files
                  if f.lower().endswith(suffixes) and not f.startswith(".")]
    return sorted(found)


def _local(path: str, name: str) -> Piece:
    st = os.stat(path)
    return Piece(name, path, st.st_size, f"{st.st_size}:{st.st_mtime_ns}")


def _in_store(src: str, suffixes: tuple[str, ...], what: str) -> list[Piece]:
    folder, _, name = src.rpartition("/")
    store = _store(folder) if is_pattern(name) or name.lower().endswith(suffixes) else None
    if store is None:
        folder, name, store = src, "", _store(src)
    if not store.lists:         # a plain HTTP server: each file by name
        return [Piece(n, folder, *store.head(n)) for n in _named(src, name, suffixes)]
    listing = _listing(store)
    if is_pattern(name):
        pieces = _matching(folder, name, sorted(listing),
                           lambda n: Piece(n, folder, *listing[n]))
    elif name:
        if name not in listing:
            raise FileNotFoundError(f"{redact(src)}: not found")
        pieces = [Piece(name, folder, *listing[name])]
    else:
        pieces = [Piece(n, folder, *listing[n]) for n in sorted(listing)
                  if n.lower().endswith(suffixes)]
    if not pieces:
        raise ValueError(f"{redact(src)}: no {what} there (objects ending in "
                         f"{', '.join(suffixes)})")
    return pieces


def _named(src: str, name: str, suffixes: tuple[str, ...]) -> list[str]:
    """The files a URL of a store that cannot list names: one, or a brace pattern's.

    Raises:
        ValueError: a folder or a glob (naming what to give instead).
    """
    if name.lower().endswith(suffixes) and not is_pattern(name):
        return [name]
    if _BRACE.search(name) and not any(c in name for c in "*?["):
        return expand(name)
    raise ValueError(f"{redact(src)}: a plain HTTP server cannot list a folder: give a file's "
                     f"URL or a brace pattern of them (shard-{{000000..000127}}.tar)")


def _listing(store) -> dict[str, tuple[int, str]]:
    """A store folder's objects: name -> (size, version)."""
    versions = getattr(store, "versions", None)
    if versions is not None:
        return versions()
    return {n: (size, str(size)) for n, size in store.objects().items()}


def _matching(folder: str, pattern: str, names: list[str], piece) -> list[Piece]:
    """The pieces of ``names`` that ``pattern`` matches: a brace pattern's names in its order
    (each must be there), or a glob's in sorted order."""
    if _BRACE.search(pattern):
        wanted = expand(pattern)
        have = set(names)
        missing = [n for n in wanted if n not in have]
        if missing:
            raise FileNotFoundError(f"{folder}/{missing[0]}: not found ({len(missing)} of "
                                    f"the {len(wanted)} files {pattern} names are missing)")
        return [piece(n) for n in wanted]
    # as a shell's glob: a hidden file only where the pattern starts with a dot
    return [piece(n) for n in names if fnmatch.fnmatchcase(n, pattern)
            and (not n.startswith(".") or pattern.startswith("."))]
