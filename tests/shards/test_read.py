"""Reading shards: zero-copy views of both containers, and read-ahead as the order needs."""
from __future__ import annotations

import contextlib
import glob
import hashlib
import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import fastdata
import fastdata.shards.set
from fastdata.converters.convert import convert
from tests.helpers import cold_read_cost, plain_folder


@pytest.mark.parametrize("dtype", ["float32", "uint8"])
def test_views_of_both_containers_give_the_same_batches(shards, dtype, monkeypatch):
    """On the CPU, raw samples are cropped straight from views of the shards' maps (LMDB's
    while the batch's read transactions are held): the pixels of ``read_batch``'s copies, in
    the order asked for across shards, the same batches from both containers, and the shard
    files stay as they were."""
    def digests():
        files = sorted(glob.glob(os.path.join(shards["hdf5"], "*.h5")))
        files += sorted(glob.glob(os.path.join(shards["lmdb"], "*.lmdb")))
        return [hashlib.md5(Path(f).read_bytes()).hexdigest() for f in files]
    before = digests()
    for c in ("hdf5", "lmdb"):
        ds = fastdata.open(shards[c])
        with contextlib.ExitStack() as hold:
            mapped = ds.raw_views([22, 0, 7, 0], size=16, hold=hold)
            assert np.array_equal(np.stack(mapped), ds.read_batch([22, 0, 7, 0], size=16))
    assert fastdata.open(shards["lmdb"]).raw_views([0]) is None     # no transaction to hold

    def copied(*a, **k):
        raise AssertionError("a batch was copied")
    monkeypatch.setattr(fastdata.ShardSet, "read_batch", copied)
    kw = dict(batch_size=5, size=32, crop=24, seed=4, device="cpu", num_workers=2,
              dtype=dtype, channels_last=True)
    h5, lm = (fastdata.Loader(shards[c], **kw) for c in ("hdf5", "lmdb"))
    pairs = list(zip(h5, lm))
    assert len(pairs) == 4
    assert all(torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in pairs)
    assert digests() == before


def test_lmdb_views_become_tensors_without_a_warning(shards):
    """LMDB's map is read-only, and torch warns once per process on such arrays: the loader
    aliases them instead (checked in a fresh process, where the warning has not fired yet)."""
    code = (f"import warnings, torch, fastdata; warnings.simplefilter('error'); "
            f"x, _ = next(iter(fastdata.Loader({shards['lmdb']!r}, batch_size=5, size=32, "
            f"crop=24, device='cpu', num_workers=0))); assert x.shape == (5, 3, 24, 24)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]


def test_a_reader_collected_at_exit_closes_without_its_modules(shards, monkeypatch):
    """A script's module-level set can be collected at the interpreter's exit after the
    modules' globals are gone (``contextlib`` None): closing its readers then says nothing
    (no "Exception ignored in ShardReader.__del__")."""
    import fastdata.shards.reader

    sets = [fastdata.open(shards[c]) for c in ("hdf5", "lmdb")]
    for ds in sets:
        ds.read_batch([0, 9])       # its shards opened
    monkeypatch.setattr(fastdata.shards.reader, "contextlib", None)
    for ds in sets:
        for reader in ds.shards:
            reader.__del__()


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="drops pages with posix_fadvise")
def test_shards_are_read_ahead_unless_read_at_random_beyond_memory(tmp_path, monkeypatch):
    """Out of the page cache, the kernel reads ahead where that pays, in file order (eval) and
    at random over a set that fits in half the memory available; not at random over a larger
    one, where each window would read many times the bytes wanted, but there a batch asks for
    its samples' pages at once (raw LMDB: where the values it has read place them) instead of
    faulting them in one 4 KiB page at a time."""
    src = plain_folder(tmp_path / "src")
    sets = {c: str(tmp_path / c) for c in ("hdf5", "lmdb")}
    for c, out in sets.items():
        convert(src, out, container=c, sizes=[128], num_workers=1, progress=False)
    kw = dict(batch_size=4, device="cpu", num_workers=0, dtype=torch.uint8, augment=False)

    def cold(path, train, batches=None):
        """(major faults, bytes read, samples) of a pass (or its first ``batches``) over a set
        out of the page cache"""
        loader, n = fastdata.Loader(path, train=train, **kw), []
        shard = loader.dataset.shards[0]
        faults, nbytes = cold_read_cost(shard.path, lambda: n.extend(
            len(y) for _, y in itertools.islice(loader, batches)))
        if "env" in shard.h:
            assert shard.h["env"].flags()["readahead"] == shard.readahead
        loader.dataset.close()      # the process's env of that file closes with its last user
        return faults, nbytes, sum(n)

    pages = {c: os.path.getsize(fastdata.open(p).shards[0].path) // 4096 for c, p in sets.items()}
    for c, path in sets.items():
        for train in (False, True):         # in file order; at random over a set that fits
            faults, _, n = cold(path, train)
            assert n == (20 if train else 21) and faults <= pages[c] // 4, (c, train, faults)
    monkeypatch.setattr(fastdata.shards.set, "available_memory", lambda: 64 << 10)  # now they don't
    for c, path in sets.items():
        assert cold(path, False)[0] <= pages[c] // 4        # file order still reads ahead
        faults, nbytes, n = cold(path, True, batches=1)     # at random: the samples' pages
        if nbytes is not None:                              # and the shard's own records
            assert nbytes <= n * (128 * 128 * 3 + 8192) + (128 << 10), (c, nbytes)
        if c == "hdf5":                 # asked for at once (py-lmdb's get faults each page)
            assert faults < n, faults
    ds = fastdata.open(sets["lmdb"])    # LMDB: where an earlier read found them, and
    ds.read_batch([0, 6, 12])           # where the values read before say they lie
    want = fastdata.open(sets["lmdb"]).read_batch(batch := [0, 3, 9, 14, 20])
    faults, _ = cold_read_cost(ds.shards[0].path, lambda: np.testing.assert_array_equal(
        ds.read_batch(batch), want))
    assert faults < len(batch), faults
    shared = fastdata.open(sets["lmdb"])        # an eval loader's choice is not kept by
    fastdata.Loader(shared, train=False, **kw)  # a shuffled one built on the same set next
    assert not any(r.readahead for r in fastdata.Loader(shared, **kw).dataset.shards)
