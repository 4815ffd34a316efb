"""The shard-set schema: manifest fields, version, names and dtypes shared by readers and writers.

A shard set is a directory holding shard files plus ``manifest.json`` (written last, atomically).
Per shard, for every stored size ``S``:

* raw encoding: ``S*S*3`` uint8 bytes per sample (HWC, RGB). In HDF5 one contiguous,
  uncompressed dataset ``images/<S>`` of shape ``(n, S, S, 3)`` (memory-mappable; the writer
  puts it on a ``PAGE`` boundary, which readers do not rely on: they ask HDF5 for the offset).
* jpeg encoding: one JPEG file per sample. In HDF5 a flat contiguous uint8 dataset ``jpeg/<S>``
  plus ``offsets/<S>`` (int64, ``n + 1`` entries).
* ``crc32/<S>``: uint32 CRC-32 of each sample's payload (names the damaged sample in ``verify``).

plus ``labels`` (int64). LMDB shards hold the same records under the keys built below.
The shard checksum (manifest ``shards[i].sha256``) is the SHA-256 of ``labels`` (int64 little
endian) followed, for each size ascending, by the uint32 little-endian CRC-32s of the samples'
payloads. ``verify`` recomputes every CRC from the payload bytes, so any damaged byte of image
data changes the checksum (CRC-32 detects every error burst up to 32 bits) and names its sample;
the writer avoids a second full pass over the pixels.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from zlib_ng.zlib_ng import crc32  # noqa: F401 - zlib's CRC-32 (same values), SIMD: 4x faster

FORMAT_NAME = "fastdata-shards"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"

CONTAINERS = ("hdf5", "lmdb")
ENCODINGS = ("raw", "jpeg")
FITS = ("crop", "pad", "stretch")
SHARD_SUFFIX = {"hdf5": ".h5", "lmdb": ".lmdb"}
MIN_SIZE = 8
#: background that transparent pixels (RGBA, LA, palette with transparency) and ``fit="pad"``
#: borders are composited onto
BACKGROUND = (255, 255, 255)
PAGE = 4096        # raw HDF5 image datasets start on a page boundary (written with O_DIRECT)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff", ".gif")


class ShardFormatError(ValueError):
    """A directory is not a readable shard set (missing/unknown manifest, bad version)."""


def check_size(size: Any) -> int:
    """Return ``size`` as int if it is a power of two >= MIN_SIZE, else raise naming the value."""
    try:
        s = int(str(size).strip())
    except ValueError:
        s = 0
    if s < MIN_SIZE or s & (s - 1):
        raise ValueError(f"size {size!r} is not a power of two >= {MIN_SIZE}; "
                         f"valid sizes are 8, 16, 32, 64, 128, 256, 512, 1024, ...")
    return s


def shard_file(container: str, index: int) -> str:
    return f"shard-{index:05d}{SHARD_SUFFIX[container]}"


def lmdb_key(size: int, local: int) -> bytes:
    """Sorting keys bytewise sorts them by (size, sample)."""
    return b"%05d/%09d" % (size, local)


LMDB_META = b"__meta__"        # JSON: shard metadata (see ShardMeta)
LMDB_LABELS = b"__labels__"    # int64 labels


def lmdb_crc_key(size: int) -> bytes:
    return b"__crc32__/%05d" % size


@dataclass
class ShardMeta:
    """Per-shard metadata stored inside the shard itself (HDF5 attribute / LMDB key).

    ``config`` and ``sources`` let ``convert --resume`` prove a shard belongs to the same job and
    continue exactly where it ended.
    """

    index: int
    start: int                      # global index of the first sample
    count: int
    sha256: str                     # content checksum (see module docstring)
    config: str                     # fingerprint of the conversion options + input list
    sources: tuple[int, int]        # [first, end) positions in the candidate file list
    skipped: list[dict] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps({**self.__dict__, "sources": list(self.sources)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> "ShardMeta":
        d = json.loads(text)
        d["sources"] = tuple(d["sources"])
        return cls(**d)


def shard_checksum(labels, crcs_by_size) -> str:
    """The documented shard checksum from labels and ``[crc32 array per size, ascending]``."""
    h = hashlib.sha256(np.ascontiguousarray(labels, "<i8").tobytes())
    for crcs in crcs_by_size:
        h.update(np.ascontiguousarray(crcs, "<u4").tobytes())
    return h.hexdigest()


def read_manifest(root: str | os.PathLike) -> dict:
    path = os.path.join(os.fspath(root), MANIFEST)
    if not os.path.isfile(path):
        shards = os.path.isdir(root) and any(n.startswith("shard-") for n in os.listdir(root))
        hint = ("it holds shards of a conversion that did not finish: finish it with "
                "`fastdata convert SRC OUT --resume`" if shards else
                "convert an image folder with `fastdata convert SRC OUT`")
        raise ShardFormatError(f"{os.fspath(root)!r} is not a shard set: no {MANIFEST} ({hint})")
    try:
        with open(path, encoding="utf-8") as f:
            m = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ShardFormatError(f"{path}: not readable JSON ({e}); the manifest is damaged, "
                               f"convert again (`fastdata convert --resume` reuses sound "
                               f"shards)") from e
    if not isinstance(m, dict) or m.get("format") != FORMAT_NAME:
        raise ShardFormatError(f"{path}: not a fastdata manifest (format="
                               f"{(m.get('format') if isinstance(m, dict) else m)!r})")
    if m.get("version") != FORMAT_VERSION:
        raise ShardFormatError(f"{path}: format version {m.get('version')!r} is not supported "
                               f"by this fastdata (reads version {FORMAT_VERSION})")
    return m


def json_text(obj: Any, *, sort_keys: bool = False) -> str:
    """JSON that keeps non-ASCII names readable, and escapes (``\\udcfe``) the lone surrogates
    by which Python's ``os`` functions carry file names that are not UTF-8: UTF-8 cannot
    encode those, and the escape reads back as the same name."""
    text = json.dumps(obj, indent=1, sort_keys=sort_keys, ensure_ascii=False)
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def write_json_atomic(path: str, obj: Any) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json_text(obj, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
