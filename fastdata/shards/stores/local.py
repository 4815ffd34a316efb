"""``file://`` URLs: a set's folder on a local or mounted file system, read through the node
cache as a store's (what a job that treats every set as remote sees)."""
from __future__ import annotations

import contextlib
import os
import urllib.parse
from collections.abc import Iterator

from fastdata.outdir import replace_atomically
from fastdata.shards.stores.base import CHUNK, Store, register_store


def plain_name(name: str) -> str:
    """``name`` if it names an object directly in the folder (no ``/``, not ``..``).

    Raises:
        ValueError: any other name.
    """
    if not name or "/" in name or "\x00" in name or name in (".", ".."):
        raise ValueError(f"{name!r} is not an object's name in the set's folder")
    return name


@register_store("file")
class LocalStore(Store):
    """A folder, by its ``file://`` URL: objects are its regular files (a link is not
    followed)."""

    def __init__(self, url: str):
        super().__init__(url)
        self.root = urllib.parse.unquote(urllib.parse.urlsplit(self.url).path) or "/"

    def _path(self, name: str) -> str:
        return os.path.join(self.root, plain_name(name))

    def chunks(self, name: str) -> Iterator[bytes]:
        return self.chunks_from(name, 0)

    def chunks_from(self, name: str, offset: int) -> Iterator[bytes]:
        with self._named(name, "reading"):
            fd = os.open(self._path(name), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        try:
            while True:
                with self._named(name, "reading"):
                    chunk = os.pread(fd, CHUNK, offset)
                if not chunk:
                    return
                offset += len(chunk)
                yield chunk
        finally:
            os.close(fd)

    def read_range(self, name: str, start: int, end: int) -> bytes:
        with self._named(name, "reading"):
            fd = os.open(self._path(name), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            try:
                return os.pread(fd, max(0, end - start), start)
            finally:
                os.close(fd)

    def objects(self) -> dict[str, int]:
        with self._named("", "listing"), os.scandir(self.root) as it:
            return {e.name: e.stat(follow_symlinks=False).st_size for e in it
                    if e.is_file(follow_symlinks=False)}

    def put(self, name: str, data: bytes) -> None:
        with self._named(name, "upload"):
            replace_atomically(self._path(name), data)

    def create(self, name: str, data: bytes) -> None:
        with self._named(name, "create"):
            try:
                fd = os.open(self._path(name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                raise FileExistsError(f"{self.shown}/{name} exists") from None
            with os.fdopen(fd, "wb") as f:
                f.write(data)

    def delete(self, names: list[str]) -> None:
        for name in names:
            with self._named(name, "removing"), contextlib.suppress(FileNotFoundError):
                os.remove(self._path(name))
