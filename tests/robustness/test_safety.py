"""Hostile or damaged inputs: checkpoints, shard sets, output folders and source files that a
user downloaded or shares. Each is refused with a reason; nothing runs code, is read or written
outside what fastdata owns, hangs, or kills the process."""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import h5py
import numpy as np
import pytest
import torch

import fastdata
from fastdata.cli import main as cli
from fastdata.converters import decode
from fastdata.converters import pool as pool_mod
from fastdata.converters.convert import convert
from fastdata.format import ShardFormatError
from fastdata.outdir import FolderBusyError, FolderLock
from fastdata.shards.verify import verify
from fastdata.train import TrainStep, fit
from fastdata.train.models import SmallResNet
from tests.helpers import PEAK_KIB, plain_folder, smooth

CLI = [sys.executable, "-m", "fastdata.cli"]


def run_cli(*args, timeout=120):
    return subprocess.run([*CLI, "-q", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def one_line_error(r, *words):
    """A CLI run that failed with one line naming ``words``, and no traceback."""
    lines = r.stderr.strip().splitlines()
    return (r.returncode != 0 and len(lines) == 1 and "Traceback" not in r.stderr
            and all(w in r.stderr for w in words)), r.stderr


@pytest.fixture
def small_set(tmp_path):
    src = plain_folder(tmp_path / "src", per_class=4)
    out = tmp_path / "set"
    convert(src, str(out), sizes=[8], shard_size=5, num_workers=1, progress=False)
    return out


def edit_manifest(out, change):
    path = out / "manifest.json"
    m = json.loads(path.read_text())
    change(m)
    path.write_text(json.dumps(m))


# ------------------------------------------------------------------ checkpoints

class _RunsCode:
    """Unpickled, it would write a file: what a crafted checkpoint does with any command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def _step_and_loader(shard_set):
    torch.manual_seed(0)
    model = SmallResNet(3, width=8, blocks=(1, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = fastdata.Loader(shard_set, batch_size=4, device="cpu", num_workers=0)
    return TrainStep(model, opt, precision="fp32"), loader


def test_a_checkpoint_that_would_run_code_is_refused_before_it_runs(small_set, tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    marker = tmp_path / "ran"
    torch.save({"model": _RunsCode(str(marker)), "optimizer": {}, "step": {}, "epoch": 0},
               ck / "last.pt")
    step, loader = _step_and_loader(small_set)
    with pytest.raises(ValueError, match=r"last.pt cannot be read as a checkpoint .*Unpickl"):
        fit(step, loader, epochs=1, checkpoint_dir=str(ck), log_every=0)
    assert not marker.exists()          # weights_only=False ran it, then refused the resume
    # what fit saves itself loads back (tensors and plain types only)
    os.remove(ck / "last.pt")
    fit(step, loader, epochs=1, checkpoint_dir=str(ck), log_every=0)
    step, loader = _step_and_loader(small_set)
    assert fit(step, loader, epochs=2, checkpoint_dir=str(ck), log_every=0)[0]["epoch"] == 1


def test_two_runs_never_share_a_checkpoint_folder(small_set, tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    with FolderLock(str(ck), "fastdata train"):     # as a first run holds it
        step, loader = _step_and_loader(small_set)
        with pytest.raises(FolderBusyError, match=rf"in use by another fastdata train \(pid "
                                                  rf"{os.getpid()} "):
            fit(step, loader, epochs=1, checkpoint_dir=str(ck), log_every=0)
        r = run_cli("train", small_set, "--checkpoint", ck, "--epochs", "1", "--device", "cpu",
                    "--batch-size", "4", timeout=300)
        assert one_line_error(r, str(ck), "in use by another fastdata train")
        assert not (ck / "last.pt").exists()
    fit(step, loader, epochs=1, checkpoint_dir=str(ck), log_every=0)     # free again
    assert sorted(os.listdir(ck)) == ["last.pt", "log-rank0.jsonl"]


# ------------------------------------------------------------------ output folders

def test_overwrite_removes_only_the_files_fastdata_wrote(tmp_path, caplog):
    out = tmp_path / "out"
    src = plain_folder(out / "shard-images", per_class=3)   # the source inside OUT, at a name
    convert(src, str(tmp_path / "first"), sizes=[8], shard_size=2, progress=False)
    for name in os.listdir(tmp_path / "first"):             # a set there before
        os.rename(tmp_path / "first" / name, out / name)
    (out / "shard-notes").mkdir()
    (out / "shard-notes" / "todo.txt").write_text("mine")
    (out / "manifest.json.bak").write_text("mine")
    (out / "shard-00099.h5.txt").write_text("mine")
    caplog.set_level(logging.INFO, "fastdata")
    m = convert(src, str(out), sizes=[8], shard_size=4, overwrite=True, progress=False)
    assert (out / "shard-notes" / "todo.txt").read_text() == "mine"
    assert (out / "manifest.json.bak").read_text() == "mine"
    assert (out / "shard-00099.h5.txt").read_text() == "mine"
    assert len(os.listdir(src)) == 3 and fastdata.open(out).manifest == m
    assert sorted(n for n in os.listdir(out) if n.endswith(".h5")) == [
        "shard-00000.h5", "shard-00001.h5", "shard-00002.h5"]
    assert "--overwrite removed 6 files fastdata had written" in caplog.text
    assert "left 4 entries" in caplog.text


def test_links_planted_in_out_are_never_written_through(tmp_path, folder):
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"precious" * 100)
    out = tmp_path / "out"
    convert(folder, str(out), sizes=[8], shard_size=4, progress=False)
    for name in os.listdir(out):        # as an interrupted conversion leaves it
        if name != "shard-00000.h5":
            os.remove(out / name)
    # links at the temporary names of every version, and a regular leftover
    for name in ("shard-00001.h5.tmp", "shard-00001.h5.tmp.part", "shard-00002.h5.tmp-abcdefgh",
                 "manifest.json.tmp-123"):
        os.symlink(victim, out / name)
    (out / "shard-00003.h5.tmp-leftover").write_bytes(b"half a shard")
    m = convert(folder, str(out), sizes=[8], shard_size=4, resume=True, progress=False)
    assert victim.read_bytes() == b"precious" * 100
    assert all(os.path.islink(out / n) for n in ("shard-00001.h5.tmp", "manifest.json.tmp-123"))
    assert not (out / "shard-00003.h5.tmp-leftover").exists()
    assert verify(str(out)) == [] and m["num_samples"] == 21
    # a link at a name the set's files have is refused, not read through or replaced
    os.remove(out / "manifest.json")
    os.remove(out / "shard-00000.h5")
    os.symlink(victim, out / "shard-00000.h5")
    for kw in (dict(resume=True), dict(overwrite=True)):
        with pytest.raises(ValueError, match="shard-00000.h5 is not a file fastdata wrote"):
            convert(folder, str(out), sizes=[8], shard_size=4, progress=False, **kw)
    assert os.path.islink(out / "shard-00000.h5") and victim.read_bytes() == b"precious" * 100


def test_two_conversions_into_one_folder_at_once(tmp_path, folder):
    out = tmp_path / "out"
    out.mkdir()
    with FolderLock(str(out), "fastdata convert"):      # as a running conversion holds it
        r = run_cli("convert", folder, out, "--size", "8")
        assert one_line_error(r, str(out), "in use by another fastdata convert",
                              f"pid {os.getpid()}")
        assert os.listdir(out) == [".fastdata.lock"]
    # a holder that was killed holds nothing: the kernel dropped its lock
    holder = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import os
        from fastdata.outdir import FolderLock
        FolderLock({str(out)!r}, "fastdata convert").acquire()
        os.kill(os.getpid(), 9)""")], timeout=60)
    assert holder.returncode == -signal.SIGKILL and (out / ".fastdata.lock").exists()
    assert run_cli("convert", folder, out, "--size", "8").returncode == 0
    assert ".fastdata.lock" not in os.listdir(out)


