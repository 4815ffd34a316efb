"""Resume after a real SIGKILL; verify catches a single flipped byte and names the sample."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import weakref

import pytest

import fastdata
import fastdata.shards.set
from fastdata._optional import available
from fastdata.cli import main as cli
from fastdata.converters import writers
from fastdata.converters.convert import convert
from fastdata.shards.verify import verify
from tests.helpers import REPO, children, cold_read_cost, in_private_mounts, plain_folder, running

# A converting child that is slow per image, so it can be killed between shard writes.
CHILD = """
import sys, time
from fastdata.converters import decode
from fastdata.converters.convert import convert
real = decode.prepare
decode.prepare = lambda p, o, *a: (time.sleep(0.05), real(p, o, *a))[1]
convert(sys.argv[1], sys.argv[2], container=sys.argv[3], encoding=sys.argv[4], sizes=[8, 16],
        shard_size=4, num_workers=1, progress=False)
"""


@pytest.mark.parametrize("container,encoding,sig", [("hdf5", "raw", signal.SIGKILL),
                                                    ("lmdb", "jpeg", signal.SIGKILL),
                                                    ("hdf5", "raw", signal.SIGINT)])
def test_resume_after_kill_or_ctrl_c_matches_uninterrupted(tmp_path, container, encoding, sig):
    src = plain_folder(tmp_path / "src", per_class=8)
    out = tmp_path / "killed"
    repo = REPO
    with open(tmp_path / "stderr", "w") as err:     # a file: no pipe for the workers to hold
        proc = subprocess.Popen([sys.executable, "-c", CHILD, src, str(out), container,
                                 encoding], cwd=repo,
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                    filter(None, [repo, os.environ.get("PYTHONPATH")]))},
                                stderr=err)
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        names = os.listdir(out) if out.exists() else []
        if len([n for n in names if n.startswith("shard-") and not n.endswith(".tmp")]) >= 2:
            break
        time.sleep(0.02)
    assert proc.poll() is None, ("the child finished before it could be killed:\n"
                                 + (tmp_path / "stderr").read_text())
    workers = children(proc.pid)
    assert workers, "the converter has no worker process"
    proc.send_signal(sig)
    proc.wait(timeout=60)
    deadline = time.time() + 20             # orphaned workers leave too
    while time.time() < deadline and any(map(running, workers)):
        time.sleep(0.05)
    assert not any(map(running, workers)), f"workers {workers} outlived the converter"
    assert not (out / "manifest.json").exists()
    if sig == signal.SIGINT:        # stops at once, says how to go on
        text = (tmp_path / "stderr").read_text()
        assert "interrupted" in text and "--resume" in text, text
        assert not [n for n in os.listdir(out) if n.endswith(".tmp")]  # the partial shard
    done_before = sorted(n for n in os.listdir(out) if not n.endswith(".tmp"))
    assert 2 <= len(done_before) < 6
    with pytest.raises(fastdata.format.ShardFormatError, match="did not finish: finish it with"):
        fastdata.open(out)

    resumed = convert(src, str(out), container=container, encoding=encoding, sizes=[8, 16],
                      shard_size=4, num_workers=1, resume=True, progress=False)
    clean = convert(src, str(tmp_path / "clean"), container=container, encoding=encoding,
                    sizes=[8, 16], shard_size=4, num_workers=1, progress=False)
    assert resumed == clean        # same order, same shards, same checksums, whole manifest
    assert sorted(os.listdir(out)) == sorted(os.listdir(tmp_path / "clean"))
    assert verify(str(out)) == []


def test_ctrl_c_during_a_finalizer_is_not_lost():
    """Python drops a KeyboardInterrupt raised inside a weakref callback ("Exception ignored");
    SigintLatch keeps it (the race let 4 of 10 Ctrl-C's run a conversion on)."""
    from fastdata.interrupt import SigintLatch

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT is not Python's default handler here")

    class Thing:
        pass
    latch = SigintLatch()
    try:
        thing = Thing()
        ref = weakref.ref(thing, lambda r: (os.kill(os.getpid(), signal.SIGINT), time.sleep(0.01)))
        del thing                       # the signal arrives while the callback runs
        assert ref() is None
        with pytest.raises(KeyboardInterrupt):
            latch.check()
    finally:
        latch.restore()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_resume_rejects_other_options(folder, tmp_path):
    out = str(tmp_path / "o")
    convert(folder, out, sizes=[8], shard_size=4, progress=False)
    with pytest.raises(ValueError, match=r"other options or inputs \(sizes \[8\] there, \[16\] "
                                         r"here\)"):
        convert(folder, out, sizes=[16], shard_size=4, resume=True, progress=False)
    with pytest.raises(ValueError, match=r"\(format 'hdf5' there, 'lmdb' here; encoding 'raw' "
                                         r"there, 'jpeg' here; quality None there, 90 here\)"):
        convert(folder, out, sizes=[8], container="lmdb", encoding="jpeg", shard_size=4,
                resume=True, progress=False)
    # unfinished (no manifest): another job's shards were deleted and the run started over
    os.remove(os.path.join(out, "manifest.json"))
    before = sorted(os.listdir(out))
    for kw in (dict(sizes=[16]), dict(sizes=[8], container="lmdb")):
        with pytest.raises(ValueError, match="shard-00000.h5 is from a conversion with other "
                                             "options or inputs"):
            convert(folder, out, **{"shard_size": 4, **kw}, resume=True, progress=False)
        assert sorted(os.listdir(out)) == before
    again = convert(folder, out, sizes=[8], shard_size=4, resume=True, progress=False)
    assert again["num_samples"] == 21


def test_resume_redoes_a_damaged_shard(folder, tmp_path):
    out = tmp_path / "o"
    full = convert(folder, str(out), sizes=[8], shard_size=4, progress=False)
    os.remove(out / "manifest.json")
    _flip(out / "shard-00002.h5")          # damaged: redone, with everything after it
    assert convert(folder, str(out), sizes=[8], shard_size=4, resume=True,
                   progress=False) == full


def test_lmdb_commits_fall_on_the_same_samples_after_a_resume(folder, tmp_path, monkeypatch):
    """A raw LMDB shard is committed every ``COMMIT_BYTES`` counted within the shard, not at
    the decoder's batches (which start elsewhere in a resumed run): the files come out the same,
    byte for byte, as the manifest's sizes say."""
    monkeypatch.setattr(writers, "COMMIT_BYTES", 2 * 3 * (8 * 8 + 32 * 32))    # every 2 samples
    out = tmp_path / "o"
    kw = dict(container="lmdb", sizes=[8, 32], shard_size=5, num_workers=2, progress=False)
    full = convert(folder, str(out), **kw)
    files = {s["file"]: (out / s["file"]).read_bytes() for s in full["shards"]}
    os.remove(out / full["shards"][2]["file"])
    assert convert(folder, str(out), resume=True, **kw) == full
    assert {f: (out / f).read_bytes() for f in files} == files
    assert fastdata.open(out).read_batch(range(full["num_samples"])).shape == (21, 32, 32, 3)


@pytest.mark.parametrize("damage", ["truncate", "remove"])
def test_resume_of_a_finished_set_redoes_a_missing_or_truncated_shard(folder, tmp_path, caplog,
                                                                       damage):
    out = tmp_path / "o"
    full = convert(folder, str(out), container="lmdb", sizes=[8], shard_size=4, progress=False)
    shard = out / full["shards"][3]["file"]
    os.truncate(shard, 4096) if damage == "truncate" else os.remove(shard)
    if damage != "truncate":        # was the OS error (h5py's: a long one) without a way out
        with pytest.raises(FileNotFoundError, match=f"{shard.name} is missing .* --resume"):
            fastdata.open(out).read_batch(range(full["num_samples"]))
    caplog.set_level(logging.INFO, "fastdata")
    assert convert(folder, str(out), container="lmdb", sizes=[8], shard_size=4, resume=True,
                   progress=False) == full          # was "already complete", shard still bad
    assert f"{shard.name} is {'4096 bytes' if damage == 'truncate' else 'missing'}" \
        in caplog.text and "reusing 3 complete shards" in caplog.text
    assert verify(str(out)) == []


@pytest.mark.parametrize("damage", ["{", "[1]"])
def test_a_damaged_manifest_is_named_and_resume_rebuilds_it(folder, tmp_path, caplog, damage):
    out = tmp_path / "o"
    full = convert(folder, str(out), sizes=[8], shard_size=4, progress=False)
    (out / "manifest.json").write_text(damage)
    caplog.set_level(logging.INFO, "fastdata")
    with pytest.raises(fastdata.format.ShardFormatError, match=r"manifest.json: not (readable "
                                                                r"JSON|a fastdata manifest)"):
        fastdata.open(out)        # was json's bare "Expecting property name..." (or a crash)
    assert convert(folder, str(out), sizes=[8], shard_size=4, resume=True,
                   progress=False) == full
    assert "manifest.json is damaged" in caplog.text and "reusing 6 complete shards" in caplog.text


def _flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("container", ["hdf5", "lmdb"])
@pytest.mark.parametrize("encoding", ["raw", "jpeg"])
def test_verify_catches_one_flipped_byte(folder, tmp_path, capsys, container, encoding):
    out = tmp_path / "o"
    full = convert(folder, str(out), container=container, encoding=encoding, sizes=[8, 32],
                   shard_size=5, progress=False)
    assert cli(["-q", "verify", str(out)]) == 0
    ds = fastdata.open(out)
    target = 12                                         # shard 2, local sample 2
    payload = bytes(ds.read_encoded([target], size=32)[0])
    shard = out / ds.manifest["shards"][2]["file"]
    data = bytearray(shard.read_bytes())
    hits, at = [], data.find(payload)
    while at >= 0:
        hits.append(at)
        at = data.find(payload, at + 1)
    assert hits                     # LMDB may also keep a stale copy in a free page: flip all
    for at in hits:
        data[at + len(payload) // 2] ^= 0x10
    shard.write_bytes(bytes(data))
    capsys.readouterr()
    assert cli(["-q", "verify", str(out)]) == 1
    report = capsys.readouterr().out
    assert f"{shard.name} sample {target}: size 32" in report, report
    assert f"  rm -f {shard}\n" in report       # the remedy given works:
    os.remove(shard)
    redone = convert(folder, str(out), container=container, encoding=encoding, sizes=[8, 32],
                     shard_size=5, resume=True, progress=False)
    assert redone == full and verify(str(out)) == []


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="drops pages with posix_fadvise")
def test_verify_reads_lmdb_shards_out_of_the_page_cache_with_readahead(folder, tmp_path,
                                                                       monkeypatch):
    """Read at random, a set larger than memory is mapped without readahead, so a
    shard out of the page cache comes in one 4 KiB fault at a time. Verify reads in file order,
    with readahead, whatever the set's size."""
    monkeypatch.setattr(fastdata.shards.set, "available_memory", lambda: 64 << 10)
    out = tmp_path / "l"
    convert(folder, str(out), container="lmdb", sizes=[64], num_workers=1, progress=False)
    shard = str(out / fastdata.open(out).manifest["shards"][0]["file"])
    pages = os.path.getsize(shard) // 4096
    found: list = []
    faults = cold_read_cost(shard, lambda: found.extend(verify(str(out))))[0]
    assert found == [] and faults <= pages // 4, f"{faults} major faults for {pages} pages"


def test_damaged_shards_fail_loudly_naming_the_file(folder, tmp_path):
    out = tmp_path / "o"
    convert(folder, str(out), encoding="jpeg", sizes=[16], shard_size=5, progress=False)
    ds = fastdata.open(out)
    payload = bytes(ds.read_encoded([7])[0])                  # shard 1, local sample 2
    shard = out / ds.manifest["shards"][1]["file"]
    data = shard.read_bytes()
    assert data.count(payload) == 1
    shard.write_bytes(data.replace(payload, bytes(len(payload))))    # no longer a JPEG
    for workers in ("thread", "process"):   # a worker process's error comes across as it is
        loader = fastdata.Loader(out, batch_size=4, train=False, device="cpu",
                                 backend=fastdata.TorchBackend(num_workers=2, workers=workers))
        for _ in range(2):                  # and again on the next pass, not a hang
            with pytest.raises(OSError, match=f"{shard.name}: sample 2 .* not a readable "
                                              f"JPEG.*fastdata verify"):
                list(loader)
    if available("nvidia.dali")[0]:         # DALI decodes JPEG itself: its error points here
        with pytest.raises(RuntimeError, match=f"fastdata verify {out}"):
            list(fastdata.Loader(out, backend="dali", batch_size=4, train=False, device="cpu"))
    assert fastdata.open(out).read_batch([6, 8]).shape == (2, 16, 16, 3)   # the rest reads
    shard.write_bytes(data[:len(data) // 2])                     # truncated
    with pytest.raises(OSError, match=f"cannot open shard .*{shard.name}"):
        fastdata.open(out).read_batch([7])


@pytest.mark.parametrize("container", ["hdf5", "lmdb"])
def test_truncated_shard_is_named_not_a_crash(folder, tmp_path, container):
    """LMDB maps the whole file: reading past a truncated end was SIGBUS (run in a child)."""
    out = tmp_path / "o"
    convert(folder, str(out), container=container, sizes=[16], shard_size=5, progress=False)
    shard = out / fastdata.open(out).manifest["shards"][1]["file"]
    os.truncate(shard, shard.stat().st_size // 2)
    read = subprocess.run([sys.executable, "-c", "import sys, fastdata\ntry:\n"
                           f"    fastdata.open({str(out)!r}).read_batch([7])\n"
                           "except OSError as e:\n    sys.exit(str(e))"],
                          capture_output=True, text=True, timeout=120)
    assert read.returncode == 1 and shard.name in read.stderr and "truncated" in read.stderr, \
        (read.returncode, read.stderr)
    check = subprocess.run([sys.executable, "-m", "fastdata.cli", "-q", "verify", str(out)],
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 1 and f"DAMAGED {shard.name}: " in check.stdout, \
        (check.returncode, check.stdout, check.stderr)
    assert fastdata.open(out).read_batch([2, 12]).shape == (2, 16, 16, 3)  # the rest reads
    for damage in (b"", b"not a shard" * 1000):
        shard.write_bytes(damage)
        with pytest.raises(OSError, match=f"cannot open shard .*{shard.name}: "):
            fastdata.open(out).read_batch([7])     # was lmdb.Error, a traceback in the CLI


def test_damaged_labels_are_named_not_a_loss_error(folder, tmp_path):
    import h5py

    out = tmp_path / "o"
    convert(folder, str(out), sizes=[8], shard_size=5, progress=False)
    shard = out / "shard-00001.h5"
    with h5py.File(shard, "r+") as f:          # a label outside the classes, as damage makes
        labels = f["labels"][()]
        labels[0] = 99
        f["labels"][...] = labels
    with pytest.raises(OSError, match=f"{shard.name}: its labels are damaged"):
        fastdata.open(out).labels               # was IndexError in the loss, or wrong counts
    assert cli(["-q", "info", str(out)]) == 2   # (info counted only the known classes)


_FULL_DISK = """
mount -t tmpfs -o size=64k tmpfs "$DISK" || exit 99
for fmt in lmdb hdf5; do
    $CLI convert "$SRC" "$DISK/$fmt" --container $fmt --size 16,32 --shard-size 5
    echo "rc $fmt $?"; ls "$DISK/$fmt"
done
mount -o remount,size=256m tmpfs "$DISK"
for fmt in lmdb hdf5; do
    $CLI convert "$SRC" "$DISK/$fmt" --container $fmt --size 16,32 --shard-size 5 --resume
    echo "resumed $fmt $?"
    $CLI verify "$DISK/$fmt"; echo "verify $fmt $?"
done
"""


def test_a_full_disk_is_an_error_and_resume_finishes(folder, tmp_path):
    """A shard that does not fit on the disk (a 64 KiB tmpfs, in a private mount namespace):
    an error naming it, no partial file, and --resume finishes once there is room. (LMDB's
    writer was killed by SIGBUS: it wrote through a map of a sparse file.)"""
    disk = tmp_path / "disk"
    disk.mkdir()
    r = in_private_mounts(_FULL_DISK, {"DISK": str(disk), "SRC": folder}, "tmpfs mount")
    out = r.stdout + r.stderr
    for fmt in ("lmdb", "hdf5"):
        assert f"rc {fmt} 2" in out and f"resumed {fmt} 0" in out and f"verify {fmt} 0" in out
    assert out.count("no space left on the device to write shard-") == 2, out
    assert ".tmp" not in out and "Bus error" not in out


def test_resume_without_options_takes_those_it_was_started_with(folder, tmp_path, caplog):
    out = tmp_path / "o"
    opts = ["--container", "lmdb", "--size", "8,16", "--encoding", "jpeg", "--quality", "80",
            "--fit", "pad", "--shard-size", "5"]
    assert cli(["-q", "convert", folder, str(out), *opts]) == 0
    full = json.loads((out / "manifest.json").read_text())
    caplog.set_level(logging.INFO, "fastdata")
    for gone in (["shard-00004.lmdb"], ["manifest.json", "shard-00003.lmdb", "shard-00004.lmdb"]):
        for name in gone:          # a finished set missing a shard; then an unfinished one
            os.remove(out / name)
        caplog.clear()
        assert cli(["convert", folder, str(out), "--resume"]) == 0
        where = "manifest.json" if len(gone) == 1 else "shard-00000.lmdb"
        assert f"resuming with the options recorded in {out / where}: --container lmdb --size " \
               f"8,16 --encoding jpeg --quality 80 --fit pad --shard-size 5" in caplog.text
        assert json.loads((out / "manifest.json").read_text()) == full
    assert cli(["-q", "convert", folder, str(out), "--resume", "--size", "8"]) == 2  # given: used


def test_verify_prints_the_commands_that_repair_the_set(folder, tmp_path, capsys):
    import shlex

    import h5py

    out = tmp_path / "o"
    convert(folder, str(out), sizes=[8], shard_size=5, progress=False)
    with h5py.File(out / "shard-00001.h5", "r") as f:
        offset = f["images/8"].id.get_offset() + 10
    with open(out / "shard-00001.h5", "r+b") as f:      # a flipped pixel byte
        byte = os.pread(f.fileno(), 1, offset)[0]
        os.pwrite(f.fileno(), bytes([byte ^ 0xFF]), offset)
    capsys.readouterr()
    assert cli(["-q", "verify", str(out)]) == 1
    lines = capsys.readouterr().out.splitlines()
    fix = lines[lines.index("to redo them (the conversion's options are read from the set):")
                + 1:]
    assert fix == [f"  rm -f {out / 'shard-00001.h5'}",
                   f"  fastdata convert {folder} {out} --resume"]
    for command in fix:
        argv = shlex.split(command)
        if argv[0] == "rm":
            os.remove(argv[-1])
        else:
            assert cli(["-q", *argv[1:]]) == 0
    assert cli(["-q", "verify", str(out)]) == 0


def test_verify_shows_its_progress_in_samples(folder, tmp_path):
    out = tmp_path / "o"
    convert(folder, str(out), sizes=[8], shard_size=5, progress=False)
    r = subprocess.run([sys.executable, "-m", "fastdata.cli", "verify", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "21/21" in r.stderr and "img" in r.stderr, r.stderr


def test_a_shuffled_conversion_mixes_the_classes_and_resumes_in_the_same_order(folder, tmp_path,
                                                                             caplog):
    """``--shuffle``: every shard mixes the classes, the order is the same each time, a resume
    without options takes it up, and the set holds the same samples with the same labels."""
    import hashlib

    out, plain = tmp_path / "o", tmp_path / "p"
    assert cli(["-q", "convert", folder, str(out), "--size", "8", "--shard-size", "5",
                "--shuffle"]) == 0
    assert cli(["-q", "convert", folder, str(plain), "--size", "8", "--shard-size", "5"]) == 0
    full = json.loads((out / "manifest.json").read_text())
    assert full["shuffle"] is True
    ds, ref = fastdata.open(out), fastdata.open(plain)
    assert all(len(set(ds.labels[s["start"]:s["start"] + s["count"]].tolist())) > 1
               for s in full["shards"] if s["count"] >= 3)        # (the folder: class by class)
    key = lambda d: sorted((hashlib.md5(x.tobytes()).hexdigest(), int(y)) for x, y in  # noqa: E731
                           zip(d.read_batch(range(len(d))), d.labels))
    assert key(ds) == key(ref) and ds.labels.tolist() != ref.labels.tolist()
    caplog.set_level(logging.INFO, "fastdata")
    for name in ("manifest.json", "shard-00003.h5", "shard-00004.h5"):
        os.remove(out / name)
    assert cli(["convert", folder, str(out), "--resume"]) == 0
    assert "--shard-size 5 --shuffle" in caplog.text
    assert json.loads((out / "manifest.json").read_text()) == full


def test_verify_checks_the_manifests_class_counts(folder, tmp_path):
    out = tmp_path / "o"
    convert(folder, str(out), sizes=[8], shard_size=5, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["class_counts"] == [7, 7, 7] and not verify(str(out))
    manifest["class_counts"] = [8, 6, 7]
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert [str(p) for p in verify(str(out))] == [
        "manifest.json: class_counts says [8, 6, 7] samples a class, the shards' labels "
        "[7, 7, 7]"]
    manifest["class_counts"] = [8, 7, 7]        # more than the set holds: refused at open
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(fastdata.format.ShardFormatError, match="field class_counts"):
        fastdata.open(out)
