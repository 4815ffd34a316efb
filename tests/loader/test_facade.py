"""The Loader on real shards: partition, order, resume, augmentation, hooks, errors."""
from __future__ import annotations

import hashlib
import os
import re
import threading
import time
import warnings

import numpy as np
import pytest
import torch

import fastdata
from fastdata.converters.convert import convert
from tests.helpers import (
    N,
    backend_of,
    ids_of,
    plain_folder,
    plain_loader,
    seen,
)


@pytest.mark.parametrize("container", ["hdf5", "lmdb"])
@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("workers", [0, 2])
def test_partition_eval_exactly_once_train_equal_disjoint(shards, container, world, workers):
    ds = fastdata.open(shards[container])
    ids = ids_of(ds)
    evals = [seen(plain_loader(ds, train=False, rank=r, world_size=world, num_workers=workers), ids)
             for r in range(world)]
    flat = sorted(i for per_rank in evals for b in per_rank for i in b)
    assert flat == list(range(N))                       # every sample exactly once
    kind = "process" if container == "lmdb" else "thread"
    trains = [plain_loader(ds, train=True, rank=r, world_size=world,
                           backend=fastdata.TorchBackend(num_workers=workers,
                                                         workers=kind)) for r in range(world)]
    got = [seen(loader, ids) for loader in trains]
    per_rank = (N // world) // 4
    assert all(len(g) == per_rank == len(t) for g, t in zip(got, trains))
    assert all(len(b) == 4 for g in got for b in g)     # full batches only
    all_ids = [i for g in got for b in g for i in b]
    assert len(all_ids) == len(set(all_ids))            # disjoint across ranks


def test_seed_and_epoch_decide_the_order(shards):
    ds = fastdata.open(shards["hdf5"])
    ids = ids_of(ds)
    a, b, c = (plain_loader(ds, seed=s) for s in (1, 1, 2))
    first = seen(a, ids)
    assert first == seen(b, ids) and first != seen(c, ids)
    assert seen(a, ids) == first                        # same epoch repeats its order
    a.set_epoch(1)
    assert seen(a, ids) != first


@pytest.mark.parametrize("train", [True, False])
def test_resume_mid_epoch_yields_exactly_the_rest(shards, train):
    ds = fastdata.open(shards["lmdb"])
    ids = ids_of(ds)
    full = seen(plain_loader(ds, train=train, seed=3, num_workers=2), ids)
    loader = plain_loader(ds, train=train, seed=3, num_workers=2)
    loader.set_epoch(0)
    it = iter(loader)
    head = [next(it) for _ in range(2)]
    state = loader.state_dict()
    del it, head
    resumed = plain_loader(ds, train=train, seed=3)
    resumed.load_state_dict(state)
    assert seen(resumed, ids) == full[2:]


@pytest.mark.parametrize("backend, workers", [("torch", "process"), ("dali", "thread")])
def test_resume_on_another_layout_reads_the_rest_of_the_epoch_once(shards, backend, workers):
    """Saved by 3 ranks of 2 with reader threads, resumed by 2 ranks of 3 with process workers
    or on the DALI backend: the rest of the epoch, once, then whole epochs."""
    if backend == "dali":
        pytest.importorskip("nvidia.dali", reason="DALI not installed")
    ds = fastdata.open(shards["hdf5"])
    ids = ids_of(ds)
    old = [plain_loader(ds, seed=3, batch_size=2, rank=r, world_size=3, num_workers=2)
           for r in range(3)]
    read = []
    for loader in old:
        loader.set_epoch(1)
        it = iter(loader)
        for _ in range(2):
            images, _ = next(it)
            read += [ids[hashlib.md5(x.tobytes()).hexdigest()]
                     for x in images.permute(0, 2, 3, 1).contiguous().numpy()]
    state = old[1].state_dict()
    new = [plain_loader(ds, seed=3, batch_size=3, rank=r, world_size=2,
                        backend=backend_of(backend, workers)) for r in range(2)]
    for loader in new:
        loader.load_state_dict(state)
    assert [loader.batches_left() for loader in new] == [1, 1]      # (23 - 12) // 2 // 3
    rest = [i for loader in new for b in seen(loader, ids) for i in b]
    assert len(read) == 12 and len(rest) == 6 and len(set(read + rest)) == 18
    whole = [i for loader in new for b in seen(loader, ids) for i in b]     # epoch 1 again
    assert len(whole) == len(set(whole)) == 2 * (N // 2 // 3) * 3


def test_a_split_order_is_the_same_on_both_backends(shards):
    """``shuffle_window`` and ``shard_split``: the DALI backend reads each rank's batches as
    the torch backend does, two epochs."""
    pytest.importorskip("nvidia.dali", reason="DALI not installed")
    ds = fastdata.open(shards["hdf5"])
    ids = ids_of(ds)
    for rank in range(2):
        loaders = [plain_loader(ds, seed=5, batch_size=3, rank=rank, world_size=2,
                                shuffle_window=1, shard_split=2, backend=b)
                   for b in ("torch", "dali")]
        for epoch in range(2):
            for loader in loaders:
                loader.set_epoch(epoch)
            torch_batches, dali_batches = (seen(loader, ids) for loader in loaders)
            assert torch_batches == dali_batches and len(torch_batches) > 1

@pytest.mark.parametrize("workers", ["thread", "process"])
def test_each_loop_starts_the_epoch_like_a_dataloader(shards, workers):
    ds = fastdata.open(shards["hdf5"])
    ids = ids_of(ds)
    loader = plain_loader(ds, seed=3, backend=fastdata.TorchBackend(num_workers=2, workers=workers))
    full = seen(loader, ids)
    next(iter(loader))                  # a peek at one batch is not lost from the next loop
    assert seen(loader, ids) == full
    a, b = iter(loader), iter(loader)   # two live iterators: each its own pass
    pairs = list(zip(a, b))
    assert len(pairs) == len(full) and all(torch.equal(x[0], y[0]) for x, y in pairs)
    assert loader.state_dict()["order"]["position"] == len(full)    # follows the latest: b
    assert next(b, None) is None and loader.state_dict()["order"]["position"] == 0


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
        streams.append(loader.backend._stream)
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
                                 backend=fastdata.TorchBackend(num_workers=workers, workers=kind),
                                 seed=9,
                                 channels_last=True, dtype="bfloat16")
        return list(loader)
    a, b = run(0, "thread"), run(2, "process")
    x, y = a[0]
    assert x.shape == (5, 3, 24, 24) and x.dtype == torch.bfloat16
    assert x.is_contiguous(memory_format=torch.channels_last)
    assert all(torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(a, b))


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
    kw = dict(batch_size=4, size=32, crop=24, train=train, seed=1, dtype=dtype)
    g = fastdata.Loader(shards["hdf5"], device="cuda", **kw,
                        backend=fastdata.TorchBackend(workers=workers, mp_context="fork",
                                                      num_workers=2))
    c = fastdata.Loader(shards["hdf5"], device="cpu", channels_last=True, num_workers=2, **kw)
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


@pytest.mark.parametrize("kw, match", [
    ({"backend": "jax"}, "backend='jax' is not valid; choose one of torch"),
    ({"batch_size": 0}, "batch_size=0"),
    ({"size": 64}, "size 64 is not stored.*16, 32"),
    ({"size": 20}, "not a power of two"),
    ({"dtype": "int4"}, "dtype='int4' is not valid; choose one of float32"),
    ({"seed": "a"}, "seed='a' is not valid; use an integer >= 0"),
    ({"seed": -1}, "seed=-1 is not valid"),
    ({"rank": 2, "world_size": 2}, "rank=2 is not valid for world_size=2"),
    ({"device": "tpu"}, "device"),
    ({"num_workers": -1}, "num_workers=-1"),
    ({"backend": fastdata.TorchBackend(), "num_workers": 2},
     r"num_workers given beside backend=TorchBackend\(\): give them to the backend"),
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


@pytest.mark.parametrize("kw, match", [
    ({"workers": "fiber"}, "workers='fiber' is not valid; choose one of thread, process"),
    ({"mp_context": "clone"}, "mp_context='clone' is not valid; choose one of fork, spawn"),
    ({"jpeg_decode": "nvjpeg"}, "jpeg_decode='nvjpeg' is not valid; choose one of auto"),
    ({"num_workers": -1}, "num_workers=-1 is not valid"),
    ({"prefetch": 0}, "prefetch=0 is not valid; use an integer >= 1"),
])
def test_bad_backend_options(kw, match):
    with pytest.raises(ValueError, match=match):
        fastdata.TorchBackend(**kw)


def test_one_backend_configures_several_loaders_each_with_its_own_workers(shards):
    """The instance is options: each loader binds its own copy (its threads, its processes)."""
    backend = fastdata.TorchBackend(workers="process", num_workers=2)
    a, b = (plain_loader(shards["hdf5"], backend=backend, train=t) for t in (True, False))
    assert a.backend is not b.backend and a.backend.host is not b.backend.host
    assert len(list(a)) == len(a) and len(list(b)) == len(b)
    assert a.backend.processes == 2 and repr(backend) in repr(a)
    a.close()
    assert len(list(b)) == len(b)        # closing one loader leaves the other's workers
    b.close()


@pytest.mark.parametrize("call, match", [
    (lambda ld: ld.set_epoch(-1), "epoch=-1 is not valid; use an integer >= 0"),
    (lambda ld: ld.set_epoch("1"), "epoch='1' is not valid"),    # both failed only later
    (lambda ld: ld.load_state_dict({"epoch": 3}), "not a Loader.state_dict()"),  # KeyError
    (lambda ld: ld.load_state_dict({"order": {"epoch": 3}, "size": 16}), "not a loader state"),
    # a crop no batch of which fits in memory: refused, not allocated
    (lambda ld: ld.load_state_dict({**ld.state_dict(), "crop": 10**6}),
     r"crop=1000000 needs [\d,.]+ GiB of memory, more than the"),
    (lambda ld: ld.load_state_dict({**ld.state_dict(), "order": {
        **ld.state_dict()["order"], "n": "40"}}), "n='40' is not valid"),
])
def test_bad_epoch_and_state_are_named(shards, call, match):
    loader = fastdata.Loader(shards["hdf5"], batch_size=4, device="cpu")
    with pytest.raises(ValueError, match=match):
        call(loader)
    loader.set_epoch(np.int64(2))                       # numpy ints are fine
    assert loader.order.epoch == 2


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
                num_workers=1, progress=False)
    return str(tmp / "jpeg")


def test_jpeg_decode_is_chosen_by_device_and_a_bad_choice_is_named(jpeg_shards, shards):
    assert fastdata.Loader(jpeg_shards, batch_size=2, device="cpu").backend.jpeg_decode == "cpu"
    with pytest.raises(ValueError, match="jpeg_decode='gpu' needs a CUDA device, not cpu"):
        fastdata.Loader(jpeg_shards, batch_size=2, device="cpu",
                        backend=fastdata.TorchBackend(jpeg_decode="gpu"))
    with pytest.raises(ValueError, match="this set stores raw"):
        fastdata.Loader(shards["hdf5"], batch_size=2, device="cpu",
                        backend=fastdata.TorchBackend(jpeg_decode="gpu"))
    with pytest.raises(ValueError, match="jpeg_decode='nvjpeg' is not valid; choose one of "
                                         "auto, cpu, gpu"):
        fastdata.Loader(jpeg_shards, batch_size=2, device="cpu",
                        backend=fastdata.TorchBackend(jpeg_decode="nvjpeg"))


@pytest.mark.gpu
@pytest.mark.parametrize("workers", ["thread", "process"])
def test_jpeg_shards_decoded_on_the_gpu_match_the_cpu_decode(jpeg_shards, workers):
    """nvJPEG and libjpeg-turbo need not give the same pixels (their upsampling of colour and
    their rounding differ): each must be about as close to the encoded pixels as the other."""
    from fastdata.loader.decode import gpu_jpeg_available

    ok, why = gpu_jpeg_available()
    if not ok:
        pytest.skip(why)
    kw = dict(batch_size=4, device="cuda", dtype=torch.uint8, train=False)

    def backend(decode="auto"):
        return fastdata.TorchBackend(num_workers=2, workers=workers, jpeg_decode=decode)

    gpu = fastdata.Loader(jpeg_shards, backend=backend("auto"), **kw)
    cpu = fastdata.Loader(jpeg_shards, backend=backend("cpu"), **kw)
    raw = fastdata.Loader(os.path.join(os.path.dirname(jpeg_shards), "raw"), backend=backend(),
                          **kw)
    assert gpu.backend.jpeg_decode == "gpu"
    for (a, la), (b, lb), (c, lc) in zip(gpu, cpu, raw):
        assert torch.equal(la, lb) and torch.equal(la, lc) and a.shape == b.shape == c.shape
        off_gpu, off_cpu, apart = ((u.float() - v.float()).abs().mean().item()
                                   for u, v in ((a, c), (b, c), (a, b)))
        assert off_gpu <= 2 * off_cpu + 2, (off_gpu, off_cpu, apart)


def test_an_evaluation_loader_with_a_random_batch_transform_says_so_once(shards):
    from fastdata import transforms as T

    kw = dict(batch_size=4, size=16, device="cpu", train=False)
    with pytest.warns(UserWarning, match=r"evaluation loader \(train=False\)") as caught:
        loader = fastdata.Loader(shards["hdf5"], batch_transform=T.ColorJitter(0.4), **kw)
        list(loader)
        list(loader)
    assert len([w for w in caught if "evaluation loader" in str(w.message)]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # a transform that draws nothing: no warning
        fastdata.Loader(shards["hdf5"], batch_transform=lambda x, y: (x, y), **kw)
        fastdata.Loader(shards["hdf5"], batch_transform=T.ColorJitter(0.4), batch_size=4,
                        size=16, device="cpu", train=True)


def _raises_on_red(image, rng):
    if image[..., 0].mean() > image[..., 2].mean():
        raise RuntimeError("no red images here")
    return image


def _wrong_size(image, rng):
    return image[:8]


@pytest.mark.parametrize("workers", ["thread", "process"])
def test_a_failing_sample_transform_names_the_sample_and_its_shard(shards, workers):
    """Its error named neither the sample nor the shard."""
    kw = dict(batch_size=4, size=16, device="cpu", train=False,
              backend=fastdata.TorchBackend(num_workers=1, workers=workers))
    ds = fastdata.open(shards["hdf5"])
    shard = r"shard-0000\d\.h5, its sample \d"
    with pytest.raises(RuntimeError, match="no red images here") as e:
        list(fastdata.Loader(ds, sample_transform=_raises_on_red, **kw))
    assert re.search(rf"on sample \d+ \({shard}\)", str(e.value) + "".join(
        getattr(e.value, "__notes__", []))), e.value
    with pytest.raises(ValueError, match=rf"shape \(8, 16, 3\) for sample 0 \({shard}\)"):
        list(fastdata.Loader(ds, sample_transform=_wrong_size, **kw))


_RELEASE = threading.Event()


def _hangs_on_red(image, rng):
    if image[..., 0].mean() > image[..., 2].mean():
        _RELEASE.wait(60)           # a hook that does not return (let go at the test's end)
    return image


@pytest.mark.parametrize("backend,workers", [("torch", "thread"), ("torch", "process"),
                                             ("dali", "thread")])
def test_a_hook_that_hangs_meets_the_deadline_naming_the_batch(shards, backend, workers):
    """A sample_transform that never returned hung the loader for good."""
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    kw = dict(backend=backend_of(backend, workers), batch_size=4, size=16, device="cpu",
              train=False)
    assert len(list(fastdata.Loader(shards["hdf5"], timeout=5, **kw))) == 6   # in time
    _RELEASE.clear()
    loader = fastdata.Loader(shards["hdf5"], sample_transform=_hangs_on_red, timeout=0.05,
                             **kw)
    started = time.monotonic()
    try:
        with pytest.raises((TimeoutError, RuntimeError),
                           match=r"took more than 0.2 s \(timeout=0.05 s an image\)") as e:
            list(loader)
    finally:
        _RELEASE.set()
    assert time.monotonic() - started < 30
    named = r"sample \d+ \(shard-0000\d\.h5, its sample \d\)"
    if workers == "thread":        # both backends' reader threads name the sample
        assert re.search(rf"sample_transform has not returned on {named}", str(e.value))
    else:
        assert re.search(rf"its first sample: {named}", str(e.value))
    loader.close()
