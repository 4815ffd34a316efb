"""Shard sets on disk: ``ShardSet`` and ``open`` over HDF5 and LMDB containers, raw and JPEG
encodings; a reader per container (``READERS``), memory-mapped I/O and its fault guard, JPEG
decoding, ``verify``, ``Mixture`` (several sets read as one), and ``SampleSource``, the
protocol of what a loader reads (both)."""
from fastdata.shards import hdf5, lmdb  # noqa: F401 - each registers its reader
from fastdata.shards.jpeg import decode_jpeg
from fastdata.shards.mixture import Mixture
from fastdata.shards.reader import READERS, ShardReader
from fastdata.shards.set import ShardSet, open  # noqa: A004
from fastdata.shards.source import SampleSource

__all__ = ["READERS", "Mixture", "SampleSource", "ShardReader", "ShardSet", "decode_jpeg",
           "open"]
