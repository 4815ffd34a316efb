"""The torch loader on real shards: partition, order, resume, workers, augmentation, errors."""
from __future__ import annotations

import contextlib
import gc
import glob
import hashlib
import itertools
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fastdata
from fastdata.converters.convert import convert
from fastdata import native
from fastdata.augment import (Augment, crop_resize_batched, crop_resize_per_sample,
                              packed_params, random_resized_crop_boxes, resized_patches)
from fastdata.order import Order
from tests.conftest import N, cold_read_cost, garbage_left_for_forks, ids_of, plain_folder, seen

def make(path, **kw):
    args = dict(batch_size=4, size=16, dtype=torch.uint8, augment=False, device="cpu")
    return fastdata.Loader(path, **{**args, **kw})


@pytest.mark.parametrize("container", ["hdf5", "lmdb"])
@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("workers", [0, 2])
def test_partition_eval_exactly_once_train_equal_disjoint(shards, container, world, workers):
    ds = fastdata.open(shards[container])
    ids = ids_of(ds)
    evals = [seen(make(ds, train=False, rank=r, world_size=world, num_workers=workers), ids)
             for r in range(world)]
    flat = sorted(i for per_rank in evals for b in per_rank for i in b)
    assert flat == list(range(N))                       # every sample exactly once
    kind = "process" if container == "lmdb" else "thread"
    trains = [make(ds, train=True, rank=r, world_size=world, num_workers=workers,
                   workers=kind) for r in range(world)]
    got = [seen(loader, ids) for loader in trains]
    per_rank = (N // world) // 4
    assert all(len(g) == per_rank == len(t) for g, t in zip(got, trains))
    assert all(len(b) == 4 for g in got for b in g)     # full batches only
    all_ids = [i for g in got for b in g for i in b]
    assert len(all_ids) == len(set(all_ids))            # disjoint across ranks


def test_seed_and_epoch_decide_the_order(shards):
    ds = fastdata.open(shards["hdf5"])
    ids = ids_of(ds)
    a, b, c = (make(ds, seed=s) for s in (1, 1, 2))
    first = seen(a, ids)
    assert first == seen(b, ids) and first != seen(c, ids)
    assert seen(a, ids) == first                        # same epoch repeats its order
    a.set_epoch(1)
    assert seen(a, ids) != first


@pytest.mark.parametrize("train", [True, False])
def test_resume_mid_epoch_yields_exactly_the_rest(shards, train):
    ds = fastdata.open(shards["lmdb"])
    ids = ids_of(ds)
    full = seen(make(ds, train=train, seed=3, num_workers=2), ids)
    loader = make(ds, train=train, seed=3, num_workers=2)
    loader.set_epoch(0)
    it = iter(loader)
    head = [next(it) for _ in range(2)]
    state = loader.state_dict()
    del it, head
    resumed = make(ds, train=train, seed=3)
    resumed.load_state_dict(state)
    assert seen(resumed, ids) == full[2:]


@pytest.mark.parametrize("workers", ["thread", "process"])
def test_each_loop_starts_the_epoch_like_a_dataloader(shards, workers):
    ds = fastdata.open(shards["hdf5"])
    ids = ids_of(ds)
    loader = make(ds, seed=3, num_workers=2, workers=workers)
    full = seen(loader, ids)
    next(iter(loader))                  # a peek at one batch is not lost from the next loop
    assert seen(loader, ids) == full
    a, b = iter(loader), iter(loader)   # two live iterators: each its own pass
    pairs = list(zip(a, b))
    assert len(pairs) == len(full) and all(torch.equal(x[0], y[0]) for x, y in pairs)
    assert loader.state_dict()["order"]["position"] == len(full)    # follows the latest: b
    assert next(b, None) is None and loader.state_dict()["order"]["position"] == 0


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_process_workers_fork_and_spawn(shards, method):
    ds = fastdata.open(shards["lmdb"])
    ds.read_batch([0])                                  # handles open in the parent first
    ids = ids_of(ds)
    ref = seen(make(ds, seed=5, num_workers=0), ids)
    got = seen(make(ds, seed=5, num_workers=2, workers="process", mp_context=method), ids)
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
def test_process_workers_make_batches_in_lent_buffers_and_held_ones_stay_intact(shards, opts):
    """Worker processes, kept from pass to pass, make each batch in a shared buffer the parent
    lent: a batch still held is never written again (past the buffers there are, batches come
    in fresh memory), one let go of is; a pass left unfinished gives its buffers back."""
    ds = fastdata.open(shards["hdf5"])
    kw = dict(batch_size=2, train=False, **opts)
    ref = [x.clone() for x, _ in make(ds, **kw)]
    before = children()
    loader = make(ds, num_workers=2, workers="process", mp_context="fork", **kw)
    lent = 2 * loader.prefetch + 2
    held = list(loader)
    workers = children() - before
    assert len(workers) == 2
    assert len(held) == len(ref) > lent
    assert all(torch.equal(x, r) for (x, _), r in zip(held, ref))
    assert len({x.untyped_storage().data_ptr() for x, _ in held}) == len(held)
    del held
    ring = {s.data_ptr() for s in loader._backend._workers.ring.storages}
    assert len(ring) == lent

    def one_pass():
        same, ptrs = [], set()
        for (x, _), r in zip(loader, ref):
            same.append(torch.equal(x, r))
            ptrs.add(x.untyped_storage().data_ptr())
        assert same == [True] * len(ref)
        return ptrs

    assert one_pass() | one_pass() <= ring
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
    convert(src, str(out), encoding="jpeg", sizes=[16], shard_size=4, workers=1,
            progress=False)
    ds = fastdata.open(out)
    payload = bytes(ds.read_encoded([5])[0])
    shard = out / ds.manifest["shards"][1]["file"]
    shard.write_bytes(shard.read_bytes().replace(payload, bytes(len(payload))))
    before = children()
    loader = make(str(out), train=False, num_workers=2, workers="process")
    for _ in range(2):
        with pytest.raises(OSError, match="not a readable JPEG"):
            list(loader)
        assert not children() - before      # no worker left waiting
    loader.close()


def test_process_workers_kept_from_a_pass_follow_a_state_loaded_after_it(shards):
    """Workers started under one seed make the batches of another loaded afterwards."""
    kw = dict(dtype=torch.float32, augment=True, crop=12, train=True)
    other = make(shards["hdf5"], seed=7, **kw)
    other.set_epoch(2)
    rest = iter(other)
    next(rest)
    state = other.state_dict()
    want = [x for x, _ in rest]
    loader = make(shards["hdf5"], seed=1, num_workers=2, workers="process", mp_context="fork",
                  **kw)
    assert len(list(loader)) == len(loader)
    loader.load_state_dict(state)
    got = [x for x, _ in loader]
    assert len(got) == len(want) > 0 and all(torch.equal(a, b) for a, b in zip(got, want))


def test_a_worker_process_killed_mid_pass_is_an_error_and_the_next_pass_has_new_ones(shards):
    """Whatever the main thread is doing when a worker is killed, later passes run."""
    before = children()
    loader = make(shards["hdf5"], batch_size=2, train=False, num_workers=2, workers="process",
                  mp_context="fork")
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
            loader = make(shards["hdf5"], num_workers=2, workers="process", mp_context="fork")
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
        loader = make(shards["hdf5"], num_workers=2, workers="process", mp_context="fork",
                      device="cuda")
        assert len(list(loader)) == len(loader)


@pytest.mark.gpu
@pytest.mark.parametrize("backend,recipe", [("torch", False), ("dali", False), ("torch", True)])
def test_cuda_batches_never_make_the_host_wait_for_the_gpu(shards, backend, recipe):
    """A copy from pageable memory first waits for its stream's earlier work (CUDA's rule):
    labels and crop parameters copied that way made the training loop wait for the GPU at
    every batch. With the GPU kept busy for about a second on the training stream (and on
    the torch backend's side stream), the next batches must still come at once; also with a
    heavy batch transform (colour, erasing, MixUp/CutMix, TrivialAugment), whose operations
    must not read a device value on the host either. A device memory allocation waits for
    the GPU too (CUDA's implicit synchronisation), so a few batches come first and let torch's
    caching allocator reach the steady state it keeps in training."""
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    from fastdata import transforms as T
    heavy = T.Compose([T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.RandomErasing(), T.TrivialAugment(),
                       T.RandomChoice([T.MixUp(0.8, num_classes=3), T.CutMix(num_classes=3)])])
    loader = fastdata.Loader(shards["hdf5"], backend=backend, batch_size=2, size=32, crop=24,
                             device="cuda", num_workers=2, prefetch=1,
                             batch_transform=heavy if recipe else None)
    it = iter(loader)
    for _ in range(6):
        next(it)
    streams = [torch.cuda.current_stream()]
    if backend == "torch":
        streams.append(loader._backend._stream)
    time.sleep(0.5)                         # the readers fill the read-ahead meanwhile
    t0 = time.perf_counter()
    for s in streams:
        with torch.cuda.stream(s):
            torch.cuda._sleep(2_000_000_000)   # GPU clock cycles: ~1 s
    x, y = next(it)
    x, y = next(it)
    waited = time.perf_counter() - t0
    torch.cuda.synchronize()
    busy = time.perf_counter() - t0
    assert busy > 0.3 and waited < busy / 3, (waited, busy)
    assert x.shape == (2, 3, 24, 24) and y.is_cuda


def test_float_output_contract_and_determinism(shards):
    def run(workers, kind):
        loader = fastdata.Loader(shards["hdf5"], batch_size=5, size=32, crop=24, device="cpu",
                                 num_workers=workers, workers=kind, seed=9,
                                 channels_last=True, dtype="bfloat16")
        return list(loader)
    a, b = run(0, "thread"), run(2, "process")
    x, y = a[0]
    assert x.shape == (5, 3, 24, 24) and x.dtype == torch.bfloat16
    assert x.is_contiguous(memory_format=torch.channels_last)
    assert all(torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(a, b))


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
    monkeypatch.setattr(fastdata.readers.ShardSet, "read_batch", copied)
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
        convert(src, out, container=c, sizes=[128], workers=1, progress=False)
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
    monkeypatch.setattr(fastdata.readers, "available_memory", lambda: 64 << 10)  # now they don't
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


@pytest.mark.parametrize("train", [True, False])
def test_progressive_resizing_changes_size_and_crop_between_epochs(shards, train):
    """``size`` and ``crop`` set on a live loader give what a loader built with them gives
    (eval: no crop is the stored square as is, a crop is the 87.5% centre), and a state_dict
    carries both."""
    kw = dict(batch_size=5, train=train, seed=3, device="cpu", num_workers=2)
    loader = fastdata.Loader(shards["lmdb"], size=16, **kw)
    assert next(iter(loader))[0].shape == (5, 3, 16, 16)
    loader.size, loader.crop = 32, 24
    fresh = fastdata.Loader(shards["lmdb"], size=32, crop=24, **kw)
    for (x, y), (u, v) in zip(loader, fresh):
        assert x.shape[1:] == (3, 24, 24) and torch.equal(x, u) and torch.equal(y, v)
    other = fastdata.Loader(shards["lmdb"], **kw)
    other.load_state_dict(loader.state_dict())
    assert (other.size, other.crop) == (32, 24)
    with pytest.raises(ValueError, match="crop=0 is not valid"):
        loader.crop = 0


# ---------------------------------------------------------------- augmentation
@pytest.mark.gpu
@pytest.mark.parametrize("train,workers", [(True, "thread"), (False, "thread"),
                                           (True, "process")])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16])
