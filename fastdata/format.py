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

Labels (``label_kind``, version 2): class indices in ``labels``; or, for multi-label and
regression sets converted before the field ``label`` held them (below), one float32 ``(N, K)``
array for the whole set in ``TARGETS`` beside the shards (its shape and SHA-256 in the
manifest; the shards' ``labels`` are then 0), read once when the set's labels are first asked
for, as the shards' labels are. Detection and segmentation sets of version 3 keep their boxes
or class maps in ``ANNOTATIONS`` (``fastdata.shards.annotations``).

Fields (version 4): a set whose samples hold named fields beside the image and the label lists
them in the manifest's ``fields`` (``[{name, kind, params}]``, kinds from
``fastdata.fields``). Each shard holds each field's column: in HDF5 the contiguous datasets
``fields/<name>/values`` (fixed-size kinds: ``(n, *shape)`` of the kind's dtype; the others:
a flat uint8 payload) and, for variable-length kinds, ``fields/<name>/offsets`` (int64,
``n + 1``); in LMDB the same bytes under ``FIELD_KEY``. The shard checksum then continues,
field after field in the manifest's order, with the column's values and offsets as stored
(little endian). A multi-label, regression, detection or segmentation set converted with this
version holds its labels so, as the field ``label`` (``LABEL_FIELDS``: ``multilabel``,
``float``, ``boxes`` or ``classmap``, of the manifest's ``classes``), not in ``TARGETS`` or
``ANNOTATIONS``.
"""
from __future__ import annotations

import dataclasses
import errno
import functools
import hashlib
import io
import json
import os
import re
import stat
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from zlib_ng.zlib_ng import crc32  # noqa: F401 - zlib's CRC-32 (same values), in SIMD

FORMAT_NAME = "fastdata-shards"
FORMAT_VERSION = 2
#: the version of a set with boxes or class maps (``SPATIAL_KINDS``): older readers refuse it,
#: while every other set is still written as version 2
SPATIAL_VERSION = 3
#: the version of a set with fields (``fields``), whatever its labels
FIELDS_VERSION = 4
#: version 1 sets (no ``label_kind``: class labels) read as they are
READ_VERSIONS = (1, 2, 3, 4)
MANIFEST = "manifest.json"
#: what a sample's label is: a class index (int64), a multi-hot row over the classes or a row
#: of regression targets (both float32, (K,), in ``TARGETS``, one array for the whole set), or
#: boxes with their classes (and instance masks), or a class map, in ``ANNOTATIONS``
#: (``fastdata.shards.annotations``); or none: a set of images and fields only (version 4, no
#: classes, its shards' ``labels`` 0)
LABEL_KINDS = ("class", "multi_label", "regression", "detection", "segmentation", "none")
#: the label kinds whose labels are places in the picture: they move with its pixels
SPATIAL_KINDS = ("detection", "segmentation")
#: the label kinds whose labels a set holds as the field ``label`` (version 4), by the field
#: kind that holds them (``label_params``: its parameters)
LABEL_FIELDS = {"multi_label": "multilabel", "regression": "float", "segmentation": "classmap",
                "detection": "boxes"}
TARGETS = "targets.npy"
ANNOTATIONS = "annotations.bin"

#: why an input is in a manifest's ``skipped`` (its ``kind``; a set converted before kinds
#: were recorded has none): what ``info`` and a conversion's summary count
SKIP_KINDS = {"unreadable": "unreadable", "unlabelled": "without labels",
              "missing": "listed, not in the source folder",
              "bad_label": "labels that cannot be used",
              "note": "notes on inputs that were kept"}

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
#: JSON: the options of the conversion that wrote the shard (HDF5: the attribute "options"),
#: for ``convert --resume`` without them; readers do not use it
LMDB_OPTIONS = b"__options__"


def lmdb_crc_key(size: int) -> bytes:
    return b"__crc32__/%05d" % size


def lmdb_field_key(name: str, part: str) -> bytes:
    """The LMDB key of a field's ``values`` or ``offsets`` (``FIELD_KEY``)."""
    return FIELD_KEY % (name.encode(), part.encode())


FIELD_KEY = b"__field__/%s/%s"
#: a field's name: what a batch's dict is keyed by, an HDF5 dataset's and an LMDB key's part
FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
#: names a field may not take: the image, and the label every set has
RESERVED_FIELDS = ("image", "label")


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
    def from_json(cls, text: str | bytes) -> ShardMeta:
        """Raises ShardFormatError naming the field that is missing or mistyped."""
        try:
            d = json.loads(text)
        except (TypeError, ValueError, RecursionError) as e:
            raise ShardFormatError(f"shard metadata is not readable JSON ({e})") from None
        if not isinstance(d, dict):
            raise ShardFormatError(f"shard metadata is {_short(d)}, not an object")
        for name in ("index", "start", "count"):
            if not _is_int(d.get(name)) or d[name] < 0:
                raise ShardFormatError(f"shard metadata field {name} is {_short(d.get(name))}, "
                                       f"expected an integer >= 0")
        for name in ("sha256", "config"):
            if not isinstance(d.get(name), str):
                raise ShardFormatError(f"shard metadata field {name} is {_short(d.get(name))}, "
                                       f"expected a string")
        src = d.get("sources")
        if not (isinstance(src, list) and len(src) == 2 and all(map(_is_int, src))):
            raise ShardFormatError(f"shard metadata field sources is {_short(src)}, expected "
                                   f"[first, end]")
        if not isinstance(d.get("skipped", []), list):
            raise ShardFormatError("shard metadata field skipped is not a list")
        d["sources"] = tuple(src)
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})


