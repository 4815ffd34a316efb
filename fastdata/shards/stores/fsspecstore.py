"""Any file system fsspec knows (``memory://``, ``hf://`` with ``huggingface_hub``, ``ftp://``,
an in-house one registered with fsspec) as a store: ``pip install fsspec`` and the file
system's own package. Its configuration is fsspec's (its environment variables and config
files)."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from fastdata._optional import require
from fastdata.shards.stores.base import CHUNK, Store
from fastdata.shards.stores.local import plain_name


class FsspecStore(Store):
    """A folder of an fsspec file system, by its URL (``protocol://path``)."""

    def __init__(self, url: str):
        super().__init__(url)
        self._fs = None
        self._root = ""

    def __getstate__(self):
        return {**self.__dict__, "_fs": None}      # each process opens its own

    @property
    def fs(self):
        if self._fs is None:
            fsspec = require("fsspec", f"reading {self.shown.split('://')[0]}:// URLs")
            self._fs, self._root = fsspec.core.url_to_fs(self.url)
        return self._fs

    def _path(self, name: str) -> str:
        _ = self.fs
        return f"{self._root.rstrip('/')}/{plain_name(name)}"

    def chunks(self, name: str) -> Iterator[bytes]:
        return self.chunks_from(name, 0)

    def chunks_from(self, name: str, offset: int) -> Iterator[bytes]:
        with self._named(name, "reading"):
            f = self.fs.open(self._path(name), "rb")
        with f:
            with self._named(name, "reading"):
                f.seek(offset)
            while True:
                with self._named(name, "reading"):
                    chunk = f.read(CHUNK)
                if not chunk:
                    return
                yield chunk

    def read_range(self, name: str, start: int, end: int) -> bytes:
        with self._named(name, "reading"):
            return self.fs.cat_file(self._path(name), start=start, end=end)

    def objects(self) -> dict[str, int]:
        with self._named("", "listing"):
            found = self.fs.ls(self._root, detail=True)
        return {o["name"].rstrip("/").rsplit("/", 1)[-1]: int(o.get("size") or 0)
                for o in found if o.get("type") == "file"}

    def put(self, name: str, data: bytes) -> None:
        with self._named(name, "upload"):
            self.fs.pipe_file(self._path(name), data)

    def create(self, name: str, data: bytes) -> None:
        with self._named(name, "create"):
            if self.fs.exists(self._path(name)):       # no atomic create in fsspec's API
                raise FileExistsError(f"{self.shown}/{name} exists")
            self.fs.pipe_file(self._path(name), data)

    def delete(self, names: list[str]) -> None:
        for name in names:
            with self._named(name, "removing"), contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(self._path(name))
