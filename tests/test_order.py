"""The order's batches per epoch."""
from __future__ import annotations

from fastdata.order import Order


def test_order_lengths():
    assert len(Order(23, batch_size=4, train=True, world_size=2)) == 2
    assert [len(Order(23, batch_size=4, train=False, rank=r, world_size=2)) for r in (0, 1)] \
        == [3, 3]
    assert len(Order(23, batch_size=4, train=False, drop_last=True, world_size=1)) == 5