def shard_checksum(labels, crcs_by_size, columns=()) -> str:
    """The documented shard checksum from labels, ``[crc32 array per size, ascending]`` and
    each field's column (``fastdata.fields.Column``), in the manifest's order."""
    h = hashlib.sha256(np.ascontiguousarray(labels, "<i8").tobytes())
    for crcs in crcs_by_size:
        h.update(np.ascontiguousarray(crcs, "<u4").tobytes())
    for column in columns:
        for part in (column.values, column.offsets):
            if part is not None:
                h.update(np.ascontiguousarray(part, part.dtype.newbyteorder("<")).tobytes())
    return h.hexdigest()


def read_manifest(root: str | os.PathLike) -> dict:
    """The checked manifest of the shard set at ``root``.

    Raises:
        ShardFormatError: no manifest, or one that is not valid JSON, not fastdata's, of
            another version, or whose fields are missing, mistyped or inconsistent (one line
            naming the file and the field).
    """
    path = os.path.join(os.fspath(root), MANIFEST)
    if not os.path.lexists(root):
        raise ShardFormatError(f"{os.fspath(root)!r} does not exist (a shard set is a folder "
                               f"that `fastdata convert SRC OUT` wrote)")
    if not os.path.isfile(path):
        shards = os.path.isdir(root) and any(n.startswith("shard-") for n in os.listdir(root))
        hint = ("it holds shards of a conversion that did not finish: finish it with "
                "`fastdata convert SRC OUT --resume`" if shards else
                "convert an image folder with `fastdata convert SRC OUT`")
        raise ShardFormatError(f"{os.fspath(root)!r} is not a shard set: no {MANIFEST} ({hint})")
    if os.path.getsize(path) > MAX_MANIFEST_BYTES:
        raise ShardFormatError(f"{path}: {os.path.getsize(path)} bytes, more than a manifest "
                               f"of fastdata's can be ({MAX_MANIFEST_BYTES} bytes): refused "
                               f"before it is read")
    try:
        with open(path, encoding="utf-8") as f:
            m = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise ShardFormatError(f"{path}: not readable JSON ({e}); the manifest is damaged, "
                               f"convert again (`fastdata convert --resume` reuses sound "
                               f"shards)") from e
    if not isinstance(m, dict) or m.get("format") != FORMAT_NAME:
        found = m.get("format") if isinstance(m, dict) else type(m).__name__
        raise ShardFormatError(f"{path}: not a fastdata manifest (format={found!r})")
    if m.get("version") not in READ_VERSIONS:
        raise ShardFormatError(f"{path}: format version {m.get('version')!r} is not supported "
                               f"by this fastdata (reads versions "
                               f"{', '.join(map(str, READ_VERSIONS))})")
    check_manifest(m, path)
    return m