# ------------------------------------------------------------------ shard sets

def test_a_shard_file_outside_the_set_is_refused(tmp_path, small_set, folder):
    other = tmp_path / "other"
    convert(folder, str(other), sizes=[8], shard_size=5, progress=False)
    for bad in ("../other/shard-00000.h5", str(other / "shard-00000.h5"), "shard-00000.h5/..",
                "manifest.json"):
        edit_manifest(small_set, lambda m: m["shards"][0].update(file=bad))
        with pytest.raises(ShardFormatError, match=r"manifest.json: field shards\[0\].file"):
            fastdata.open(small_set)
        for cmd in ("info", "verify"):
            assert one_line_error(run_cli(cmd, small_set), "shards[0].file")
        with pytest.raises(ShardFormatError):
            fastdata.Loader(small_set, batch_size=2, device="cpu")
    edit_manifest(small_set, lambda m: m["shards"][0].update(file="shard-00000.h5"))
    os.remove(small_set / "shard-00000.h5")         # a link out of the folder
    os.symlink(other / "shard-00000.h5", small_set / "shard-00000.h5")
    with pytest.raises(ShardFormatError, match="is a link to .*other/shard-00000.h5, outside"):
        fastdata.open(small_set)
    os.remove(small_set / "shard-00000.h5")         # a FIFO
    os.mkfifo(small_set / "shard-00000.h5")
    assert one_line_error(run_cli("verify", small_set, timeout=60), "not a regular file")


