"""The torch backend's worker processes: lent buffers, kept workers, errors and stops."""
from __future__ import annotations

import contextlib
import gc
import glob
import logging
import os
import signal
import time
from pathlib import Path

import pytest
import torch

import fastdata
from fastdata.converters.convert import convert
from tests.helpers import (
    N,
    garbage_left_for_forks,
    ids_of,
    plain_folder,
    plain_loader,
    seen,
)

#: the loaders' backends (each loader works on its own copy)
FORKED = fastdata.TorchBackend(num_workers=2, workers="process", mp_context="fork")
PROCESSES = fastdata.TorchBackend(num_workers=2, workers="process")


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_process_workers_fork_and_spawn(shards, method):
    ds = fastdata.open(shards["lmdb"])
    ds.read_batch([0])                                  # handles open in the parent first
    ids = ids_of(ds)
    ref = seen(plain_loader(ds, seed=5, num_workers=0), ids)
    got = seen(plain_loader(ds, seed=5, backend=fastdata.TorchBackend(num_workers=2,
                                                                      workers="process",
                                                                      mp_context=method)), ids)
    assert got == ref


def children() -> set[int]:
    """This process's child processes."""
    pids = set()
    for path in glob.glob("/proc/self/task/*/children"):
        with contextlib.suppress(FileNotFoundError):    # a thread that has ended since
            pids |= set(map(int, Path(path).read_text().split()))
    return pids


@pytest.mark.parametrize("opts", [dict(), dict(dtype=torch.float32, crop=12),
                                  dict(channels_last=True)])
def test_process_workers_make_batches_in_lent_buffers_and_held_ones_stay_intact(shards, opts,
                                                                               caplog):
    """Worker processes, kept from pass to pass, make each batch in a shared buffer the parent
    lent: a batch still held is never written again (past the buffers there are, batches come
    in fresh memory, said once), one let go of is, one stale batch held costs nothing; a pass
    left unfinished gives its buffers back."""
    ds = fastdata.open(shards["hdf5"])
    kw = dict(batch_size=2, train=False, **opts)
    ref = [x.clone() for x, _ in plain_loader(ds, **kw)]
    before = children()
    loader = plain_loader(ds, backend=FORKED, **kw)
    lent = 2 * loader.backend.host.prefetch + 3
    with caplog.at_level(logging.WARNING, logger="fastdata"):
        held = list(loader)
    assert caplog.text.count("fresh shared memory") == 1
    workers = children() - before
    assert len(workers) == 2
    assert len(held) == len(ref) > lent
    assert all(torch.equal(x, r) for (x, _), r in zip(held, ref))
    assert len({x.untyped_storage().data_ptr() for x, _ in held}) == len(held)
    del held
    ring = {s.data_ptr() for s in loader.backend.host._workers.ring.storages}
    assert len(ring) == lent

    def one_pass():
        same, ptrs = [], set()
        for (x, _), r in zip(loader, ref):  # noqa: F821 - bound above, deleted below
            same.append(torch.equal(x, r))
            ptrs.add(x.untyped_storage().data_ptr())
        assert same == [True] * len(ref)
        return ptrs

    assert one_pass() | one_pass() <= ring
    stale = next(iter(loader))      # kept, as a loop's variable outlives its loop
    assert one_pass() <= ring
    del stale
    left = iter(loader)
    first = next(left)[0]
    assert one_pass() - ring        # meanwhile a pass of its own, in fresh memory
    assert torch.equal(first, ref[0])
    del left, first
    assert one_pass() <= ring       # the unfinished pass's buffers are back
    assert children() - before == workers
    del loader                      # not closed: its workers go with it all the same
    assert not children() - before


def test_worker_processes_that_raised_are_gone_at_once(tmp_path):
    """A pass whose worker raised (a damaged sample) stops its workers as the error comes out:
    they were left waiting for the DataLoader's shutdown, 5 s each, whenever the collector
    reached the pool."""
    src = plain_folder(tmp_path / "src", per_class=4)
    out = tmp_path / "jpeg"
    convert(src, str(out), encoding="jpeg", sizes=[16], shard_size=4, num_workers=1,
            progress=False)
    ds = fastdata.open(out)
    payload = bytes(ds.read_encoded([5])[0])
    shard = out / ds.manifest["shards"][1]["file"]
    shard.write_bytes(shard.read_bytes().replace(payload, bytes(len(payload))))
    before = children()
    loader = plain_loader(str(out), train=False, backend=PROCESSES)
    for _ in range(2):
        with pytest.raises(OSError, match="not a readable JPEG"):
            list(loader)
        assert not children() - before      # no worker left waiting
    loader.close()


def test_process_workers_kept_from_a_pass_follow_a_state_loaded_after_it(shards):
    """Workers started under one seed make the batches of another loaded afterwards."""
    kw = dict(dtype=torch.float32, augment=True, crop=12, train=True)
    other = plain_loader(shards["hdf5"], seed=7, **kw)
    other.set_epoch(2)
    rest = iter(other)
    next(rest)
    state = other.state_dict()
    want = [x for x, _ in rest]
    loader = plain_loader(shards["hdf5"], seed=1, backend=FORKED, **kw)
    assert len(list(loader)) == len(loader)
    loader.load_state_dict(state)
    got = [x for x, _ in loader]
    assert len(got) == len(want) > 0 and all(torch.equal(a, b) for a, b in zip(got, want))