def test_cuda_path_matches_the_cpu_path(shards, train, workers, dtype):
    """Pinned buffers, the side stream and the batched kernel on CUDA: the same samples in the
    same batches as on the CPU, the contract's dtype and layout, the same geometry. Forked
    worker processes must leave pinning to the parent."""
    kw = dict(batch_size=4, size=32, crop=24, train=train, seed=1, num_workers=2, dtype=dtype)
    g = fastdata.Loader(shards["hdf5"], device="cuda", workers=workers, mp_context="fork",
                        **kw)
    c = fastdata.Loader(shards["hdf5"], device="cpu", channels_last=True, **kw)
    n = 0
    with warnings.catch_warnings(record=True) as caught:    # e.g. a deprecated DataLoader arg
        warnings.simplefilter("always")
        # Python 3.12+ on the fork that this test asks for (CUDA's threads are running)
        warnings.filterwarnings("ignore", "This process .* is multi-threaded, use of fork",
                                DeprecationWarning)
        pairs = list(zip(g, c))
    assert not caught, [str(w.message) for w in caught]
    with pytest.raises(ValueError, match=f"device='cuda:{torch.cuda.device_count()}' is not "
                                         f"valid; torch sees"):
        fastdata.Loader(shards["hdf5"], device=f"cuda:{torch.cuda.device_count()}", **kw)
    for (xg, yg), (xc, yc) in pairs:
        assert xg.is_cuda and yg.is_cuda and xg.dtype == dtype and yg.dtype == torch.int64
        assert xg.shape == xc.shape and xg.is_contiguous(memory_format=torch.channels_last)
        assert yg.cpu().tolist() == yc.tolist()
        # the same antialiased resampling: a grey level apart at most (bf16: plus its rounding)
        tol = 0.05 if dtype == torch.bfloat16 else 1
        assert (xg.float().cpu() - xc.float()).abs().max() <= tol
        n += 1
    assert n == len(g) == len(c)


