"""One shard checked against its manifest entry: its records, every sample's CRC, its content
checksum, its JPEGs (``verify`` checks a whole set with it; a remote set's cache checks each
download)."""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from fastdata.fields import FieldError
from fastdata.format import crc32, shard_checksum
from fastdata.shards.jpeg import decode_jpeg
from fastdata.shards.reader import ShardReader


@dataclass
class Problem:
    shard: str
    sample: int | None      # global index, None for shard-level damage
    message: str

    def __str__(self) -> str:
        where = self.shard if self.sample is None else f"{self.shard} sample {self.sample}"
        return f"{where}: {self.message}"


def verify_shard(reader: ShardReader, entry: dict, classes: int | None = None, *,
                 decode: bool = True) -> list[Problem]:
    """Check one shard against its manifest ``entry`` (count, start, sha256, bytes) and, given
    ``classes``, its labels' range; read once in file order, with readahead (out of the page
    cache, a raw LMDB set reads an order of magnitude faster with it). ``decode``: also decode
    every JPEG (else the CRCs only). Problems are named by the manifest's file name (a
    remote shard's cached copy has another)."""
    name, start = entry["file"], entry["start"]
    reader.access = "sequential"
    try:
        problems = _entry_problems(reader, entry, classes)
        labels = reader.labels()
        actual = []
        for s in reader.sizes:
            reader.check_intact()
            crcs, pixels = reader.crcs(s), np.empty((s, s, 3), np.uint8)
            actual.append(np.zeros(entry["count"], np.uint32))
            for i in range(entry["count"]):
                p = reader.payload(s, i)
                actual[-1][i] = crc32(p)
                if actual[-1][i] != crcs[i]:
                    problems.append(Problem(name, start + i, f"size {s}: CRC mismatch "
                                                             f"(damaged image data)"))
                elif decode and reader.encoding == "jpeg":
                    try:
                        decode_jpeg(p, pixels)
                    except Exception as e:  # noqa: BLE001
                        problems.append(Problem(name, start + i, f"size {s}: JPEG does not "
                                                                 f"decode: {e}"))
        problems += _field_problems(reader, entry)
        columns = [reader.column(name) for name in reader.fields]
        if shard_checksum(labels, actual, columns) != entry["sha256"]:
            problems.append(Problem(name, None, "shard checksum mismatch"))
        return problems
    except Exception as e:  # noqa: BLE001 - an unreadable container is a finding, not a crash
        return [Problem(name, None, f"unreadable: {type(e).__name__}: {e}")]
    finally:
        reader.close()


def _field_problems(reader: ShardReader, entry: dict) -> list[Problem]:
    """Each field's values checked as its kind's (opening the shard checked their layout)."""
    problems = []
    for name, kind in reader.fields.items():
        try:
            kind.check(reader.column(name), entry["count"], f"field {name}")
        except FieldError as e:
            problems.append(Problem(entry["file"], None, str(e)))
    return problems


def _entry_problems(reader: ShardReader, entry: dict, classes: int | None) -> list[Problem]:
    """What the shard's own records say against the manifest: size on disk, place in the
    set, label range (opening the shard checks the counts)."""
    name, problems = entry["file"], []
    size = os.path.getsize(reader.path)
    if "bytes" in entry and size != entry["bytes"]:
        problems.append(Problem(name, None, f"{size} bytes, the manifest says {entry['bytes']}"))
    meta = reader.meta()
    if meta.start != entry["start"]:
        problems.append(Problem(name, None, f"starts at sample {meta.start}, the manifest says "
                                            f"{entry['start']}"))
    labels = reader.labels()
    if classes is not None and labels.size and not (0 <= labels.min()
                                                    and labels.max() < classes):
        bad = labels[(labels < 0) | (labels >= classes)][0]
        problems.append(Problem(name, None, f"label {int(bad)} is outside the manifest's "
                                            f"{classes} classes"))
    return problems
