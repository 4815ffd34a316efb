"""Mixtures of shard sets: each set's share of an epoch, without replacement across epochs,
the class space, exact resume on any layout, both backends, and the errors."""
from __future__ import annotations

import hashlib
import json
import math
import shutil

import numpy as np
import pytest
import torch

import fastdata
from fastdata.converters.convert import convert
from tests.helpers import plain_folder, plain_loader


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> list[str]:
    """24 samples of classes a, b, c (HDF5) and 10 others of classes c, d (LMDB)."""
    tmp = tmp_path_factory.mktemp("mixture")
    out = [str(tmp / "a"), str(tmp / "b")]
    convert(plain_folder(tmp / "src-a", per_class=8), out[0], sizes=[16, 32], shard_size=7,
            num_workers=1, progress=False)
    convert(plain_folder(tmp / "src-b", classes=("c", "d"), per_class=5, seed=9), out[1],
            container="lmdb", sizes=[16], shard_size=4, num_workers=1, progress=False)
    return out


def ids_of(m) -> dict:
    raw = m.read_batch(range(len(m)), size=16)
    ids = {hashlib.md5(raw[i].tobytes()).hexdigest(): i for i in range(len(m))}
    assert len(ids) == len(m)
    return ids


def read(loader, ids) -> list[list[int]]:
    out = []
    for images, labels, sources in loader:
        nhwc = images.permute(0, 2, 3, 1).contiguous().numpy()
        batch = [ids[hashlib.md5(x.tobytes()).hexdigest()] for x in nhwc]
        assert labels.tolist() == loader.dataset.labels[batch].tolist()
        assert sources.tolist() == loader.dataset.source_of(batch).tolist()
        out.append(batch)
    return out