def test_crop_boxes_follow_torchvision_semantics():
    g = torch.Generator().manual_seed(0)
    boxes = random_resized_crop_boxes(4000, 48, 64, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3),
                                      generator=g)
    top, left, h, w = boxes.T
    assert (top >= 0).all() and (left >= 0).all()
    assert (top + h <= 48).all() and (left + w <= 64).all()          # inside the image
    area = (h * w).float() / (48 * 64)
    aspect = w.float() / h.float()
    assert area.min() >= 0.06 and area.max() <= 1.0
    assert aspect.min() >= 0.7 and aspect.max() <= 1.4
    assert area.std() > 0.1 and len({tuple(b) for b in boxes.tolist()}) > 3000


def _images(n=16, s=20, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (n, s, s, 3),
                                                                   dtype=np.uint8))


def test_flip_really_flips():
    x = _images()
    aug = Augment(train=True, dtype=torch.uint8, scale=(1.0, 1.0), ratio=(1.0, 1.0))
    y = aug(x, torch.Generator().manual_seed(1)).permute(0, 2, 3, 1)
    flipped = [bool(torch.equal(y[k], x[k].flip(1))) for k in range(len(x))]
    same = [bool(torch.equal(y[k], x[k])) for k in range(len(x))]
    assert all(f != s for f, s in zip(flipped, same))                # each is one or the other
    assert 0 < sum(flipped) < len(x)


