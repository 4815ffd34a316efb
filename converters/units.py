"""The unit of work of a conversion, the same for every engine: a shard holds the readable
files of one range of the sorted source list; the error of inputs that cannot be read; the
options a finished set records; where OUT is; a labels file read with its limits."""
from __future__ import annotations

import os
import stat


class ConversionError(RuntimeError):
    """Inputs that cannot be read stopped the conversion (``on_error="raise"``)."""


def range_end(pos: int, shard_size: int, files: int) -> int:
    """Where the range of source files holding position ``pos`` ends. A shard holds the
    readable files of one range, ``[k * shard_size, (k + 1) * shard_size)``, so that any
    engine cuts the same shards (a range with none readable adds its skips to the next)."""
    return min((pos // shard_size + 1) * shard_size, files)


def manifest_options(done: dict) -> dict | None:
    """The options a finished set's manifest records, as ``convert()`` takes them (None in a
    manifest too old to record them all)."""
    if "shard_size" not in done:
        return None
    keys = ("container", "sizes", "encoding", "quality", "fit", "shard_size")
    found = {k: done.get(k) for k in keys}
    if done.get("labels_file") is not None:     # labels from a file, not from folders
        found["labels"] = done["labels_file"]
    if done.get("coco_file") is not None:       # a detection set's annotations file
        found["coco"] = done["coco_file"]
    if done.get("masks_dir") is not None:       # a segmentation set's class maps
        found["masks"] = done["masks_dir"]
    if done.get("shuffle"):
        found["shuffle"] = True
    if isinstance(done.get("field_kinds"), dict):   # the kinds given for its columns
        found["fields"] = done["field_kinds"]
    for key, name in (("source_kind", "source"), ("split", "split"),
                      ("image_column", "image_column")):
        if isinstance(done.get(key), str):      # a source's kind, a dataset's split...
            found[name] = done[key]
    return found


def output_folder(out: str) -> str | None:
    """The local folder a conversion's OUT names (a path, or a ``file://`` URL); None for a
    store's URL (``s3://``, ``gs://``...)."""
    import urllib.parse

    from fastdata.shards.stores import is_url

    if out.lower().startswith("file://"):
        return urllib.parse.unquote(urllib.parse.urlsplit(out).path)
    return None if is_url(out) else out


def read_limited(path: str, limit: int, what: str) -> bytes:
    """The bytes of a labels file (``what`` names it in errors): a FIFO or a device is refused
    before it is read (opened without blocking), a file over ``limit`` bytes before a byte
    of it is.

    Raises:
        ValueError: not a regular file, or larger than ``limit``.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{what} {path} is not a regular file (a FIFO, a device or a "
                             f"folder): refused")
        if st.st_size > limit:
            raise ValueError(f"{what} {path} is {st.st_size} bytes, more than {limit}: refused "
                             f"before it is read")
        os.set_blocking(fd, True)
        with open(fd, "rb", closefd=False) as f:
            return f.read(limit + 1)
    finally:
        os.close(fd)
