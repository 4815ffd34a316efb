"""``fastdata cache``: what the node cache holds, and emptying it of all a running reader does
not hold (a real set read through the cache from a ``file://`` URL)."""
from __future__ import annotations

import os

import pytest

import fastdata
from fastdata.cli import main
from fastdata.converters.convert import convert
from tests.helpers import plain_folder

pytest.importorskip("obstore", reason="obstore not installed (pip install "
                                      "'fastdata-shards[remote]')")


def test_the_cache_is_shown_and_cleared_of_what_no_reader_holds(tmp_path, capsys,
                                                                  monkeypatch):
    out = str(tmp_path / "set")
    convert(plain_folder(tmp_path / "src", per_class=8), out, sizes=[16], shard_size=5,
            num_workers=1, progress=False)       # 24 samples, 5 shards
    cache = tmp_path / "cache"
    assert main(["cache", str(cache)]) == 0
    assert capsys.readouterr().out == f"{cache}: no cache here\n"

    ds = fastdata.open("file://" + out, cache_dir=cache)
    ds.read_batch(range(24), size=16)           # every shard fetched, and open in ``ds``
    (cache / "objects" / "notes.txt").write_text("not the cache's")
    assert main(["cache", str(cache)]) == 0
    assert capsys.readouterr().out.startswith(f"{cache}: 5 shards, ")

    for reader in ds.shards[1:]:                # the first stays open: its shard is held
        reader.close()
    assert main(["cache", str(cache), "--clear"]) == 0
    assert capsys.readouterr().out.startswith(
        f"{cache}: 4 shards deleted, 1 kept (open in a running reader)\n{cache}: 1 shard, ")
    ds.read_batch(range(5), size=16)            # the held shard still reads
    ds.shards[0].close()
    monkeypatch.setenv("FASTDATA_CACHE", str(cache))     # the default folder
    assert main(["cache", "--clear"]) == 0
    assert capsys.readouterr().out == f"{cache}: 1 shard deleted\n{cache}: 0 shards, 0 B\n"
    assert sorted(os.listdir(cache / "objects")) == ["notes.txt"]   # only its own files go
