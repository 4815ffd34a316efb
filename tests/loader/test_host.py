"""The host stage both backends share: a reader of one's own runs inline, in threads or in
worker processes with the same results in order; a shard cut short is named by its reader."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fastdata
from fastdata.loader.host import HostReader, HostStage


class Sums(HostReader):
    """Each batch's labels and the sum of its stored pixels (picklable: a module's class)."""

    def read(self, indices, seed, hold, ring):
        out = np.empty((len(indices), self.size, self.size, 3), np.uint8)
        return self.labels(indices), int(self.pixels(indices, seed, out).sum()), seed


def _spec(path, **kw):
    loader = fastdata.Loader(path, batch_size=4, size=16, device="cpu", train=False,
                             num_workers=0, **kw)
    return loader, loader._spec()


@pytest.mark.parametrize("stage", [
    dict(num_workers=0), dict(num_workers=2), dict(workers="process", num_workers=2),
], ids=["inline", "threads", "processes"])
def test_a_reader_of_ones_own_gives_the_same_batches_however_it_runs(shards, stage):
    loader, spec = _spec(shards["lmdb"])
    batches = loader.order.batches()
    want = [(torch.from_numpy(loader.dataset.labels_of(b)),
             int(loader.dataset.read_batch(b, size=16).sum())) for b in batches]
    host = HostStage(**stage)
    try:
        got = list(host.run(spec, Sums(spec), batches, iter(range(100, 100 + len(batches)))))
    finally:
        host.close()
    assert [(torch.equal(y, wy), s) for (y, s, _), (wy, _) in zip(got, want)] == \
        [(True, s) for _, s in want]
    assert [seed for *_, seed in got] == list(range(100, 100 + len(batches)))
    assert host.processes == (2 if stage.get("workers") == "process" else 1)


def test_the_sample_hook_runs_in_the_readers_with_each_batch_seed(shards):
    def invert(image, rng):
        return 255 - image

    loader, spec = _spec(shards["hdf5"], sample_transform=invert)
    b = loader.order.batches()[0]
    (_, total, _), = HostStage(num_workers=1).run(spec, Sums(spec), [b], iter([7]))
    assert total == int((255 - loader.dataset.read_batch(b, size=16).astype(np.int64)).sum())