def test_a_mirrored_crop_is_the_mirror_of_the_crop():
    """The per-sample kernel gives ``interpolate(antialias=True)`` of each crop exactly, and
    it mirrors the source crop before resizing it (less to copy): the same pixels as mirroring
    the resized crop, upscaled or antialiased-downscaled."""
    x = _images(64, 48)
    boxes = random_resized_crop_boxes(64, 48, 48, generator=torch.Generator().manual_seed(2))
    for out in (24, 40):                    # most crops shrink to 24, grow to 40
        plain = list(resized_patches(x, boxes, [False] * 64, out))
        mirrored = list(resized_patches(x, boxes, [True] * 64, out))
        assert all(torch.equal(m, p.flip(-1)) for m, p in zip(mirrored, plain))
        for k, (t, l, h, w) in enumerate(boxes.tolist()):
            crop = x[k:k + 1, t:t + h, l:l + w].permute(0, 3, 1, 2)
            ref = F.interpolate(crop, size=(out, out), mode="bilinear", antialias=True)
            assert torch.equal(plain[k], ref[0])


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_strided_input_gives_the_same_batch(dtype):
    """A sliced (non-contiguous) batch gives what its contiguous copy gives."""
    x = _images(32, 40)[::2, 3:, 5:38]                  # every other image, an odd window
    aug = Augment(train=True, crop=24, dtype=dtype, channels_last=True)
    a = aug(x, torch.Generator().manual_seed(7))
    assert torch.equal(a, aug(x.contiguous(), torch.Generator().manual_seed(7)))