#: a manifest lists shards, skipped files and classes: far below this even for 14 M images.
#: Parsed, JSON takes a few times its size in memory: the cap bounds what reading one costs
MAX_MANIFEST_BYTES = 256 << 20
_SHARD_NAME = re.compile(r"shard-\d{5,}\.(h5|lmdb)")


def _field(path: str, name: str, value, ok: bool, want: str) -> None:
    if not ok:
        raise ShardFormatError(f"{path}: field {name} is {_short(value)}, expected {want}; the "
                               f"manifest is damaged or was not written by fastdata")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_manifest(m: dict, path: str) -> None:
    """Check every field a reader uses, and their consistency with each other: the shards'
    ranges follow one another from 0 and add up to ``num_samples``; each shard file is a
    plain name in the set's folder. Raises ShardFormatError naming the field."""
    f = functools.partial(_field, path)
    f("container", m.get("container"), m.get("container") in CONTAINERS,
      f"one of {', '.join(CONTAINERS)}")
    f("encoding", m.get("encoding"), m.get("encoding") in ENCODINGS,
      f"one of {', '.join(ENCODINGS)}")
    f("fit", m.get("fit"), m.get("fit") in FITS, f"one of {', '.join(FITS)}")
    sizes = m.get("sizes")
    f("sizes", sizes, isinstance(sizes, list) and sizes and all(  # type: ignore[arg-type]
        _is_int(s) and s >= MIN_SIZE and not s & (s - 1) for s in sizes)
      and sizes == sorted(set(sizes)), "ascending powers of two >= 8")
    classes = m.get("classes")
    f("classes", classes, isinstance(classes, list) and (classes or label_kind(m) == "none")
      and all(isinstance(c, str) for c in classes)
      and len(set(classes)) == len(classes),
      "a list of distinct names (empty only for a set without labels)")
    n = m.get("num_samples")
    f("num_samples", n, _is_int(n) and n >= 0, "an integer >= 0")  # type: ignore[operator]
    end = _check_shards(m, f)
    f("num_samples", n, n == end, f"{end}, the sum of the shards' counts")
    _check_records(m, f)
    _check_targets(m, f)
    _check_fields(m, f)


def _check_fields(m: dict, f) -> None:
    """``check_manifest`` of ``fields``: their names and kinds' shape (the kinds' parameters
    are checked by ``fastdata.fields.schema``, which knows the kinds)."""
    fields = m.get("fields")
    f("fields", fields, fields is None or (isinstance(fields, list) and fields),
      "absent, or a non-empty list")
    f("version", m.get("version"), (fields is not None) == (m.get("version") == FIELDS_VERSION),
      f"{FIELDS_VERSION} exactly for a set with fields")
    names: set = set()
    for k, e in enumerate(fields or ()):
        name = e.get("name") if isinstance(e, dict) else None
        f(f"fields[{k}]", e, isinstance(e, dict) and isinstance(name, str)
          and FIELD_NAME.fullmatch(name) is not None
          and (name not in RESERVED_FIELDS or _is_label_field(m, e))
          and name not in names and isinstance(e.get("kind"), str)
          and isinstance(e.get("params", {}), dict),
          "{name, kind, params}, each name a distinct identifier (not image; label only as "
          "the field of the set's labels: LABEL_FIELDS)")
        names.add(name)


def _is_label_field(m: dict, e: dict) -> bool:
    """Whether the fields' entry ``e``, named ``label``, is the field of the set's labels."""
    kind = label_kind(m)
    params = e.get("params")
    if kind == "detection" and isinstance(params, dict):    # masks and keypoints: the file's
        params = {k: v for k, v in params.items() if k not in ("masks", "keypoints")}
    return e.get("name") == "label" and kind in LABEL_FIELDS and e.get("kind") == LABEL_FIELDS[
        kind] and isinstance(m.get("classes"), list) and params == label_params(
        kind, m["classes"])


def label_params(kind: str, classes: list[str]) -> dict:
    """The parameters of the field that holds a set's labels of ``kind``: its ``classes`` (the
    targets' names, for regression their number); a detection set's boxes have crowd flags
    (and may have masks and keypoints)."""
    if kind == "regression":
        return {"length": len(classes)}
    return {"classes": list(classes), **({"crowd": True} if kind == "detection" else {})}


