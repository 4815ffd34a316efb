"""The order's batches per epoch."""
from __future__ import annotations

import pytest

from fastdata.order import Order


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


def test_a_state_saved_before_it_held_the_count_still_resumes():
    old = _layout(40, 2, 4)
    state = {**old[1].state_dict(), "position": 2}
    del state["consumed"]
    new = Order(40, batch_size=4, seed=7, rank=1, world_size=2)
    new.load_state_dict(state)
    assert new.offset == 16 and [b.tolist() for b in new.batches()] == \
        [b.tolist() for b in old[1].batches()[2:]]


@pytest.mark.parametrize("bad, match", [
    ({"n": 41}, "saved n=41 samples per epoch"),
    ({"consumed": 41}, "consumed=41 is not valid"),
    ({"consumed": -1}, "consumed=-1 is not valid"),
    ({"epoch": "2"}, "epoch='2' is not valid"),
])
def test_a_state_of_another_set_or_out_of_range_is_named(bad, match):
    o = Order(40, batch_size=4)
    with pytest.raises(ValueError, match=match):
        o.load_state_dict({**o.state_dict(), **bad})
