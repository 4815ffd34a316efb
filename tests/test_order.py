"""The order's batches per epoch."""
from __future__ import annotations

import numpy as np
import pytest

from fastdata.order import Order, ShardWindows


def test_order_lengths():
    assert len(Order(23, batch_size=4, train=True, world_size=2)) == 2
    assert [len(Order(23, batch_size=4, train=False, rank=r, world_size=2)) for r in (0, 1)] \
        == [3, 3]
    assert len(Order(23, batch_size=4, train=False, drop_last=True, world_size=1)) == 5


def _epoch(orders) -> list[list[int]]:
    """Each rank's samples of a pass, batch after batch, flattened per rank."""
    return [[int(i) for b in o.batches() for i in b] for o in orders]


def _layout(n, world, batch, **kw):
    return [Order(n, batch_size=batch, rank=r, world_size=world, seed=7, **kw)
            for r in range(world)]


def test_the_epoch_order_does_not_depend_on_the_layout():
    for world, batch in ((1, 6), (2, 3), (3, 2), (6, 1)):
        got = _epoch(_layout(36, world, batch))
        # rank r holds positions r, r + w, ... of one permutation
        merged = [got[k % world][k // world] for k in range(36)]
        assert merged == Order(36, batch_size=1, seed=7).permutation().tolist()


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("before, after", [((4, 2), (2, 2)), ((4, 2), (3, 2)),
                                            ((2, 3), (5, 1)), ((3, 2), (3, 2)),
                                            ((1, 4), (4, 3))])
def test_a_resumed_epoch_reads_the_rest_once_on_any_layout(train, before, after):
    n = 47
    (w0, b0), (w1, b1) = before, after
    old = _layout(n, w0, b0, train=train)
    for o in old:
        o.set_epoch(2)
    read = [i for o in old for b in o.batches()[:3] for i in b.tolist()]
    for o in old:
        o.position = 3
    state = old[0].state_dict()
    assert state["consumed"] == 3 * w0 * b0
    new = _layout(n, w1, b1, train=train)
    for o in new:
        o.load_state_dict(state)
    rest = [i for per_rank in _epoch(new) for i in per_rank]
    assert not set(read) & set(rest) and len(rest) == len(set(rest))
    perm = old[0].permutation().tolist()
    assert sorted(read) == sorted(perm[:3 * w0 * b0])         # a prefix of the epoch's order
    dropped = n - len(read) - len(rest)
    if train:       # the tail that does not fill a batch on every rank
        assert 0 <= dropped < w1 * b1 + w1 and len({len(r) for r in _epoch(new)}) == 1
    else:           # evaluation: every sample once
        assert dropped == 0
    for o in new:
        o.set_epoch(3)      # then whole epochs
    whole = [i for r in _epoch(new) for i in r]
    assert len(whole) == len(set(whole)) == (w1 * len(new[0]) * b1 if train else n)


@pytest.mark.parametrize("bad, match", [
    ({"n": 41}, "saved n=41 samples per epoch"),
    ({"consumed": 41}, "consumed=41 is not valid"),
    ({"consumed": -1}, "consumed=-1 is not valid"),
    ({"epoch": "2"}, "epoch='2' is not valid"),
    ({"n": "40"}, "n='40' is not valid"),
    ({"n": np.arange(3)}, r"n=array\(\[0, 1, 2\]\) is not valid"),
    ({"order": "windows of 2 shards"}, "order is drawn by 'windows of 2 shards'"),
])
def test_a_state_of_another_set_or_out_of_range_is_named(bad, match):
    o = Order(40, batch_size=4)
    with pytest.raises(ValueError, match=match):
        o.load_state_dict({**o.state_dict(), **bad})


def test_a_shuffle_over_windows_of_shards_reads_a_window_at_a_time():
    counts = [5, 5, 5, 5, 4, 3]
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    draw = ShardWindows(counts, 2)
    order = draw(3, 0, True)
    assert sorted(order.tolist()) == list(range(27))
    shard_of = np.searchsorted(starts, order, side="right") - 1
    seen, at = [], 0
    while at < len(order):                      # each window: 2 whole shards, then the next
        window = set(shard_of[at:at + 1].tolist())
        end = at
        while end < len(order) and (len(window) < 2 or shard_of[end] in window):
            window.add(int(shard_of[end]))
            end += 1
        assert sum(counts[s] for s in window) == end - at
        seen += sorted(window)
        at = end
    assert sorted(seen) == list(range(6))
    assert not np.array_equal(order, draw(3, 1, True)) and np.array_equal(order, draw(3, 0, True))
    assert draw(3, 0, False).tolist() == list(range(27))
    # the Order's partition and resume rules hold unchanged
    old = [Order(27, batch_size=2, rank=r, world_size=3, seed=3, draw=draw) for r in range(3)]
    for o in old:
        o.position = 2
    new = [Order(27, batch_size=3, rank=r, world_size=2, seed=3, draw=draw) for r in range(2)]
    for o in new:
        o.load_state_dict(old[0].state_dict())
    head = sorted(order[:12].tolist())
    rest = [i for o in new for b in o.batches() for i in b.tolist()]
    assert sorted(rest) == sorted(order[12:12 + len(rest)].tolist()) and not set(rest) & set(head)


def _shard_of(counts, indices) -> np.ndarray:
    """The shard of each sample of ``indices``."""
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return np.searchsorted(starts, np.asarray(indices), side="right") - 1


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_split_order_gives_each_rank_its_own_shards(shuffle):
    """``parts`` runs dealt out in turn: on a world of ``parts`` ranks each rank reads one run
    (whole shards but at the runs' two ends), windows of 2 shards within it; two nodes of two
    ranks share at most the one shard where their runs meet; every sample once per epoch."""
    counts = [6] * 11 + [4]
    n = sum(counts)
    draw = ShardWindows(counts, 2, parts=4)
    for epoch in range(3):
        order = draw(5, epoch, shuffle)
        assert sorted(order.tolist()) == list(range(n))
        ranks = [Order(n, batch_size=4, rank=r, world_size=4, seed=5, draw=draw, train=False,
                       shuffle=shuffle)
                 for r in range(4)]
        for o in ranks:
            o.set_epoch(epoch)
        read = [np.concatenate(o.batches()) for o in ranks]
        assert sorted(np.concatenate(read).tolist()) == list(range(n))
        shards = [set(_shard_of(counts, r).tolist()) for r in read]
        assert all(len(s) <= 18 // 6 + 2 for s in shards)      # 17 samples: 3 shards and ends
        nodes = [shards[0] | shards[1], shards[2] | shards[3]]
        assert len(nodes[0] & nodes[1]) <= 1 and nodes[0] | nodes[1] == set(range(12))
        for r in read:          # a rank reads its shards a window (2 shards) at a time
            of = _shard_of(counts, r)
            firsts = [int(s) for k, s in enumerate(of) if s not in of[:k]]
            for k, s in enumerate(firsts[2:], 2):       # a new shard only after the window's
                at = int(np.flatnonzero(of == s)[0])
                assert not set(of[at:].tolist()) & set(firsts[:k - k % 2])
    assert not np.array_equal(draw(5, 0, True), draw(5, 1, True))


def test_a_split_order_resumes_on_another_world_size_and_refuses_another_order():
    counts = [6] * 11 + [4]
    draw = ShardWindows(counts, 2, parts=4)
    old = [Order(70, batch_size=3, rank=r, world_size=4, seed=1, draw=draw) for r in range(4)]
    for o in old:
        o.position = 2                                  # 24 read
    head = {i for o in old for i in o.rank_indices()[:6].tolist()}
    new = [Order(70, batch_size=5, rank=r, world_size=2, seed=1, draw=draw) for r in range(2)]
    for o in new:
        o.load_state_dict(old[0].state_dict())
    rest = [i for o in new for b in o.batches() for i in b.tolist()]
    assert len(head) == 24 and not set(rest) & head and len(set(rest)) == len(rest) == 40
    for other in (ShardWindows(counts, 3, parts=4), ShardWindows(counts, 2), None):
        o = Order(70, batch_size=3, draw=other)
        with pytest.raises(ValueError, match="shuffle_window and"):
            o.load_state_dict(old[0].state_dict())
