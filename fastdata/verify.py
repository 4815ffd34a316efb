"""Integrity checks: recompute shard checksums and per-sample CRCs, decode every JPEG."""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from fastdata.format import crc32, shard_checksum
from fastdata.readers import ShardReader, ShardSet, decode_jpeg


@dataclass
class Problem:
    shard: str
    sample: int | None      # global index, None for shard-level damage
    message: str

    def __str__(self) -> str:
        where = self.shard if self.sample is None else f"{self.shard} sample {self.sample}"
        return f"{where}: {self.message}"


def verify_shard(reader: ShardReader, entry: dict) -> list[Problem]:
    """Check one shard against its manifest ``entry`` (count, start, sha256), reading it once
    in file order, with readahead (a raw LMDB set out of the page cache: ~10x as fast)."""
    name, start = os.path.basename(reader.path), entry["start"]
    reader.readahead = True
    try:
        labels = reader.labels()
        problems = []
        if len(labels) != entry["count"]:
            problems.append(Problem(name, None, f"holds {len(labels)} labels, "
                                                f"manifest says {entry['count']}"))
        actual = []
        for s in reader.sizes:
            crcs, pixels = reader.crcs(s), np.empty((s, s, 3), np.uint8)
            actual.append(np.zeros(entry["count"], np.uint32))
            for i in range(entry["count"]):
                p = reader.payload(s, i)
                actual[-1][i] = crc32(p)
                if i >= len(crcs) or actual[-1][i] != crcs[i]:
                    problems.append(Problem(name, start + i, f"size {s}: CRC mismatch "
                                                             f"(damaged image data)"))
                elif reader.encoding == "jpeg":
                    try:
                        decode_jpeg(p, pixels)
                    except Exception as e:  # noqa: BLE001
                        problems.append(Problem(name, start + i, f"size {s}: JPEG does not "
                                                                 f"decode: {e}"))
        if shard_checksum(labels, actual) != entry["sha256"]:
            problems.append(Problem(name, None, "shard checksum mismatch"))
        return problems
    except Exception as e:  # noqa: BLE001 - an unreadable container is a finding, not a crash
        return [Problem(name, None, f"unreadable: {type(e).__name__}: {e}")]
    finally:
        reader.close()


def verify(root: str, *, progress: bool = False) -> list[Problem]:
    from tqdm import tqdm

    ds = ShardSet(root)
    problems: list[Problem] = []
    for entry, reader in tqdm(list(ds.iter_shards()), desc="verify", unit="shard",
                              disable=not progress):
        if not os.path.isfile(reader.path):
            problems.append(Problem(entry["file"], None, "missing shard file"))
            continue
        problems += verify_shard(reader, entry)
    return problems
