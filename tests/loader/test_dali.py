"""The DALI backend (CPU-only mode, real shard files) against the torch backend."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest
import torch

import fastdata
from fastdata.converters.convert import convert
from tests.helpers import N, ids_of, seen

pytest.importorskip("nvidia.dali",
                    reason="DALI not installed (pip install 'fastdata-shards[dali]')")
gpu = pytest.mark.gpu          # skipped without CUDA (conftest.py)


@pytest.fixture(scope="module")
def jpeg_shards(tmp_path_factory, shards):
    tmp = tmp_path_factory.mktemp("dali")
    src = str(tmp / "src")
    from tests.helpers import plain_folder
    plain_folder(src, per_class=8)
    out = {}
    for c in ("hdf5", "lmdb"):
        out[c] = str(tmp / f"jpeg-{c}")
        convert(src, out[c], container=c, encoding="jpeg", sizes=[16, 32], shard_size=7,
                num_workers=1, progress=False)
    return out


def labels_of(loader):
    return [y.tolist() for _, y in loader]


def both(path, **kw):
    args = dict(batch_size=4, device="cpu", num_workers=2, seed=5)
    return [fastdata.Loader(path, backend=b, **{**args, **kw}) for b in ("torch", "dali")]


@pytest.mark.parametrize("kind", ["hdf5", "lmdb", "jpeg-hdf5", "jpeg-lmdb"])
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_same_batches_as_torch_backend(shards, jpeg_shards, kind, train, world):
    path = jpeg_shards[kind[5:]] if kind.startswith("jpeg") else shards[kind]
    for rank in range(world):
        t, d = both(path, train=train, rank=rank, world_size=world, size=32, crop=24)
        assert len(t) == len(d)
        for epoch in (0, 3):
            t.set_epoch(epoch)
            d.set_epoch(epoch)
            lt, ld = labels_of(t), labels_of(d)
            assert lt == ld and len(ld) == len(d)
        x, y = next(iter(d))
        assert x.shape == (4, 3, 24, 24) and x.dtype == torch.float32
        assert y.dtype == torch.int64 and y.device.type == "cpu"


@pytest.mark.parametrize("container", ["hdf5", "lmdb"])
def test_eval_exactly_once_and_pixels_untouched(shards, container):
    ds = fastdata.open(shards[container])
    ids = ids_of(ds)
    per_rank = []
    for r in range(3):
        loader = fastdata.Loader(ds, backend="dali", batch_size=4, train=False, size=16,
                                 dtype=torch.uint8, device="cpu", rank=r, world_size=3)
        per_rank.append(seen(loader, ids))        # uint8 stored pixels map back to indices
    flat = sorted(i for g in per_rank for b in g for i in b)
    assert flat == list(range(N))
    assert [len(b) for b in per_rank[2]] == [4, 3]      # partial last batch, not padded


@pytest.mark.parametrize("container", ["hdf5", "lmdb"])
def test_raw_batches_reuse_a_few_arrays(shards, container, monkeypatch):
    """DALI copies each batch the source hands it, so the source reads later batches into the
    same few arrays (a fresh one faults its pages in at every batch), pixels intact."""
    from fastdata.loader import dali_backend

    made, real = [], dali_backend.page_aligned
    monkeypatch.setattr(dali_backend, "page_aligned", lambda shape: made.append(shape) or
                        real(shape))
    ds = fastdata.open(shards[container])
    ids = ids_of(ds)
    loader = fastdata.Loader(ds, backend="dali", batch_size=2, train=False, size=16,
                             dtype=torch.uint8, device="cpu")
    for epoch in range(3):
        loader.set_epoch(epoch)
        assert sorted(i for b in seen(loader, ids) for i in b) == list(range(N))
    assert len(made) <= 2 * loader.backend.prefetch + 4 < 3 * len(loader)


def test_cpu_batches_come_from_a_pool_and_held_ones_stay_intact(shards):
    """In CPU-only mode the output tensors are pooled: a batch the caller still holds is never
    written again, and one it let go of is used again."""
    ds = fastdata.open(shards["hdf5"])
    ids = ids_of(ds)
    loader = fastdata.Loader(ds, backend="dali", batch_size=2, train=False, size=16,
                             dtype=torch.uint8, device="cpu")
    held = list(loader)         # every batch alive at once: none may share memory
    assert len({x.data_ptr() for x, _ in held}) == len(held)
    order = [ids[hashlib.md5(x.permute(1, 2, 0).contiguous().numpy().tobytes()).hexdigest()]
             for images, _ in held for x in images]
    assert order == list(range(N))
    del held
    ptrs = {x.data_ptr() for x, _ in loader}     # let go as it goes: a few buffers, reused
    assert len(ptrs) <= 2 * loader.backend.prefetch + 4 < len(loader)


@pytest.mark.parametrize("kind", ["hdf5", "jpeg-lmdb"])
@pytest.mark.parametrize("opts", [dict(crop=24), dict(crop=12, size=16),
                                  dict(channels_last=True, dtype=torch.bfloat16, crop=20),
                                  dict(dtype="float16")])
def test_no_augmentation_images_match_torch_backend(shards, jpeg_shards, kind, opts):
    path = jpeg_shards["lmdb"] if kind == "jpeg-lmdb" else shards[kind]
    t, d = both(path, train=False, **{"size": 32, **opts})
    a, b = list(t), list(d)
    assert [y.tolist() for _, y in a] == [y.tolist() for _, y in b]
    for (xa, _), (xb, _) in zip(a, b):
        assert xa.shape == xb.shape and xa.dtype == xb.dtype
        assert xb.is_contiguous(memory_format=torch.channels_last) == \
            bool(opts.get("channels_last"))
        diff = (xa.float() - xb.float()).abs()
        assert diff.mean() < 0.02 and diff.max() < 0.5      # normalised units (1/255/std)


def test_train_augmentation_crops_and_flips(shards):
    kw = dict(batch_size=8, size=32, crop=24, device="cpu", seed=1)
    aug = torch.cat([x for x, _ in fastdata.Loader(shards["hdf5"], backend="dali", **kw)])
    plain = torch.cat([x for x, _ in fastdata.Loader(shards["hdf5"], backend="dali",
                                                     augment=False, **kw)])
    assert aug.shape == plain.shape == (16, 3, 24, 24) and torch.isfinite(aug).all()
    assert (aug - plain).abs().mean(dim=(1, 2, 3)).gt(0.05).float().mean() > 0.5


def test_resume_mid_epoch_and_progressive_size(shards):
    kw = dict(batch_size=3, seed=2, size=16, device="cpu")
    whole = labels_of(fastdata.Loader(shards["lmdb"], backend="dali", **kw))
    a = fastdata.Loader(shards["lmdb"], backend="dali", **kw)
    it = iter(a)
    first = [next(it)[1].tolist() for _ in range(2)]
    state = a.state_dict()
    del it                                   # abandoned mid-epoch with batches queued in DALI
    b = fastdata.Loader(shards["lmdb"], backend="dali", **kw)
    b.load_state_dict(state)
    assert first + labels_of(b) == whole
    assert labels_of(a) == whole             # a new loop starts the epoch, as a DataLoader's
    a.load_state_dict(state)
    assert labels_of(a) == whole[2:]         # unless a state was loaded
    c, d = iter(a), iter(a)                  # two live iterators: each its own pipeline
    assert [(y.tolist(), z.tolist()) for (_, y), (_, z) in zip(c, d)] == list(zip(whole, whole))
    a.size = 32
    assert {x.shape[-1] for x, _ in a} == {32}     # a whole epoch: its pipeline is kept
    a.crop = 24                              # a new output size: a new pipeline
    x, _ = next(iter(a))
    u, _ = next(iter(fastdata.Loader(shards["lmdb"], backend="dali", **{**kw, "size": 32},
                                     crop=24)))
    assert x.shape[-1] == 24 and torch.equal(x, u)


def test_a_new_crop_every_epoch_keeps_one_pipeline(shards):
    """Progressive resizing (FFCV's schedules change the resolution every epoch): each crop's
    pipeline, with its threads and buffers, used to be kept for good (6 threads more each)."""
    loader = fastdata.Loader(shards["hdf5"], backend="dali", batch_size=4, device="cpu",
                             num_workers=2)
    threads = []
    for epoch in range(6):
        loader.set_epoch(epoch)
        loader.crop = 8 + 2 * epoch
        assert {x.shape[-1] for x, _ in loader} == {loader.crop}
        threads.append(len(os.listdir("/proc/self/task")) if os.path.isdir("/proc") else 0)
    assert len(loader.backend._pipes) == 1
    assert threads[-1] <= threads[1], threads


def test_missing_dali_names_the_extra_and_import_stays_light(shards):
    code = (
        "import sys; import fastdata\n"
        "assert 'nvidia.dali' not in sys.modules\n"
        "sys.modules['nvidia.dali'] = None\n"       # as if not installed
        f"try:\n    fastdata.Loader({shards['hdf5']!r}, backend='dali', batch_size=2, "
        "device='cpu')\nexcept ImportError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, cwd=os.getcwd())
    assert r.returncode == 0, r.stderr
    assert "pip install 'fastdata-shards[dali]'" in r.stdout and "backend='dali'" in r.stdout


def test_a_dali_backend_takes_its_own_options(shards):
    backend = fastdata.DaliBackend(num_workers=1, prefetch=1)
    loader = fastdata.Loader(shards["hdf5"], backend=backend, batch_size=4, device="cpu")
    assert loader.backend.threads == 1 and loader.backend.host.num_workers == 1
    assert len(labels_of(loader)) == len(loader)
    with pytest.raises(ValueError, match=r"prefetch given beside backend=DaliBackend\("
                                         r"num_workers=1, prefetch=1\)"):
        fastdata.Loader(shards["hdf5"], backend=backend, batch_size=4, prefetch=3)


def test_fork_child_does_not_destroy_inherited_pipelines(shards):
    """A forked worker whose garbage collector meets the parent's DALI pipeline (a reference
    cycle loader <-> backend) must not crash: it died with SIGSEGV, first in DataLoader workers,
    then in a convert worker whose collector ran inside threading's after-fork hook."""
    import faulthandler
    import gc

    from fastdata.loader import dali_ops

    threshold = gc.get_threshold()
    gc.collect()
    gc.disable()
    try:
        loader = fastdata.Loader(shards["hdf5"], backend="dali", batch_size=4, size=16,
                                 device="cpu")
        list(loader)
        del loader                              # now only the cyclic collector can free it
        gc.set_threshold(1)     # the child's first allocation collects, before any hook of ours
        gc.enable()
        pid = os.fork()
        if pid == 0:
            faulthandler.dump_traceback_later(60, exit=True)    # a hang fails with stacks
            gc.collect()
            os._exit(0)
        _, status = os.waitpid(pid, 0)
    finally:
        gc.set_threshold(*threshold)
        gc.enable()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    gc.collect()
    assert not dali_ops._HELD and not list(dali_ops._PIPELINES)    # the parent frees it


@gpu
def test_gpu_pipeline_matches_cpu_labels(jpeg_shards, shards):
    for path in (jpeg_shards["hdf5"], shards["hdf5"]):
        kw = dict(batch_size=4, size=32, crop=24, train=False, seed=1)
        g = fastdata.Loader(path, backend="dali", device="cuda", dtype=torch.bfloat16, **kw)
        c = fastdata.Loader(path, backend="dali", device="cpu", **kw)
        for (xg, yg), (xc, yc) in zip(g, c):
            assert xg.is_cuda and yg.is_cuda and xg.dtype == torch.bfloat16
            assert xg.is_contiguous(memory_format=torch.channels_last)
            assert yg.cpu().tolist() == yc.tolist()
            assert (xg.float().cpu() - xc).abs().mean() < 0.05