def _external(shard, how, target):
    """Make ``images/8`` of ``shard`` read ``target`` (another shard, or a FIFO)."""
    with h5py.File(shard, "r+") as f:
        shape = f["images/8"].shape
        del f["images/8"]
        if how == "external storage":
            f.create_dataset("images/8", shape, np.uint8,
                             external=[(str(target), 0, int(np.prod(shape)))])
        elif how == "external link":
            f["images/8"] = h5py.ExternalLink(str(target), "images/8")
        else:
            layout = h5py.VirtualLayout(shape, np.uint8)
            layout[:] = h5py.VirtualSource(str(target), "images/8", shape)
            f.create_virtual_dataset("images/8", layout)


@pytest.mark.parametrize("how", ["external storage", "external link", "virtual dataset"])
def test_hdf5_datasets_stored_in_another_file_are_refused(tmp_path, small_set, how):
    target = tmp_path / "elsewhere.h5"
    if how == "external storage":
        os.mkfifo(target)       # reading it would block every command below
    else:
        with h5py.File(target, "w") as f:
            f.create_dataset("images/8", (5, 8, 8, 3), np.uint8)
    _external(small_set / "shard-00000.h5", how, target)
    for cmd in ("info", "verify"):
        r = run_cli(cmd, small_set, timeout=60)
        text = r.stdout + r.stderr
        assert r.returncode != 0 and "shard-00000.h5" in text and "Traceback" not in text, text
        assert ("not stored contiguously" in text or "ExternalLink" in text), text
    read = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import fastdata
        try:
            for _ in fastdata.Loader({str(small_set)!r}, batch_size=2, device="cpu"):
                pass
        except OSError as e:
            print("refused", e)""")], capture_output=True, text=True, timeout=60)
    assert read.stdout.startswith("refused") and "shard-00000.h5" in read.stdout, read


@pytest.mark.parametrize("damage,where", [
    (lambda m: m.update(num_samples=m["num_samples"] + 1), "field num_samples"),
    (lambda m: m["shards"][1].update(start=m["shards"][1]["start"] + 1), r"shards\[1\].start"),
    (lambda m: m["shards"][1].update(count=-3), r"shards\[1\].count"),
    # without class_counts, which would not add up (a hostile manifest leaves it out)
    (lambda m: (m["shards"][-1].update(count=2**40), m.update(num_samples=2**40 + 10),
                m.pop("class_counts")),
     "cannot hold the 1099511627776 samples"),
    (lambda m: m["shards"][0].update(count=4), "shards"),
])
def test_a_manifest_at_odds_with_its_shards_is_named(small_set, damage, where):
    edit_manifest(small_set, damage)
    try:
        ds = fastdata.open(small_set)
    except ShardFormatError as e:
        assert "manifest.json" in str(e) and __import__("re").search(where, str(e))
    else:       # consistent by itself: the shards disagree, found at the first read
        with pytest.raises(OSError, match="shard-00000.h5.*says 5 samples, the manifest 4"):
            fastdata.Loader(ds, batch_size=2, device="cpu")
    r = run_cli("verify", small_set)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "shard-0000" in r.stdout + r.stderr or "manifest.json" in r.stderr


def test_a_count_no_memory_holds_is_refused_not_allocated(small_set):
    """A count its altered bytes allow: the loader refuses an epoch's order that does not fit
    in the memory available, and verify names the shard."""
    edit_manifest(small_set, lambda m: (m["shards"][-1].update(count=10**11, bytes=10**15),
                                        m.update(num_samples=10**11 + 10),
                                        m.pop("class_counts")))
    with pytest.raises(ValueError, match=r"an epoch of 100000000010 samples needs [\d,.]+ GiB "
                                         r"of memory, more than the [\d,.]+ GiB available: "
                                         r"check the set's manifest with `fastdata verify"):
        fastdata.Loader(small_set, batch_size=2, device="cpu")
    r = run_cli("verify", small_set)
    assert r.returncode == 1 and "DAMAGED shard-00002.h5" in r.stdout, r.stdout + r.stderr


def test_a_shard_copied_over_another_is_refused_as_it_opens(small_set):
    """Shard 0's file in place of shard 1's, the manifest's entry made to match it: its own
    start says which it is."""
    import shutil

    shutil.copy(small_set / "shard-00000.h5", small_set / "shard-00001.h5")
    edit_manifest(small_set, lambda m: m["shards"][1].update(
        {k: m["shards"][0][k] for k in ("bytes", "sha256")}))
    with pytest.raises(OSError, match="shard-00001.h5.*starts at sample 0, the manifest 5"):
        fastdata.open(small_set).read_batch([5])


def test_labels_beyond_the_classes_are_found_by_verify(small_set):
    edit_manifest(small_set, lambda m: (m.update(classes=m["classes"][:2]),  # cut short
                                        m.pop("class_counts")))
    r = run_cli("verify", small_set)
    assert r.returncode == 1 and "label 2 is outside the manifest's 2 classes" in r.stdout
    with pytest.raises(OSError, match="labels are damaged"):
        for _ in fastdata.Loader(small_set, batch_size=2, device="cpu"):
            pass


FIELDS = ["container", "encoding", "fit", "sizes", "classes", "num_samples", "shards",
          "skipped", "ignored", "empty_classes", "source"]


@pytest.mark.parametrize("field", FIELDS)
def test_a_malformed_manifest_is_one_line_naming_the_field(small_set, field):
    for value in (None, 7, "x", [], {}, [{"path": 1}]):
        edit_manifest(small_set, lambda m: m.update({field: value}))
        try:
            fastdata.open(small_set)
        except ShardFormatError as e:
            assert str(small_set / "manifest.json") in str(e) and field in str(e)
            for cmd in ("info", "verify"):
                assert one_line_error(run_cli(cmd, small_set), "manifest.json", field)
        else:       # a value the field may take
            assert (field, value) in (("skipped", []), ("empty_classes", []),
                                      ("source", "x"), ("ignored", {}))
    edit_manifest(small_set, lambda m: m.pop(field))
    with pytest.raises(ShardFormatError, match=field):
        fastdata.open(small_set)


@pytest.mark.parametrize("container", ["hdf5", "lmdb"])
def test_damaged_shard_metadata_names_the_shard(tmp_path, folder, container):
    out = tmp_path / "o"
    convert(folder, str(out), container=container, sizes=[8], shard_size=5, progress=False)
    shard = out / ("shard-00001.h5" if container == "hdf5" else "shard-00001.lmdb")
    for meta in ('{"index": 1}', "[]", "not json", '{"count": "5"}'):
        if container == "hdf5":
            with h5py.File(shard, "r+") as f:
                f.attrs["meta"] = meta
        else:
            subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
                import lmdb
                with lmdb.open({str(shard)!r}, subdir=False, lock=False) as env:
                    with env.begin(write=True) as txn:
                        txn.put(b"__meta__", {meta.encode()!r})""")], check=True, timeout=60)
        with pytest.raises(OSError, match=rf"cannot open shard .*{shard.name}: .*metadata"):
            fastdata.open(out).read_batch([7])
        r = run_cli("verify", out)
        assert r.returncode == 1 and f"DAMAGED {shard.name}: unreadable" in r.stdout


