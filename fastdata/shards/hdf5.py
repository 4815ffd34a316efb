"""HDF5 shards: raw samples read through a memory map of the contiguous dataset (h5py only
finds the byte offsets, once per process), JPEG records as one flat byte dataset and offsets."""
from __future__ import annotations

import mmap
import os

import numpy as np

from fastdata.fields import Column
from fastdata.format import (
    ShardFormatError,
)
from fastdata.shards.mapped import address, guard, unguard, will_need
from fastdata.shards.reader import ShardReader, register


@register
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
                    if (o.shape != (self.count + 1,) or o[0] != 0 or o[-1] != ds.size  # type: ignore[operator]
                            or (np.diff(o) < 0).any()):
                        raise ShardFormatError(f"offsets/{s} do not cut jpeg/{s} into "
                                               f"{self.count} records")
            columns = {}
            for name, kind in self.fields.items():
                columns[name], stop = self._column(f, fd, name, kind, size, guards)
                end = max(end, stop)
        return self._with_records({"maps": maps, "offsets": offsets, "end": end, "guards": guards},
                                  fd, meta, labels, crcs, columns)

    def _column(self, f, fd: int, name: str, kind, size: int, guards: list) -> tuple:
        """Field ``name``'s column, its values mapped from the file as the images are (a
        compact dataset read whole), and where its bytes end."""
        ndim = 1 + len(kind.shape) if kind.fixed else 1
        ds = _dataset(f, f"fields/{name}/values", kind.dtype if kind.fixed else np.uint8, ndim)
        off, nbytes = ds.id.get_offset(), ds.size * ds.dtype.itemsize
        if off is not None and off + nbytes > size:
            raise ShardFormatError(f"dataset fields/{name}/values lies past the file's end "
                                   f"({size} bytes): the file is cut short")
        if off is None or not nbytes:
            values = ds[()]
        else:
            values = self._map(fd, off, (nbytes,), guards).view(ds.dtype).reshape(ds.shape)
        offsets = None if kind.fixed else _dataset(f, f"fields/{name}/offsets", np.int64, 1)[()]
        return Column(values, offsets), (off or 0) + nbytes

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
            will_need((address(v), v.nbytes) for v in views)
        return views

    def read_raw(self, size, local, out, rows):
        order = np.argsort(local, kind="stable")
        for r, v in zip(rows[order].tolist(), self.payloads(size, local[order])):
            out[r] = v


def _dataset(f, name: str, dtype, ndim: int):
    """HDF5 dataset ``name`` of ``f``, if it is one the writer makes: stored in the shard file
    itself, contiguous (or compact) and unfiltered, with ``dtype`` and ``ndim``. A link to
    another file, external storage or a virtual dataset would make the reader read whatever
    file it names (a FIFO there blocks)."""
    import h5py

    parts = name.split("/")
    for k in range(1, len(parts)):      # each group on the way: a link could lead elsewhere
        parent = "/".join(parts[:k])
        found = f.get(parent, getlink=True)
        if not isinstance(found, h5py.HardLink):
            raise ShardFormatError(f"dataset {name} is missing" if found is None else
                                   f"group {parent} is not a group in the shard file")
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