def label_kind(m: dict) -> str:
    """A checked manifest's label kind (a version 1 set's: ``"class"``)."""
    return m.get("label_kind", "class")


def _check_annotations(m: dict, f, kind: str, in_field: bool) -> None:
    """``check_manifest`` of ``annotations`` (``in_field``: the labels are a field instead)."""
    a = m.get("annotations")
    if kind in SPATIAL_KINDS and not in_field:
        f("annotations", a, isinstance(a, dict) and a.get("file") == ANNOTATIONS
          and _is_int(a.get("bytes")) and a["bytes"] > 0 and isinstance(a.get("sha256"), str)
          and re.fullmatch(r"[0-9a-f]{64}", a["sha256"]) is not None
          and isinstance(a.get("masks"), bool)
          and (a.get("keypoints") is None or (isinstance(a["keypoints"], dict)
                                              and kind == "detection")),
          f"{{file: {ANNOTATIONS}, bytes, sha256, masks, and a detection set's keypoints}}")
    else:
        f("annotations", a, a is None, "absent but for a detection or segmentation set "
          "whose labels are not a field")


def _check_targets(m: dict, f) -> None:
    """``check_manifest`` of ``label_kind`` and ``targets``."""
    kind = label_kind(m)
    f("label_kind", kind, kind in LABEL_KINDS, f"one of {', '.join(LABEL_KINDS)}")
    spatial = kind in SPATIAL_KINDS
    version = m.get("version")
    f("version", version, spatial == (version == SPATIAL_VERSION) or version == FIELDS_VERSION,
      f"{SPATIAL_VERSION} exactly for a detection or segmentation set (or {FIELDS_VERSION}, "
      f"with fields)")
    in_field = any(isinstance(e, dict) and e.get("name") == "label" for e in m.get("fields") or ())
    f("label_kind", kind, not in_field or kind in LABEL_FIELDS,
      f"{' or '.join(LABEL_FIELDS)} for a set whose labels are a field")
    _check_annotations(m, f, kind, in_field)
    f("label_kind", kind, kind != "none" or m.get("version") == FIELDS_VERSION,
      f"not none but in a set with fields (version {FIELDS_VERSION})")
    t = m.get("targets")
    if kind in ("class", "none", *SPATIAL_KINDS) or in_field:
        f("targets", t, t is None, f"absent for {kind} labels"
          f"{' held in the field label' if in_field else ''}")
        return
    shape = [m["num_samples"], len(m["classes"])]
    f("targets", t, isinstance(t, dict) and t.get("file") == TARGETS
      and t.get("shape") == shape and isinstance(t.get("sha256"), str)
      and re.fullmatch(r"[0-9a-f]{64}", t["sha256"]) is not None,
      f"{{file: {TARGETS}, shape: {shape}, sha256}}")


def _check_shards(m: dict, f) -> int:
    """``check_manifest`` of ``shards``: returns the samples they hold."""
    shards = m.get("shards")
    f("shards", shards, isinstance(shards, list), "a list")
    end, names, wholes = 0, set(), set()
    suffix = SHARD_SUFFIX[m["container"]]
    for k, s in enumerate(shards):  # type: ignore[arg-type]
        where = f"shards[{k}]"
        f(where, s, isinstance(s, dict), "an object")
        name = s.get("file")
        f(f"{where}.file", name, isinstance(name, str) and _SHARD_NAME.fullmatch(name) is not None
          and name.endswith(suffix) and name not in names,
          f"a file name of this set's own (shard-NNNNN{suffix}), once")
        names.add(name)
        f(f"{where}.start", s.get("start"), s.get("start") == end,
          f"{end}, where shards[{k - 1}] ends" if k else "0")
        count = s.get("count")
        f(f"{where}.count", count, _is_int(count) and count >= 0, "an integer >= 0")
        end += count
        f(f"{where}.bytes", s.get("bytes"), _is_int(s.get("bytes")) and s["bytes"] >= 0,
          "an integer >= 0")
        f(f"{where}.sha256", s.get("sha256"), isinstance(s.get("sha256"), str),
          "a hex digest")
        whole = s.get("file_sha256")            # optional: the whole file's, for a cache
        f(f"{where}.file_sha256", whole, whole is None or (
            isinstance(whole, str) and re.fullmatch(r"[0-9a-f]{64}", whole) is not None
            and whole not in wholes), "absent, or the file's SHA-256 in hex (each shard's own)")
        wholes.add(whole)
    return end