def test_a_worker_process_killed_mid_pass_is_an_error_and_the_next_pass_has_new_ones(shards):
    """Whatever the main thread is doing when a worker is killed, later passes run."""
    before = children()
    loader = plain_loader(shards["hdf5"], batch_size=2, train=False,
                          backend=FORKED)
    assert len(list(loader)) == len(loader)
    workers = children() - before
    rest = iter(loader)
    next(rest)
    with pytest.raises(RuntimeError, match="DataLoader worker"):   # torch's SIGCHLD handler
        os.kill(min(workers), signal.SIGKILL)
        time.sleep(30)          # raised here, with the pass open: it is not the loader's error
    ids = ids_of(loader.dataset)
    whole = list(range(N))
    assert sorted(i for b in seen(loader, ids) for i in b) == whole     # beside the open pass
    del rest
    assert sorted(i for b in seen(loader, ids) for i in b) == whole
    now = children() - before
    assert len(now) == 2 and not now & workers      # new ones, kept; the old ones gone


@pytest.mark.parametrize("frozen_by_the_program", [False, True])
def test_forked_workers_never_collect_the_parents_garbage(shards, tmp_path,
                                                          frozen_by_the_program):
    log = tmp_path / "freed"
    if frozen_by_the_program:       # a program's own pre-fork freeze stays as it was
        keep = [object()]
        gc.freeze()
    try:
        with garbage_left_for_forks(log):
            loader = plain_loader(shards["hdf5"], backend=FORKED)
            assert len(list(loader)) == len(loader)
            if frozen_by_the_program:
                assert gc.get_freeze_count() > 0 and keep
    finally:
        gc.unfreeze()
    assert log.read_text().split() == [str(os.getpid())]      # freed here, and only here


@pytest.mark.gpu
def test_forked_cuda_loader_survives_cuda_garbage(shards, tmp_path):
    """The crash itself, on a GPU: a CUDA tensor in a garbage cycle, collected in a forked
    worker, killed it ("CUDA error: initialization error")."""
    with garbage_left_for_forks(tmp_path / "freed", tensor=torch.ones(4, device="cuda")):
        loader = plain_loader(shards["hdf5"], backend=FORKED, device="cuda")
        assert len(list(loader)) == len(loader)


def _take_and_exit(lock) -> None:
    lock.acquire()
    os._exit(0)             # a semaphore is not given back when its holder dies


def test_a_worker_that_died_holding_the_shared_event_lock_does_not_hang_the_shutdown(shards):
    """The DataLoader's workers read a shared event between items, under its lock: one
    terminated while it held that lock left the shutdown after an error waiting for it
    forever. Here a process takes the lock and dies holding it."""
    import multiprocessing
    import threading

    loader = plain_loader(shards["hdf5"], backend=FORKED)
    it = iter(loader)
    next(it)
    workers = loader.backend.host._workers
    lock = workers._iterator._workers_done_event._cond
    holder = multiprocessing.get_context("fork").Process(target=_take_and_exit, args=(lock,))
    holder.start()
    holder.join(30)
    stop = threading.Thread(target=workers.shutdown, kwargs={"kill": True}, daemon=True)
    stop.start()
    stop.join(60)
    assert not stop.is_alive(), "the shutdown waited on a lock a dead process held"


def test_a_worker_error_is_not_replaced_by_its_workers_being_stopped(tmp_path, monkeypatch):
    """About one in 140 such errors surfaced as "DataLoader worker (pid N) is killed by
    signal: Terminated": torch's SIGCHLD handler saw the workers this loader stopped, where a
    worker had not yet set its own SIGTERM handler (which exits quietly). Here no worker has
    one, and each stop waits until its worker is dead, so the handler runs every time."""
    import multiprocessing.process

    from torch.utils.data._utils import signal_handling

    from fastdata.converters.convert import convert
    from tests.helpers import plain_folder

    out = tmp_path / "o"
    convert(plain_folder(tmp_path / "src"), str(out), encoding="jpeg", sizes=[16],
            shard_size=5, progress=False)
    ds = fastdata.open(out)
    payload = bytes(ds.read_encoded([7])[0])
    shard = out / ds.manifest["shards"][1]["file"]
    shard.write_bytes(shard.read_bytes().replace(payload, bytes(len(payload))))
    terminate = multiprocessing.process.BaseProcess.terminate

    def terminate_and_wait(self):
        terminate(self)
        os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)     # dead, not yet reaped

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "terminate", terminate_and_wait)
    monkeypatch.setattr(signal_handling, "_set_worker_signal_handlers", lambda *a: None)
    loader = fastdata.Loader(out, batch_size=4, train=False, device="cpu",
                             backend=FORKED)
    for _ in range(3):
        with pytest.raises(OSError, match=f"{shard.name}: sample 2 .* not a readable JPEG"):
            list(loader)