@pytest.mark.parametrize("container,workers", [("hdf5", "thread"), ("lmdb", "thread"),
                                               ("hdf5", "process"), ("lmdb", "process"),
                                               ("hdf5", "dali")])
@pytest.mark.parametrize("when", ["between passes", "with batches in flight"])
def test_a_shard_cut_short_while_a_loader_reads_it_is_an_oserror(tmp_path, folder, container,
                                                                 workers, when):
    """It was SIGBUS (threads: the process died) or torch's "insufficient shared memory". Cut
    short with batches in flight, the pages they still read come from a map past the file's
    end: with the C extension, they read zeros and the batch is an OSError all the same, on
    the DALI backend too (it reads through the same host stage)."""
    if when != "between passes" and fastdata.kernels.guard() is None:
        pytest.skip("fastdata's C extension is not built: no map guard")
    if workers == "dali":
        pytest.importorskip("nvidia.dali", reason="DALI not installed")
    backend = ("fastdata.DaliBackend(num_workers=2, prefetch=4)" if workers == "dali" else
               f"fastdata.TorchBackend(workers={workers!r}, num_workers=2, prefetch=4)")
    out = tmp_path / "o"
    convert(folder, str(out), container=container, sizes=[64], shard_size=21, progress=False)
    script = textwrap.dedent(f"""
        import os, fastdata
        loader = fastdata.Loader({str(out)!r}, batch_size=2, device="cpu", shuffle=False,
                                 backend={backend})
        shard = loader.dataset.shards[0].path
        if {when!r} == "between passes":
            for _ in loader:    # its maps open
                pass
            os.truncate(shard, 4096)
            it = iter(loader)
        else:
            it = iter(loader)
            next(it)            # the other batches are being read now
            os.truncate(shard, 4096)
        try:
            for _ in it:
                pass
            for _ in loader:
                pass
        except OSError as e:
            print("OSError", e)
        """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.startswith("OSError") and "shard-00000" in r.stdout, r.stdout


def test_a_shard_rewritten_while_read_is_an_oserror(small_set):
    ds = fastdata.open(small_set)
    before = ds.read_batch([0, 1])
    shard = small_set / "shard-00000.h5"
    data = bytearray(shard.read_bytes())
    with open(shard, "r+b") as f:       # rewritten in place, the same size
        f.write(bytes(data))
    os.utime(shard, ns=(time.time_ns(), time.time_ns() + 10**9))
    with pytest.raises(OSError, match="shard-00000.h5 changed while it was read"):
        ds.read_batch([0, 1])
    assert np.array_equal(fastdata.open(small_set).read_batch([0, 1]), before)


# ------------------------------------------------------------------ source folders

def test_a_hung_decode_worker_is_noticed_per_image_not_per_batch(tmp_path, monkeypatch):
    """Batches of 16 images at 8 px: noticed after one image's deadline, not 16 of them."""
    src = plain_folder(tmp_path / "src", per_class=12)
    os.rename(os.path.join(src, "a", "img_001.jpg"), os.path.join(src, "a", "hang.jpg"))
    real = decode.prepare

    def prepare(path, opts, *args):
        if path.endswith("hang.jpg"):
            time.sleep(3600)
        return real(path, opts, *args)
    monkeypatch.setattr(decode, "prepare", prepare)            # inherited by forked workers
    monkeypatch.setattr(pool_mod, "ITEM_TIMEOUT_S", 2.0)
    monkeypatch.setattr(pool_mod, "POLL_S", 0.2)
    assert pool_mod.batch_size((8,)) == 16
    t0 = time.monotonic()
    m = convert(src, str(tmp_path / "o"), sizes=[8], num_workers=1, progress=False)
    took = time.monotonic() - t0
    assert [s["path"] for s in m["skipped"]] == ["a/hang.jpg"] and m["num_samples"] == 35
    assert took < 16 * 2.0, took        # a batch's deadline was 16 images' (32 s, then again)


def test_huge_special_and_non_image_files_are_skipped_unread(tmp_path):
    src = plain_folder(tmp_path / "src", per_class=2)
    with open(os.path.join(src, "a", "huge.jpg"), "wb") as f:   # 3 GiB, sparse, a JPEG's start
        f.write(b"\xff\xd8\xff\xe0")
        f.truncate(3 << 30)
    with open(os.path.join(src, "a", "sparse.png"), "wb") as f:
        f.truncate(3 << 30)
    with open(os.path.join(src, "b", "page.png"), "w") as f:
        f.write("<html>" * 1000)
    os.mkfifo(os.path.join(src, "b", "pipe.jpg"))
    with pytest.raises(ValueError, match="not a regular file"):
        decode._read(os.path.join(src, "b", "pipe.jpg"))         # and it did not block
    script = PEAK_KIB + (f"import sys\nfrom fastdata.cli import main\n"
                         f"rc = main(['convert', {src!r}, {str(tmp_path / 'o')!r}, '--size', "
                         f"'8'])\nprint(peak_kib())\nsys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    rss = int(r.stdout.split()[-1]) << 10   # the conversion's and its workers' peak
    assert rss < 1 << 30, rss           # was 6.3 GB, the huge files read whole
    m = fastdata.open(tmp_path / "o").manifest
    reasons = {s["path"]: s["reason"] for s in m["skipped"]}
    assert "file too large (3.0 GiB" in reasons["a/huge.jpg"]
    assert "file too large" in reasons["a/sparse.png"]
    assert "not an image: its first bytes match no image format" in reasons["b/page.png"]
    assert "3c 68" not in json.dumps(m) and "<html>" not in json.dumps(m)
    assert m["ignored"] == {"not a regular file": 1} and m["num_samples"] == 6


def test_lmdb_shards_take_the_disk_their_data_needs(tmp_path, folder):
    """A file size limit of 2 MiB (as a small disk): the LMDB writer allocated 64 MiB and
    1.5x the data up front, and failed."""
    script = textwrap.dedent(f"""
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 20, 2 << 20))
        from fastdata.cli import main
        sys.exit(main(["-q", "convert", {folder!r}, {str(tmp_path / "o")!r}, "--container",
                       "lmdb", "--size", "8,32"]))
        """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert verify(str(tmp_path / "o")) == []


def test_a_manifest_that_does_not_fit_on_the_disk_leaves_nothing_behind(tmp_path, folder,
                                                                        monkeypatch):
    out = tmp_path / "o"
    real = os.fsync

    def full(fd):
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(out / "manifest.json")):
            raise OSError(28, "No space left on device")
        return real(fd)
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match=r"no space left on the device to write .*manifest.json"):
        convert(folder, str(out), sizes=[8], shard_size=5, progress=False)
    monkeypatch.setattr(os, "fsync", real)
    assert not [n for n in os.listdir(out) if "tmp" in n]
    (out / "manifest.json.tmp-4242").write_text("{")        # a killed run's, to clean up
    convert(folder, str(out), sizes=[8], shard_size=5, resume=True, progress=False)
    assert not [n for n in os.listdir(out) if "tmp" in n]
    assert verify(str(out)) == []


def test_escape_sequences_in_names_are_printed_escaped(tmp_path, capsys):
    src = tmp_path / "src"
    evil = "cls\x1b]0;pwned\x07\x1b[2J"
    os.makedirs(src / evil)
    smooth(20, 20, 1).save(src / evil / "a.png")
    with open(src / evil / "b\x1b[31m.png", "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n broken")
    convert(str(src), str(tmp_path / "o"), sizes=[8], progress=False)
    capsys.readouterr()
    assert cli(["info", str(tmp_path / "o")]) == 0
    shown = capsys.readouterr().out
    assert "\x1b" not in shown and "\x07" not in shown
    assert "cls\\x1b]0;pwned\\x07\\x1b[2J" in shown and "b\\x1b[31m.png" in shown


def test_close_stops_worker_processes_an_iterator_still_holds(small_set):
    import multiprocessing as mp

    before = set(mp.active_children())          # other tests' loaders may hold some
    loader = fastdata.Loader(small_set, batch_size=2, device="cpu",
                             backend=fastdata.TorchBackend(num_workers=2, workers="process"))
    it = iter(loader)
    next(it)
    workers = [p for p in mp.active_children() if p.is_alive() and p not in before]
    assert len(workers) >= 2
    loader.close()
    for p in workers:
        p.join(10)
    assert not any(p.is_alive() for p in workers)
    with pytest.raises(RuntimeError, match="the loader was closed"):
        next(it)


@pytest.mark.pil
def test_raw_pixels_are_packed_by_whichever_pil_is_installed(tmp_path, monkeypatch):
    """Without the C kernel, raw payloads go through ``_packed_rgb``: a private PIL API that
    Pillow 13 changed (TypeError), after which every image was skipped as unreadable."""
    img = smooth(37, 23, 5)
    for im in (img, img.convert("RGBX")):
        assert decode._packed_rgb(im) == img.tobytes("raw", "RGB")
    monkeypatch.setattr(decode, "_native_pack", lambda: None)
    src = plain_folder(tmp_path / "src", per_class=2)
    m = convert(src, str(tmp_path / "o"), sizes=[8], progress=False)
    assert m["num_samples"] == 6 and not m["skipped"]


def test_a_manifest_beyond_the_cap_is_refused_in_one_line_before_it_is_read(small_set,
                                                                             tmp_path):
    """A manifest near the old 1 GiB cap needed ~4x its size to parse (info --json: a
    MemoryError traceback at 4 GB)."""
    from fastdata.format import MAX_MANIFEST_BYTES

    big = tmp_path / "big"
    shutil.copytree(small_set, big)
    with open(big / "manifest.json", "r+b") as f:       # sparse: nothing is written
        f.truncate(MAX_MANIFEST_BYTES + 1)
    r = subprocess.run([*CLI, "info", "--json", str(big)], capture_output=True, text=True,
                       timeout=120)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "more than a manifest of fastdata's can be" in lines[0]
    assert MAX_MANIFEST_BYTES <= 256 << 20