def test_normalisation_and_kernels_agree():
    x = _images(8, 32)
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    ident = Augment(train=False, mean=mean, std=std)(x)               # no crop: exact values
    ref = (x.permute(0, 3, 1, 2).float() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) \
        / torch.tensor(std).view(1, 3, 1, 1)
    assert torch.allclose(ident, ref, atol=1e-5)
    const = torch.full((4, 32, 32, 3), 128, dtype=torch.uint8)
    y = Augment(train=True, crop=24)(const, torch.Generator().manual_seed(0))
    expected = (128 / 255 - torch.tensor((0.485, 0.456, 0.406))) \
        / torch.tensor((0.229, 0.224, 0.225))
    assert torch.allclose(y.mean((0, 2, 3)), expected, atol=1e-3)
    level = 1 / (255 * min(std)) + 1e-5                # one grey level, normalised
    for train in (False, True):
        a = Augment(train=train, crop=24, mean=mean, std=std, kernel="per_sample")(
            x, torch.Generator().manual_seed(4))
        b = Augment(train=train, crop=24, mean=mean, std=std, kernel="batched")(
            x, torch.Generator().manual_seed(4))
        assert a.shape == b.shape and (a - b).abs().max() <= level


@pytest.mark.parametrize("size,out", [(48, 24), (48, 40), (37, 37), (64, 20)])
def test_the_batched_kernel_resamples_like_the_per_sample_kernel(size, out):
    """The CUDA kernel (two batched matrix products, run here on CPU) gives each crop
    ``interpolate(antialias=True)``'s values, mirrored where asked, and so stays within one
    grey level of the CPU's uint8 kernel, downscaled crops included (no aliasing)."""
    g = torch.Generator().manual_seed(size + out)
    x = _images(48, size, seed=out)
    boxes = random_resized_crop_boxes(48, size, size, generator=g)
    flips = (torch.rand(48, generator=g) < 0.5).tolist()
    y = crop_resize_batched(x, boxes, flips, out)
    for k, (t, l, h, w) in enumerate(boxes.tolist()):
        crop = x[k, t:t + h, l:l + w].permute(2, 0, 1)[None].float()
        ref = F.interpolate(crop, size=(out, out), mode="bilinear", antialias=True)[0]
        assert torch.allclose(y[k], ref.flip(-1) if flips[k] else ref, atol=1e-3)
    u8 = crop_resize_per_sample(x, boxes, flips, out)
    assert (y.round() - u8.float()).abs().max() <= 1
    # the parameters packed into one (B, 5) tensor, as the torch backend sends them to a GPU
    p = packed_params(boxes, flips, out=torch.full((48, 5), -1, dtype=torch.int64))
    assert torch.equal(crop_resize_batched(x, p[:, :4], p[:, 4], out), y)
    # normalising inside (scale on the conversion, shift on the second product), in half
    # precision as CUDA does for half-precision outputs: under half a grey level apart
    scale, shift = torch.tensor([1 / 50, 1 / 60, 1 / 70]), torch.tensor([-2.0, -1.5, -1.0])
    ref = y * scale.view(3, 1, 1) + shift.view(3, 1, 1)
    for dtype, levels in ((torch.float32, 1e-3), (torch.float16, 0.5)):
        z = crop_resize_batched(x, boxes, flips, out, dtype=dtype, affine=(scale, shift))
        assert z.dtype == dtype
        assert ((z.float() - ref) / scale.view(3, 1, 1)).abs().max() <= levels


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layouts_hold_the_same_values(dtype, train):
    """channels_last and NCHW output hold the same values up to float rounding, normalised as
    asked: float32 (the C kernel where built) as the float reference kernel computes it,
    bfloat16 from the uint8 resize. Eval's 24 px centre box of a 32 px image needs no resize:
    its rows are a strided view of the batch."""
    x, mean, std = _images(8, 32), (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    kw = dict(train=train, crop=24, mean=mean, std=std, eval_ratio=None if train else 0.75)
    y = {cl: Augment(dtype=dtype, channels_last=cl, **kw)(x, torch.Generator().manual_seed(2))
         for cl in (False, True)}
    assert y[False].is_contiguous() and y[True].is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(y[False].float(), y[True].float(), rtol=0, atol=1e-6)
    plain = Augment(dtype=torch.uint8, **kw)(x, torch.Generator().manual_seed(2))
    if not train:
        assert torch.equal(plain, x[:, 4:28, 4:28].permute(0, 3, 1, 2))
    mean, std = torch.tensor(mean).view(1, 3, 1, 1), torch.tensor(std).view(1, 3, 1, 1)
    if dtype == torch.float32:
        boxes, flips = Augment(**kw).params(8, 32, 32, torch.Generator().manual_seed(2))
        ref = (crop_resize_batched(x, boxes, flips, 24) / 255 - mean) / std
        atol = 1e-4 if native.available() else 1 / (255 * 0.2)     # else: the uint8 resize
    else:
        ref, atol = (plain.float() / 255 - mean) / std, 0.05
    assert torch.allclose(y[True].float(), ref, atol=atol)


def test_order_lengths():
    assert len(Order(23, batch_size=4, train=True, world_size=2)) == 2
    assert [len(Order(23, batch_size=4, train=False, rank=r, world_size=2)) for r in (0, 1)] \
        == [3, 3]
    assert len(Order(23, batch_size=4, train=False, drop_last=True, world_size=1)) == 5


@pytest.mark.parametrize("kw, match", [
    ({"backend": "jax"}, "backend='jax' is not valid; choose one of torch"),
    ({"batch_size": 0}, "batch_size=0"),
    ({"size": 64}, "size 64 is not stored.*16, 32"),
    ({"size": 20}, "not a power of two"),
    ({"dtype": "int4"}, "dtype='int4' is not valid; choose one of float32"),
    ({"workers": "fiber"}, "workers='fiber' is not valid; choose one of thread, process"),
    ({"mp_context": "clone"}, "mp_context='clone' is not valid; choose one of fork, spawn"),
    ({"seed": "a"}, "seed='a' is not valid; use an integer >= 0"),
    ({"seed": -1}, "seed=-1 is not valid"),
    ({"rank": 2, "world_size": 2}, "rank=2 is not valid for world_size=2"),
    ({"device": "tpu"}, "device"),
    ({"num_workers": -1}, "num_workers=-1"),
    ({"num_workers": True}, "num_workers=True is not valid; use an integer >= 0"),
    ({"prefetch": 0}, "prefetch=0 is not valid; use an integer >= 1"),
    ({"batch_size": 4.0}, "batch_size=4.0 is not valid; use an integer >= 1"),
    ({"shuffle": "no"}, "shuffle='no' is not valid; use True or False or None"),
    ({"crop": 2.5}, "crop=2.5 is not valid; use an integer >= 1 or None"),
    ({"scale": 0.5}, "scale=0.5 is not valid; give 2 numbers"),
    ({"scale": (0.5, 0.2)}, r"scale=\(0.5, 0.2\) is not valid; use \(lo, hi\), 0 < lo"),
    ({"ratio": (0, 1)}, r"ratio=\(0.0, 1.0\) is not valid"),
    ({"mean": None}, "mean=None is not valid; give 3 numbers"),
    ({"std": (1, 0, 1)}, "every value must be > 0"),
    ({"channels_last": "yes"}, "channels_last='yes' is not valid"),
    ({"batch_size": 24}, "batch_size=24 leaves no training batch: each of the 1 rank.*"
                         "holds 23 samples.*use batch_size <= 23 or drop_last=False"),
    ({"batch_size": 12, "world_size": 2, "rank": 1}, "batch_size=12 .* holds 11 samples"),
    ({"batch_size": 1, "world_size": 24, "rank": 0}, "world_size=24 leaves no training sample"),
])
def test_bad_arguments(shards, kw, match):
    with pytest.raises((ValueError, RuntimeError), match=match):
        fastdata.Loader(shards["hdf5"], **{"batch_size": 4, **kw})


@pytest.mark.parametrize("call, match", [
    (lambda ld: ld.set_epoch(-1), "epoch=-1 is not valid; use an integer >= 0"),
    (lambda ld: ld.set_epoch("1"), "epoch='1' is not valid"),    # both failed only later
    (lambda ld: ld.load_state_dict({"epoch": 3}), "not a Loader.state_dict()"),  # KeyError
    (lambda ld: ld.load_state_dict({"order": {"epoch": 3}, "size": 16}), "not a loader state"),
])
def test_bad_epoch_and_state_are_named(shards, call, match):
    loader = fastdata.Loader(shards["hdf5"], batch_size=4, device="cpu")
    with pytest.raises(ValueError, match=match):
        call(loader)
    loader.set_epoch(np.int64(2))                       # numpy ints are fine
    assert loader.order.epoch == 2


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity")
def test_worker_defaults_follow_the_cpus_this_process_may_use(shards, tmp_path):
    """A job pinned to 1 CPU (taskset, a Slurm cpuset) defaults to 1 worker, not one per core
    of the machine; a cgroup CPU quota (docker --cpus) caps it the same way."""
    from fastdata.env import usable_cpus

    code = ("import os, fastdata; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            f"print(fastdata.Loader({shards['hdf5']!r}, batch_size=4, device='cpu').num_workers)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1"

    mine, checked = len(os.sched_getaffinity(0)), 0
    for v1, (quota, period) in [(False, ("50000", "100000")), (True, ("50000", "100000")),
                                (False, ("max", "100000")), (True, ("-1", "100000"))]:
        root = tmp_path / f"{v1}-{quota}"
        files = {"cpu.cfs_quota_us": quota, "cpu.cfs_period_us": period} if v1 else \
            {"cpu.max": f"{quota} {period}"}
        if _stand_in_cgroups(root, "cpu" if v1 else "", files):
            assert usable_cpus(str(root)) == (1 if quota == "50000" else mine), (v1, quota)
            checked += 1
    # a container's view: its own cgroup at the root, where /proc/self/cgroup names a host path
    (tmp_path / "container").mkdir()
    (tmp_path / "container" / "cpu.max").write_text("50000 100000\n")
    with open("/proc/self/cgroup") as f:
        if any(line.startswith("0::") for line in f):               # a v2 hierarchy
            assert usable_cpus(str(tmp_path / "container")) == 1
            checked += 1
    if not checked:
        pytest.skip(NO_CGROUPS)


NO_CGROUPS = "the affinity case passed; this host shows no cgroup hierarchy to stand in for"


def _stand_in_cgroups(root, controller: str, files: dict):
    """Writes ``files`` into this process's cgroup of ``controller`` ("" for v2's unified
    hierarchy) under a stand-in root: that folder, or None where the host has no such
    hierarchy."""
    with open("/proc/self/cgroup") as f:
        groups = [line.rstrip("\n").split(":", 2) for line in f]
    for _, controllers, path in groups:
        if controllers == controller or (controller and controller in controllers.split(",")):
            d = root / (controllers if controller else "") / path.lstrip("/")
            d.mkdir(parents=True, exist_ok=True)
            for name, text in files.items():
                (d / name).write_text(text + "\n")
            return d
    return None


def test_usable_memory_follows_a_cgroup_memory_limit(tmp_path):
    """In a container limited to 2 GiB (docker --memory, a Kubernetes limit) the convert's
    memory check must count 2 GiB, not the machine: beyond the limit is the OOM killer."""
    from fastdata.env import usable_memory

    machine, checked = usable_memory(str(tmp_path / "none")), 0
    assert machine == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for v1, limit in [(False, "2147483648"), (True, "2147483648"), (False, "max"),
                      (True, str(2**63 - 4096))]:                 # v1's "no limit"
        root = tmp_path / f"{v1}-{limit}"
        name = "memory.limit_in_bytes" if v1 else "memory.max"
        if _stand_in_cgroups(root, "memory" if v1 else "", {name: limit}):
            expect = min(machine, 2**31) if limit == "2147483648" else machine
            assert usable_memory(str(root)) == expect, (v1, limit)
            checked += 1
    # a limit on a parent cgroup (a systemd slice, a pod) applies below it too
    for v1, name in [(False, "memory.max"), (True, "memory.limit_in_bytes")]:
        root = tmp_path / f"parent-{v1}"
        leaf = _stand_in_cgroups(root, "memory" if v1 else "", {name: "max" if not v1 else
                                                                str(2**63 - 4096)})
        if leaf is not None and leaf != root / ("memory" if v1 else ""):
            (leaf.parent / name).write_text("1073741824\n")
            assert usable_memory(str(root)) == min(machine, 2**30), v1
            checked += 1
    if not checked:
        pytest.skip("no cgroup hierarchy on this host to stand in for (the machine's memory "
                    "case passed)")


def test_available_memory_leaves_out_what_a_cgroup_holds_besides_file_pages(tmp_path):
    """Whether a set is read ahead at random depends on the memory more page cache could
    take: in a 2 GiB cgroup whose processes hold 1.5 GiB, 1 GiB of it file pages (which the
    cache gives up), that is 1.5 GiB, not the limit."""
    from fastdata.env import available_memory

    machine, checked = available_memory(str(tmp_path / "none")), 0      # MemAvailable
    assert 0 < machine <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for v1 in (False, True):
        files = ({"memory.limit_in_bytes": str(2 << 30), "memory.usage_in_bytes": str(3 << 29),
                  "memory.stat": f"cache 4096\nrss {1 << 29}\ntotal_cache {1 << 30}"} if v1 else
                 {"memory.max": str(2 << 30), "memory.current": str(3 << 29),
                  "memory.stat": f"anon {1 << 29}\nfile {1 << 30}"})
        if _stand_in_cgroups(tmp_path / f"v1-{v1}", "memory" if v1 else "", files):
            got = available_memory(str(tmp_path / f"v1-{v1}"))
            assert got == 3 << 29 or (got < 3 << 29 and machine < 2 << 30), (v1, got)
            checked += 1
    if not checked:
        pytest.skip("no cgroup hierarchy on this host to stand in for (MemAvailable passed)")


def test_a_crop_larger_than_the_stored_size_warns_once_naming_the_sizes(shards):
    with pytest.warns(UserWarning, match=r"crop=24 is larger than the stored size 16 read from "
                                         r".* \(it stores 16, 32\): every image is upsampled; "
                                         r"read size=32 instead"):
        loader = fastdata.Loader(shards["hdf5"], batch_size=4, size=16, crop=24, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader.crop = 28                    # once per loader
        loader.size, loader.crop = 32, 32   # no upsampling
    with pytest.warns(UserWarning, match="convert with --size 64 to avoid it"):
        fastdata.Loader(shards["hdf5"], batch_size=4, crop=48, device="cpu")


@pytest.fixture(scope="module")
def jpeg_shards(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("jpeg")
    src = plain_folder(tmp / "src", per_class=4)
    for encoding in ("jpeg", "raw"):        # raw: the pixels the JPEGs were encoded from
        convert(src, str(tmp / encoding), encoding=encoding, sizes=[32], shard_size=5,
                workers=1, progress=False)
    return str(tmp / "jpeg")


def test_jpeg_decode_is_chosen_by_device_and_a_bad_choice_is_named(jpeg_shards, shards):
    assert fastdata.Loader(jpeg_shards, batch_size=2, device="cpu").jpeg_decode == "cpu"
    with pytest.raises(ValueError, match="jpeg_decode='gpu' needs a CUDA device, not cpu"):
        fastdata.Loader(jpeg_shards, batch_size=2, device="cpu", jpeg_decode="gpu")
    with pytest.raises(ValueError, match="this set stores raw"):
        fastdata.Loader(shards["hdf5"], batch_size=2, device="cpu", jpeg_decode="gpu")
    with pytest.raises(ValueError, match="jpeg_decode='nvjpeg' is not valid; choose one of "
                                         "auto, cpu, gpu"):
        fastdata.Loader(jpeg_shards, batch_size=2, device="cpu", jpeg_decode="nvjpeg")


@pytest.mark.gpu
@pytest.mark.parametrize("workers", ["thread", "process"])
def test_jpeg_shards_decoded_on_the_gpu_match_the_cpu_decode(jpeg_shards, workers):
    """nvJPEG and libjpeg-turbo need not give the same pixels (their upsampling of colour and
    their rounding differ): each must be about as close to the encoded pixels as the other."""
    from fastdata.loaders import gpu_jpeg_available

    ok, why = gpu_jpeg_available()
    if not ok:
        pytest.skip(why)
    kw = dict(batch_size=4, device="cuda", dtype=torch.uint8, train=False, num_workers=2,
              workers=workers)
    gpu = fastdata.Loader(jpeg_shards, jpeg_decode="auto", **kw)
    cpu = fastdata.Loader(jpeg_shards, jpeg_decode="cpu", **kw)
    raw = fastdata.Loader(os.path.join(os.path.dirname(jpeg_shards), "raw"), **kw)
    assert gpu.jpeg_decode == "gpu"
    for (a, la), (b, lb), (c, lc) in zip(gpu, cpu, raw):
        assert torch.equal(la, lb) and torch.equal(la, lc) and a.shape == b.shape == c.shape
        off_gpu, off_cpu, apart = ((u.float() - v.float()).abs().mean().item()
                                   for u, v in ((a, c), (b, c), (a, b)))
        assert off_gpu <= 2 * off_cpu + 2, (off_gpu, off_cpu, apart)