def test_an_epoch_holds_each_sets_share_within_a_binomial_bound_over_the_ranks(two):
    m = fastdata.Mixture(two, weights=[0.3, 0.7], epoch_size=200)
    ids = ids_of(m)
    got = []
    for rank in range(2):
        loader = plain_loader(m, batch_size=8, rank=rank, world_size=2, with_source=True)
        got += [i for b in read(loader, ids) for i in b]
    assert len(got) == 2 * (100 // 8) * 8 == len(np.unique(np.arange(len(got))))
    share = float(np.mean(m.source_of(got) == 1))
    assert abs(share - 0.7) <= 3 * math.sqrt(0.7 * 0.3 / len(got))
    assert m.counts.tolist() == [60, 140]


def test_without_replacement_a_set_shows_every_sample_before_any_repeats(two):
    m = fastdata.Mixture(two, weights=[1, 1], epoch_size=20)      # 10 of each an epoch
    series = {0: [], 1: []}
    for epoch in range(12):
        order = m.draw(7, epoch, True)
        for k in (0, 1):
            series[k] += (order[m.source_of(order) == k] - m.starts[k]).tolist()
    # set a (24): no repeat in the first 2 epochs' 20 draws; over 12 epochs each sample 5 times
    assert len(set(series[0][:20])) == 20
    assert np.bincount(series[0]).tolist() == [5] * 24
    # set b (10) each epoch: all of it, once
    assert all(sorted(series[1][10 * e:10 * (e + 1)]) == list(range(10)) for e in range(12))
    r = fastdata.Mixture(two, weights=[1, 1], epoch_size=20, replacement=True)
    drawn = (r.draw(7, 0, True) - 24)[r.source_of(r.draw(7, 0, True)) == 1]
    assert len(drawn) == 10 and len(set(drawn.tolist())) < 10     # with: repeats (seeded)


def test_the_draw_depends_on_seed_and_epoch_only(two):
    m = fastdata.Mixture(two, weights=[2, 1])
    assert np.array_equal(m.draw(3, 1, True), fastdata.Mixture(two, weights=[2, 1])
                          .draw(3, 1, True))
    assert not np.array_equal(m.draw(3, 1, True), m.draw(3, 2, True))
    assert not np.array_equal(m.draw(3, 1, True), m.draw(4, 1, True))
    assert m.counts.tolist() == [23, 11]
    evaluation = m.draw(3, 1, False)        # set after set, each from its start, cycled
    assert evaluation.tolist() == list(range(23)) + [24 + i % 10 for i in range(11)]


def test_classes_offset_or_joined_by_name(two):
    a, b = (fastdata.open(p) for p in two)
    off = fastdata.Mixture(two)
    assert off.classes == ["a", "b", "c", "c", "d"]
    assert np.array_equal(off.labels, np.concatenate([a.labels, b.labels + 3]))
    union = fastdata.Mixture(two, classes="union")
    assert union.classes == ["a", "b", "c", "d"]
    assert np.array_equal(union.labels, np.concatenate([a.labels, b.labels + 2]))
    loader = fastdata.Loader(union, batch_size=4, device="cpu", crop=16)
    x, y = next(iter(loader))
    assert x.shape == (4, 3, 16, 16) and int(y.max()) < 4


@pytest.mark.parametrize("layout", [(1, 4), (3, 2)])
def test_a_mixture_resumes_exactly_on_the_same_or_another_layout(two, layout):
    m = fastdata.Mixture(two, weights=[1, 2], epoch_size=48)
    ids = ids_of(m)

    def ranks(world, batch):
        return [plain_loader(m, batch_size=batch, rank=r, world_size=world, seed=2,
                             with_source=True) for r in range(world)]
    whole = [i for loader in ranks(2, 3) for b in read(loader, ids) for i in b]
    old = ranks(2, 3)
    head = []
    for loader in old:
        loader.set_epoch(0)
        it = iter(loader)
        for _ in range(3):
            head += [ids[hashlib.md5(x.tobytes()).hexdigest()]
                     for x in next(it)[0].permute(0, 2, 3, 1).contiguous().numpy()]
    new = ranks(*layout)
    for loader in new:
        loader.load_state_dict(old[0].state_dict())
    rest = [i for loader in new for b in read(loader, ids) for i in b]
    order = m.draw(2, 0, True).tolist()
    # by position in the epoch's order (a sample drawn twice counts twice); on 1 rank of 4
    # the last 2 of the 30 left do not fill a batch
    assert sorted(whole) == sorted(order) and sorted(head) == sorted(order[:18])
    assert sorted(rest) == sorted(order[18:18 + len(rest)]) and len(rest) == {1: 28, 3: 30}[
        layout[0]]


def test_both_backends_read_the_same_mixture_in_the_same_order(two):
    pytest.importorskip("nvidia.dali", reason="DALI not installed")
    m = fastdata.Mixture(two, weights=[1, 3], epoch_size=40)
    ids = ids_of(m)
    torch_, dali = (read(plain_loader(m, backend=b, num_workers=2, with_source=True,
                                      seed=1), ids) for b in ("torch", "dali"))
    assert torch_ == dali and len(torch_) == 10


def test_a_single_set_says_its_source_is_0(two):
    loader = fastdata.Loader(two[1], batch_size=4, device="cpu", with_source=True, crop=16)
    _, _, sources = next(iter(loader))
    assert sources.dtype == torch.int64 and sources.tolist() == [0] * 4


@pytest.mark.parametrize("make, match", [
    (lambda two: fastdata.Mixture([]), "a list of one or more shard sets"),
    (lambda two: fastdata.Mixture(two[0]), "a list of one or more shard sets"),
    (lambda two: fastdata.Mixture(two, weights=[1]), r"gives 1 weight\(s\) for 2 sets"),
    (lambda two: fastdata.Mixture(two, weights=[1, -1]), "finite weights >= 0"),
    (lambda two: fastdata.Mixture(two, weights=[0, float("nan")]), "finite weights >= 0"),
    (lambda two: fastdata.Mixture(two, classes="names"), "classes='names' is not valid"),
    (lambda two: fastdata.Mixture(two, epoch_size=0), "epoch_size=0 is not valid"),
    (lambda two: fastdata.Mixture(two, epoch_size=10**12),
     r"epoch_size=1000000000000 needs .* GiB of memory, more than"),
    (lambda two: fastdata.Mixture([two[0], two[1], two[0] + "/"]),
     r"sets\[2\] is sets\[0\] again"),
    (lambda two: fastdata.Loader(two[0], weights=[1], batch_size=2), "weights= mixes a list"),
    (lambda two: fastdata.Loader(two, batch_size=2, size=32, device="cpu"),
     "size 32 is not stored in every set of the mixture; sizes they all store: 16"),
])
def test_bad_mixtures_are_named(two, make, match):
    with pytest.raises(ValueError, match=match):
        make(two)


def test_extreme_weights_and_an_empty_set_of_weight_0(two, tmp_path):
    """Weights near the largest float split the epoch as their ratio does; a set of no sample
    given weight 0 is no part of it."""
    m = fastdata.Mixture(two, weights=[1e308, 1e308])
    assert m.counts.tolist() == [17, 17] and m.epoch_size == 34
    assert sum(len(y) for _, y in plain_loader(m, train=False, batch_size=5)) == 34
    empty = tmp_path / "empty"
    shutil.copytree(two[1], empty)
    manifest = json.loads((empty / "manifest.json").read_text())
    manifest.update(shards=[], num_samples=0, class_counts=[0] * len(manifest["classes"]))
    (empty / "manifest.json").write_text(json.dumps(manifest))
    m = fastdata.Mixture([two[0], str(empty)], weights=[1, 0], epoch_size=30)
    assert m.counts.tolist() == [30, 0]
    assert sorted(set(plain_loader(m, batch_size=5).order.rank_indices().tolist())) == \
        list(range(24))
    with pytest.raises(ValueError, match="holds no sample but is given a weight"):
        fastdata.Mixture([two[0], str(empty)], weights=[1, 1])


def test_a_mixtures_state_does_not_resume_a_plain_set_nor_the_reverse(two):
    m = fastdata.Mixture([two[0], two[1]], weights=[24, 10])
    assert m.epoch_size == 34
    plain = plain_loader(fastdata.Mixture([two[0]]), batch_size=4)
    mixed = plain_loader(m, batch_size=4)
    single = plain_loader(two[0], batch_size=4)
    with pytest.raises(ValueError, match=r"order is drawn by 'a mixture \(24 of 24"):
        single.load_state_dict(plain.state_dict())
    with pytest.raises(ValueError, match="order is drawn by 'permutation'"):
        plain.load_state_dict(single.state_dict())
    with pytest.raises(ValueError, match="the same set or mixture"):
        plain_loader(fastdata.Mixture(two, weights=[1, 1], epoch_size=34),
                     batch_size=4).load_state_dict(mixed.state_dict())
    plain_loader(m, batch_size=4).load_state_dict(mixed.state_dict())    # the same: resumes


def test_sets_of_another_encoding_do_not_mix(two, tmp_path):
    jpeg = str(tmp_path / "jpeg")
    convert(plain_folder(tmp_path / "src"), jpeg, encoding="jpeg", sizes=[16], num_workers=1,
            progress=False)
    with pytest.raises(ValueError, match="cannot mix .* \\(encoding raw\\) with .*jpeg"):
        fastdata.Mixture([two[0], jpeg])


def test_worker_processes_read_a_mixture_as_threads_do(two):
    m = fastdata.Mixture(two, weights=[1, 1], epoch_size=32)
    ids = ids_of(m)
    threads, procs = (read(plain_loader(m, backend=fastdata.TorchBackend(num_workers=2, workers=w),
                                        with_source=True), ids)
                      for w in ("thread", "process"))
    assert threads == procs and len(threads) == 8


def test_a_mixture_takes_indices_as_a_set_does(two):
    """One index rule: negative indices from the end, one sequence, integers."""
    m, first = fastdata.Mixture(two), fastdata.open(two[0])
    assert np.array_equal(m.read_batch([-1, 0], size=16),
                          m.read_batch([len(m) - 1, 0], size=16))
    assert np.array_equal(m[-1][0], m[len(m) - 1][0]) and np.array_equal(
        first.read_batch([-1]), first.read_batch([len(first) - 1]))
    for target in (m, first):
        with pytest.raises(IndexError, match="sample index -1000 out of range"):
            target.read_batch([-1000], size=16)
        with pytest.raises(ValueError, match="one sequence"):
            target.read_batch([[0, 1]], size=16)
        with pytest.raises(TypeError, match="must be integers"):
            target.read_batch([0.5], size=16)
