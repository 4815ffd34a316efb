"""The unit of work of a conversion, the same for every engine: a shard holds the readable
files of one range of the sorted source list; and the error of inputs that cannot be read."""
from __future__ import annotations


class ConversionError(RuntimeError):
    """Inputs that cannot be read stopped the conversion (``on_error="raise"``)."""


def range_end(pos: int, shard_size: int, files: int) -> int:
    """Where the range of source files holding position ``pos`` ends. A shard holds the
    readable files of one range, ``[k * shard_size, (k + 1) * shard_size)``, so that any
    engine cuts the same shards (a range with none readable adds its skips to the next)."""
    return min((pos // shard_size + 1) * shard_size, files)
