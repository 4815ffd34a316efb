"""The store interface: ``Store``, the scheme->class registry ``STORES`` and the URL rules
every store shares (which strings are URLs, how one is shown, which names it holds)."""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import urllib.parse
from collections.abc import Callable, Iterator

from fastdata.checks import printable

#: bytes of a download checksummed and written at a time: small enough to stay in the core's
#: cache between the two (docs/performance.md, "Reading from an object store")
CHUNK = 1 << 20
#: scheme -> the Store class that reads its URLs
STORES: dict[str, type[Store]] = {}
_SCHEME = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*)://")


def register_store(*schemes: str):
    """Class decorator: ``cls`` reads the URLs of ``schemes`` (replacing any store that did).

    Raises:
        ValueError: a scheme that is not a URL scheme's name.
    """
    for s in schemes:
        if not re.fullmatch(r"[a-zA-Z][a-zA-Z0-9+.-]*", s):
            raise ValueError(f"{s!r} is not a URL scheme (letters, digits, + . -)")

    def register(cls: type[Store]) -> type[Store]:
        for s in schemes:
            STORES[s.lower()] = cls
        return cls
    return register


def scheme_of(path) -> str | None:
    m = _SCHEME.match(path) if isinstance(path, str) else None
    return m.group(1).lower() if m else None


def is_url(path) -> bool:
    """Whether ``path`` is a URL (``scheme://...``), not a local path: one whose scheme no
    store reads is refused by ``open_store``, never taken for a folder."""
    return scheme_of(path) is not None


def redact(url: str) -> str:
    """``url`` without credentials (no user or password, no query string or fragment: a
    signed URL carries its signature there) and safe to print (``printable``). A bucket keeps
    its case."""
    p = urllib.parse.urlsplit(url)
    return printable(urllib.parse.urlunsplit((p.scheme, p.netloc.rpartition("@")[2], p.path,
                                              "", "")))


#: the environment's settings that hold a secret (a key, a token, a password), never shown
_SECRET_SETTING = re.compile(r"(AWS|GOOGLE|AZURE|HF)_\w*(SECRET|TOKEN|KEY|PASSWORD|SAS)\w*")


def without_secrets(text: str, url: str) -> str:
    """``text`` with the URL's user, password and query string and the environment's
    secrets (``_SECRET_SETTING``) taken out: a server may echo them in an error."""
    p = urllib.parse.urlsplit(url)
    found = [p.password, p.username, p.query] + [
        v for k, v in os.environ.items() if _SECRET_SETTING.fullmatch(k)]
    for secret in sorted(filter(None, found), key=len, reverse=True):
        if len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


def write_chunk(fd: int, chunk, done: int, limit: int | None, update) -> None:
    """``chunk`` (after ``done`` bytes) checksummed by ``update`` and written to ``fd``.

    Raises:
        ValueError: more than ``limit`` bytes in all.
    """
    if limit is not None and done + len(chunk) > limit:
        raise ValueError(f"more than the {limit} bytes expected")
    view = memoryview(chunk)
    if update is not None:
        update(view)
    while view:
        view = view[os.write(fd, view):]


class Store:
    """A set's folder in a store: the objects directly in it, by name. Picklable (a worker
    process makes its own client). A subclass gives ``chunks``, ``objects``, ``put``,
    ``create`` and ``delete``; ``read``, ``download``, ``put_file``, ``head``, ``chunks_from``
    and ``read_range`` are built on them and may be given more directly. Every failure is an
    ``OSError`` that names the object (``FileNotFoundError`` for one that is not there).

    Args:
        url: the folder's URL.
    """

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.shown = redact(self.url)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.shown!r})"

    @property
    def lists(self) -> bool:
        """Whether ``objects`` can list the folder here (a plain HTTP server cannot)."""
        return True

    def chunks(self, name: str) -> Iterator[bytes]:
        """The object ``name``'s bytes, a piece at a time."""
        raise NotImplementedError

    def objects(self) -> dict[str, int]:
        """The objects directly in the folder: name -> size in bytes."""
        raise NotImplementedError

    def head(self, name: str) -> tuple[int, str]:
        """The object ``name``'s size and version (what tells a changed object: an ETag, a
        modification time; here its size), without reading it."""
        objects = self.objects()
        if name not in objects:
            raise FileNotFoundError(f"{self.shown}/{name}: not found")
        return objects[name], str(objects[name])

    def chunks_from(self, name: str, offset: int) -> Iterator[bytes]:
        """The object ``name``'s bytes from byte ``offset`` on, a piece at a time (a store
        that reads ranges gives this directly; here the bytes before ``offset`` are read and
        dropped)."""
        skip = offset
        for chunk in self.chunks(name):
            if skip >= len(chunk):
                skip -= len(chunk)
                continue
            yield chunk[skip:] if skip else chunk
            skip = 0

    def read_range(self, name: str, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end - 1`` of the object ``name`` (fewer where it ends
        before)."""
        parts: list[bytes] = []
        n = end - start
        for chunk in self.chunks_from(name, start):
            parts.append(chunk[:n])
            n -= len(parts[-1])
            if n <= 0:
                break
        return b"".join(parts)

    def put(self, name: str, data: bytes) -> None:
        """Store ``data`` as the object ``name`` (whole, or not at all)."""
        raise NotImplementedError

    def create(self, name: str, data: bytes) -> None:
        """``put``, only where there is no object ``name`` (of two processes creating it at
        once, one does).

        Raises:
            FileExistsError: the object exists.
        """
        raise NotImplementedError

    def delete(self, names: list[str]) -> None:
        """Remove the objects ``names`` (those already gone are no error)."""
        raise NotImplementedError

    def read(self, name: str, limit: int) -> bytes:
        """The object ``name`` whole (at most ``limit`` bytes: a larger one is refused)."""
        parts: list[bytes] = []
        self._copy(name, parts.append, limit)
        return b"".join(parts)

    def download(self, name: str, fd: int, update: Callable[[memoryview], None] | None = None,
                 limit: int | None = None) -> int:
        """Stream ``name`` into the open file ``fd``; ``update`` sees each piece (a checksum).
        Returns the bytes written; more than ``limit`` is an error (a server that sends more
        than the manifest says fills no disk)."""
        done = [0]

        def write(chunk) -> None:
            write_chunk(fd, chunk, done[0], None, update)
            done[0] += len(chunk)
        self._copy(name, write, limit)
        return done[0]

    @contextlib.contextmanager
    def _named(self, name: str, what: str):
        """Failures inside as one ``OSError`` naming the object (``FileNotFoundError`` for
        one that is not there); a refused name, an existing object and a missing package
        pass as they are."""
        try:
            yield
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.shown}/{name}: not found") from None
        except (ImportError, FileExistsError, ValueError):
            raise
        except OSError as e:
            raise OSError(f"{self.shown}/{name}: {what} failed: {e.strerror or e}") from None
        except Exception as e:      # noqa: BLE001 - a file system's or client's own errors
            raise OSError(f"{self.shown}/{name}: {what} failed: {type(e).__name__}: "
                          f"{str(e)[:300]}") from None

    def _copy(self, name: str, take: Callable, limit: int | None) -> None:
        n = 0
        for chunk in self.chunks(name):
            n += len(chunk)
            if limit is not None and n > limit:
                raise OSError(f"{self.shown}/{name}: more than the {limit} bytes expected")
            take(chunk)

    def put_file(self, name: str, path: str) -> str:
        """Upload the local file ``path`` as ``name``; returns its SHA-256 (hex)."""
        with open(path, "rb") as f:
            data = f.read()
        self.put(name, data)
        return hashlib.sha256(data).hexdigest()
