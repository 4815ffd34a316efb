"""Shard sets on disk: ``ShardSet`` and ``open`` over HDF5 and LMDB containers, raw and JPEG
encodings; a reader per container (``READERS``), memory-mapped I/O and its fault guard, JPEG
decoding, ``verify``, and ``Mixture`` (several sets read as one)."""
from fastdata.shards import hdf5, lmdb  # noqa: F401 - each registers its reader
from fastdata.shards.jpeg import decode_jpeg
from fastdata.shards.mixture import Mixture
from fastdata.shards.reader import READERS, ShardReader
from fastdata.shards.set import ShardSet, open  # noqa: A004

__all__ = ["READERS", "Mixture", "ShardReader", "ShardSet", "decode_jpeg", "open"]