def _check_records(m: dict, f) -> None:
    """``check_manifest`` of what the converter recorded besides the shards."""
    skipped = m.get("skipped")
    f("skipped", skipped, isinstance(skipped, list) and all(
        isinstance(x, dict) and isinstance(x.get("path"), str) and isinstance(x.get("reason"), str)
        and x.get("kind", "unreadable") in SKIP_KINDS for x in skipped),
      f"a list of {{path, reason, kind}} (kind one of {', '.join(SKIP_KINDS)})")
    ignored = m.get("ignored")
    f("ignored", ignored, isinstance(ignored, dict) and all(
        _is_int(v) for v in ignored.values()), "an object of counts")
    empty = m.get("empty_classes")
    f("empty_classes", empty, isinstance(empty, list) and all(isinstance(c, str) for c in empty),
      "a list of names")
    f("source", m.get("source"), isinstance(m.get("source"), str), "a path")
    f("quality", m.get("quality"), m.get("quality") is None or _is_int(m.get("quality")),
      "an integer or null")
    counts = m.get("class_counts")         # optional: the samples of each class
    f("class_counts", counts, counts is None or (
        isinstance(counts, list) and len(counts) == len(m["classes"])
        and all(_is_int(c) and c >= 0 for c in counts) and sum(counts) == m["num_samples"]),
      "absent, or the samples of each class, adding up to num_samples")


def skip_summary(skipped: list[dict]) -> str:
    """``skipped`` counted by kind, e.g. "298 without labels, 1 unreadable" (an entry without
    a kind counts as unreadable)."""
    counts: dict[str, int] = {}
    for s in skipped:
        kind = s.get("kind", "unreadable")
        counts[kind] = counts.get(kind, 0) + 1
    return ", ".join(f"{counts[k]} {SKIP_KINDS[k]}" for k in SKIP_KINDS if k in counts)


def json_text(obj: Any, *, sort_keys: bool = False) -> str:
    """JSON that keeps non-ASCII names readable, and escapes (``\\udcfe``) the lone surrogates
    by which Python's ``os`` functions carry file names that are not UTF-8: UTF-8 cannot
    encode those, and the escape reads back as the same name."""
    text = json.dumps(obj, indent=1, sort_keys=sort_keys, ensure_ascii=False)
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def read_targets(root: str, entry: dict) -> np.ndarray:
    """The targets a checked manifest's ``entry`` describes, checked against it (a regular
    file of the set's own, its checksum, dtype, shape, finite values).

    Raises:
        ShardFormatError: the file is missing, damaged or not what the manifest says.
    """
    path = os.path.join(root, TARGETS)
    n, k = entry["shape"]
    limit = 4096 + 4 * n * k            # the .npy header, then the values
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        raise ShardFormatError(f"{path}: cannot open the set's targets ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ShardFormatError(f"{path}: not a regular file")
        data = f.read(limit + 1)
    ok = len(data) <= limit and hashlib.sha256(data).hexdigest() == entry["sha256"]
    try:
        values = np.load(io.BytesIO(data), allow_pickle=False) if ok else None
    except ValueError:
        values = None
    if values is None or values.dtype != np.float32 or values.shape != (n, k) \
            or not np.isfinite(values).all():
        raise ShardFormatError(f"{path}: damaged (not the {n}x{k} float32 targets whose "
                               f"checksum the manifest holds); convert again")
    return values


def write_json_atomic(path: str, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` (``write_atomic``).

    Raises:
        OSError: the write failed; the message names ``path``.
    """
    write_atomic(path, (json_text(obj, sort_keys=True) + "\n").encode("utf-8"))


def write_atomic(path: str, data: bytes) -> None:
    """Write a set's record ``data`` to ``path`` (``outdir.replace_atomically``, synced).

    Raises:
        OSError: the write failed; the message names ``path``.
    """
    from fastdata.outdir import replace_atomically

    try:
        replace_atomically(path, data)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise OSError(e.errno, f"no space left on the device to write {path}; make room, "
                                   f"then run the same command again (a conversion: with "
                                   f"--resume)") from e
        raise
