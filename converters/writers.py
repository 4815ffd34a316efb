"""Shard writers: one ``Writer`` per container, registered by container name.

The converter fills a ``ShardBuffer`` (bounded by ``--shard-size``) and hands it to
``Writer.write``, which writes ``<file>.tmp`` and renames it into place, so a shard file on disk
is always complete. Layouts are documented in ``fastdata.format``.
"""
from __future__ import annotations

import errno
import os
import shutil

import numpy as np

from fastdata.format import (LMDB_LABELS, LMDB_META, ShardMeta, lmdb_crc_key, lmdb_key,
                             shard_checksum)


class ShardBuffer:
    """Samples of one shard, in order. Raw payloads go into preallocated arrays (no copies later)."""

    def __init__(self, sizes: tuple[int, ...], encoding: str, capacity: int):
        self.sizes, self.encoding, self.capacity = sizes, encoding, capacity
        self.crcs = {s: np.zeros(capacity, np.uint32) for s in sizes}
        self.raw = ({s: np.empty((capacity, s, s, 3), np.uint8) for s in sizes}
                    if encoding == "raw" else {})
        self.clear()

    def clear(self) -> "ShardBuffer":
        """Empty it for the next shard, keeping the arrays (their pages are already mapped)."""
        self.labels: list[int] = []
        self.encoded: dict[int, list[bytes]] = {s: [] for s in self.sizes}
        return self

    def __len__(self) -> int:
        return len(self.labels)

    def add(self, label: int, payloads: list[bytes], crcs: list[int]) -> None:
        i = len(self.labels)
        for s, p, c in zip(self.sizes, payloads, crcs):
            self.crcs[s][i] = c
            if self.encoding == "raw":
                self.raw[s][i] = np.frombuffer(p, np.uint8).reshape(s, s, 3)
            else:
                self.encoded[s].append(p)
        self.labels.append(label)

    def payloads(self, size: int):
        n = len(self)
        if self.encoding == "raw":
            return (self.raw[size][i] for i in range(n))
        return iter(self.encoded[size])

    def checksum(self) -> str:
        return shard_checksum(self.labels, [self.crcs[s][: len(self)] for s in self.sizes])


class Writer:
    container: str = ""

    def write(self, path: str, buf: ShardBuffer, meta: ShardMeta) -> int:
        """Write the shard atomically to ``path``; return its size in bytes."""
        tmp = path + ".tmp"
        try:
            self._write(tmp, buf, meta)
        except BaseException as e:      # e.g. a full disk: no partial file left taking space
            if os.path.exists(tmp):
                os.remove(tmp)
            if isinstance(e, OSError) and e.errno == errno.ENOSPC:
                free = shutil.disk_usage(os.path.dirname(path)).free >> 20
                raise OSError(e.errno, f"no space left on the device to write "
                              f"{os.path.basename(path)} ({free} MiB free); the shards "
                              f"before it are complete: make room, then run the same "
                              f"command with --resume") from e
            raise
        os.replace(tmp, path)
        return os.path.getsize(path)

    def _write(self, tmp: str, buf: ShardBuffer, meta: ShardMeta) -> None:
        raise NotImplementedError


class HDF5Writer(Writer):
    container = "hdf5"

    def _write(self, tmp, buf, meta):
        import h5py

        n = len(buf)
        with h5py.File(tmp, "w", locking=False) as f:    # a private name (see the reader)
            f.attrs["meta"] = meta.to_json()
            f.create_dataset("labels", data=np.asarray(buf.labels, np.int64), track_times=False)
            for s in buf.sizes:     # no chunks, no compression: contiguous, memory-mappable
                if buf.encoding == "raw":
                    f.create_dataset(f"images/{s}", data=buf.raw[s][:n], track_times=False)
                else:
                    lens = np.fromiter((len(p) for p in buf.encoded[s]), np.int64, n)
                    offsets = np.concatenate([[0], np.cumsum(lens)])
                    flat = np.frombuffer(b"".join(buf.encoded[s]), np.uint8)
                    f.create_dataset(f"jpeg/{s}", data=flat, track_times=False)
                    f.create_dataset(f"offsets/{s}", data=offsets, track_times=False)
                f.create_dataset(f"crc32/{s}", data=buf.crcs[s][:n], track_times=False)


class LMDBWriter(Writer):
    container = "lmdb"

    def _write(self, tmp, buf, meta):
        import lmdb

        n = len(buf)
        payload_bytes = sum(memoryview(p).nbytes for s in buf.sizes for p in buf.payloads(s))
        # writemap: values are copied once, straight into the file's pages, instead of into
        # LMDB's own dirty pages that commit then writes out. It grows the file to map_size, so
        # the file is cut back to the pages in use, the size it would have had without writemap.
        map_size = int(payload_bytes * 1.5) + (64 << 20)
        env = lmdb.open(tmp, subdir=False, map_size=map_size, lock=False, sync=False,
                        metasync=False, writemap=True)
        try:
            # the grown file is sparse: a page written through the map that the disk has no
            # room for kills the process (SIGBUS). Allocated first, a full disk is an OSError.
            fd = os.open(tmp, os.O_RDWR)
            try:
                if hasattr(os, "posix_fallocate"):      # not on macOS: sparse, as before
                    os.posix_fallocate(fd, 0, map_size)
            except OSError as e:        # a file system that cannot: sparse, as before
                if e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
                    raise
            finally:
                os.close(fd)
            with env.begin(write=True) as txn:
                for s in buf.sizes:
                    for i, p in enumerate(buf.payloads(s)):
                        txn.put(lmdb_key(s, i), memoryview(p))
                    txn.put(lmdb_crc_key(s), buf.crcs[s][:n].tobytes())
                txn.put(LMDB_LABELS, np.asarray(buf.labels, np.int64).tobytes())
                txn.put(LMDB_META, meta.to_json().encode())
            used = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        finally:
            env.close()
        os.truncate(tmp, used)


WRITERS: dict[str, type[Writer]] = {w.container: w for w in (HDF5Writer, LMDBWriter)}
