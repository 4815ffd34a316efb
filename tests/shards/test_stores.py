"""The store interface: a set in fsspec's in-memory file system and in a store of one's own
(a registered scheme) read through the node cache as from disk, by the same rules."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import fastdata
from fastdata.shards.stores import STORES, Store, open_store, register_store
from fastdata.shards.stores.local import LocalStore
from tests.helpers import plain_loader, shard_files


def _batches(loader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x, y) for x, y in loader]


def _same(a, b) -> None:
    assert len(a) == len(b) > 0
    for (x, y), (u, v) in zip(a, b):
        assert torch.equal(x, u) and torch.equal(y, v)


def test_a_set_in_fsspecs_memory_file_system_loads_as_from_disk(local_set, tmp_path):
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    for name in os.listdir(local_set):
        with open(os.path.join(local_set, name), "rb") as f:
            fs.pipe_file(f"/sets/mem/{name}", f.read())
    try:
        kw = {"train": False, "num_workers": 2}
        _same(_batches(plain_loader("memory://sets/mem", cache_dir=tmp_path / "c", **kw)),
              _batches(plain_loader(local_set, **kw)))
        assert len(os.listdir(tmp_path / "c" / "objects")) == len(shard_files(local_set))
        first = shard_files(local_set)[0]
        data = bytearray(fs.cat_file(f"/sets/mem/{first}"))
        data[len(data) // 3::101] = bytes(b ^ 0xFF for b in data[len(data) // 3::101])
        fs.pipe_file(f"/sets/mem/{first}", bytes(data))    # damaged in the store: refused
        with pytest.raises(OSError, match=f"memory://sets/mem/{first}: .*twice: refused"):
            fastdata.open("memory://sets/mem", cache_dir=tmp_path / "d").read_batch([0])
    finally:
        fs.rm("/sets/mem", recursive=True)


class _DictStore(Store):
    """A store of one's own: objects in a dict, by folder."""

    held: dict[str, dict[str, bytes]] = {}

    def chunks(self, name):
        try:
            data = self.held[self.url][name]
        except KeyError:
            raise FileNotFoundError(f"{self.shown}/{name}: not found") from None
        yield data[:len(data) // 2]
        yield data[len(data) // 2:]

    def objects(self):
        return {k: len(v) for k, v in self.held.get(self.url, {}).items()}

    def put(self, name, data):
        self.held.setdefault(self.url, {})[name] = bytes(data)

    def create(self, name, data):
        if name in self.held.get(self.url, {}):
            raise FileExistsError(f"{self.shown}/{name} exists")
        self.put(name, data)

    def delete(self, names):
        for name in names:
            self.held.get(self.url, {}).pop(name, None)


def test_a_store_of_ones_own_by_its_scheme(local_set, tmp_path, monkeypatch):
    monkeypatch.setitem(STORES, "vault", _DictStore)
    register_store("vault")(_DictStore)
    store = open_store("vault://team/set")
    for name in os.listdir(local_set):
        store.put_file(name, os.path.join(local_set, name))
    kw = {"train": False, "num_workers": 2}
    _same(_batches(plain_loader("vault://team/set", cache_dir=tmp_path, **kw)),
          _batches(plain_loader(local_set, **kw)))
    with pytest.raises(FileNotFoundError, match="vault://team/none/manifest.json: not found"):
        fastdata.open("vault://team/none", cache_dir=tmp_path)
    with pytest.raises(ValueError, match=r"nope://x: no store reads nope:// URLs; give one of "
                                         r".*s3://.*vault://"):
        fastdata.open("nope://x", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="'a b' is not a URL scheme"):
        register_store("a b")


def test_a_file_url_refuses_names_outside_its_folder(local_set, tmp_path):
    store = LocalStore("file://" + local_set)
    assert sorted(store.objects()) == sorted(os.listdir(local_set))
    for bad in ("../x", "a/b", "..", ""):
        with pytest.raises(ValueError, match="is not an object's name"):
            store.read(bad, 10)
    store = LocalStore(f"file://{tmp_path}")
    store.create("lock", b"1")
    with pytest.raises(FileExistsError, match="lock exists"):
        store.create("lock", b"2")
    store.put("lock", b"3")
    assert store.read("lock", 10) == b"3" and np.array_equal(sorted(os.listdir(tmp_path)),
                                                             ["lock"])
    store.delete(["lock", "gone"])
    assert os.listdir(tmp_path) == []


def test_a_conversion_into_a_store_of_ones_own_and_a_mixture_of_urls(local_set, tmp_path,
                                                                     monkeypatch):
    """The bucket writer through the interface, staging in the ``cache_dir`` given; a
    mixture of URLs fetching into its ``cache_dir``."""
    from fastdata.converters.convert import convert
    from tests.helpers import plain_folder

    monkeypatch.setitem(STORES, "vault", _DictStore)
    monkeypatch.setenv("FASTDATA_CACHE", str(tmp_path / "default"))
    src = plain_folder(tmp_path / "src", per_class=8)
    convert(src, "vault://team/converted", sizes=[16], shard_size=5, num_workers=1,
            progress=False, cache_dir=tmp_path / "staging")
    assert (tmp_path / "staging" / "CACHEDIR.TAG").is_file()       # staged there, then gone
    assert os.listdir(tmp_path / "staging" / "uploads") == []
    assert not (tmp_path / "default").exists()
    held = _DictStore.held["vault://team/converted"]
    assert "manifest.json" in held and sum(n.startswith("shard-") for n in held) == 5
    m = fastdata.Mixture(["vault://team/converted", "file://" + local_set],
                         cache_dir=tmp_path / "mixed")
    assert len(m) == 48 and len(os.listdir(tmp_path / "mixed" / "objects")) == 0
    assert np.array_equal(m.read_batch(range(24), size=16), m.read_batch(range(24, 48), size=16))
    assert len(os.listdir(tmp_path / "mixed" / "objects")) == 10   # each set's 5 shards
