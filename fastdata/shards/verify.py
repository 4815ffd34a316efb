"""Integrity checks: recompute shard checksums and per-sample CRCs, decode every JPEG."""
from __future__ import annotations

import os

from fastdata.format import ANNOTATIONS, SPATIAL_KINDS, TARGETS, ShardFormatError
from fastdata.shards.integrity import Problem, verify_shard
from fastdata.shards.set import ShardSet

__all__ = ["Problem", "verify", "verify_shard"]


def verify(root: str, *, progress: bool = False) -> list[Problem]:
    """Check a whole set: the manifest's own consistency (at open), then every shard.

    Returns:
        The problems found, one per damaged shard or sample; empty when the set is sound.

    Raises:
        ShardFormatError: the manifest is missing or damaged (names the file and field).
    """
    from tqdm import tqdm

    ds = ShardSet(root)
    problems: list[Problem] = []
    bar = tqdm(total=len(ds), desc="verify", unit="img", disable=not progress,
               dynamic_ncols=True)
    for entry, reader in ds.iter_shards():
        if reader.fetch is not None:        # a remote set's shard: fetched (and checked) first
            try:
                reader.path = reader.fetch()
            except OSError as e:
                problems.append(Problem(entry["file"], None, str(e)))
                continue
        if not os.path.isfile(reader.path):
            problems.append(Problem(entry["file"], None, "missing shard file"))
        else:
            # a set without labels stores 0 for each sample
            problems += verify_shard(reader, entry,
                                     1 if ds.label_kind == "none" else len(ds.classes))
        bar.update(entry["count"])
    bar.close()
    counts = ds.manifest.get("class_counts")
    if counts is not None and not problems:
        import numpy as np

        found = np.bincount(ds.labels, minlength=len(counts)).tolist()
        if found != counts:
            problems.append(Problem("manifest.json", None, f"class_counts says {counts[:8]}"
                                    f"{'...' if len(counts) > 8 else ''} samples a class, "
                                    f"the shards' labels {found[:8]}"))
    if ds.label_kind not in ("class", *SPATIAL_KINDS) and ds.label_field is None:
        try:
            _ = ds.labels   # the targets file, checked against the manifest as it is read
        except ShardFormatError as e:
            problems.append(Problem(TARGETS, None, str(e).split(": ", 1)[-1]))
    if ds.label_kind in SPATIAL_KINDS and ds.label_field is None:   # else checked with the shards
        try:
            _ = ds.annotations      # checked whole as it is opened
        except ShardFormatError as e:
            problems.append(Problem(ANNOTATIONS, None, str(e).split(": ", 1)[-1]))
    return problems
