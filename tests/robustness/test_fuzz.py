"""Seeded fuzzing of shard sets: random byte flips, truncations and manifest field edits over
small sets of every container and encoding. Every case ends in correct data or a clean error
(ValueError or OSError) that names the file, from ``info``, ``verify``, ``open`` and the
``Loader`` alike; never in a hang, a crash or another exception. The cases run in one child
process, so that a crash (SIGSEGV, SIGBUS) is a failure naming its case, not a dead test run."""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import textwrap

import pytest

from fastdata.converters.convert import convert
from tests.helpers import plain_folder

CASES = 18          # per container and encoding
VALUES = [None, -1, 0, 1, 3, 2**62, 1.5, True, "x", "../x", "/etc/passwd", [], {}, [1], {"a": 1}]

CHILD = textwrap.dedent("""
    import faulthandler, json, os, sys, traceback
    faulthandler.enable()
    import fastdata
    import torch
    from fastdata.cli.info import info_dict
    from fastdata.shards.verify import verify

    def clean(e, case):
        # a ValueError or OSError naming a file of the set
        text = str(e)
        return isinstance(e, (ValueError, OSError)) and ("manifest.json" in text
                                                          or "shard-" in text)

    bad = []
    for case in json.load(sys.stdin):
        for what in ("info", "verify", "loader"):
            faulthandler.dump_traceback_later(60, exit=True)    # a hang fails, naming it
            try:
                if what == "info":
                    info_dict(case)
                elif what == "verify":
                    verify(case)
                else:
                    loader = fastdata.Loader(case, batch_size=3, device="cpu", num_workers=0,
                                             shuffle=False, train=False)
                    for images, labels in loader:
                        assert images.shape[1:] == (3, 8, 8) and labels.dtype == torch.int64
            except Exception as e:  # noqa: BLE001
                if not clean(e, case):
                    bad.append((case, what, traceback.format_exc()))
            finally:
                faulthandler.cancel_dump_traceback_later()
            print(case, what, flush=True)
    print(json.dumps(bad))
    """)


def _flip(rng, path):
    data = bytearray(open(path, "rb").read())
    for _ in range(rng.randint(1, 8)):
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    open(path, "wb").write(bytes(data))


def _truncate(rng, path):
    os.truncate(path, rng.randrange(os.path.getsize(path)))


def _edit(rng, root):
    path = os.path.join(root, "manifest.json")
    m = json.load(open(path))
    target = m
    if rng.random() < 0.6:
        target = rng.choice(m["shards"])
    key = rng.choice(sorted(target))
    if rng.random() < 0.2:
        del target[key]
    else:
        target[key] = rng.choice(VALUES)
    json.dump(m, open(path, "w"))


def _damage(rng, root):
    shards = sorted(n for n in os.listdir(root) if n.startswith("shard-"))
    kind = rng.choice(("flip", "truncate", "edit"))
    if kind == "edit":
        _edit(rng, root)
    else:
        (_flip if kind == "flip" else _truncate)(rng, os.path.join(root, rng.choice(shards)))
    return kind


@pytest.mark.parametrize("container,encoding", [("hdf5", "raw"), ("hdf5", "jpeg"),
                                                ("lmdb", "raw"), ("lmdb", "jpeg")])
def test_damaged_sets_end_in_data_or_a_clean_error(tmp_path, container, encoding):
    src = plain_folder(tmp_path / "src", per_class=3)
    good = tmp_path / "good"
    convert(src, str(good), container=container, encoding=encoding, sizes=[8], shard_size=4,
            num_workers=1, progress=False)
    rng = random.Random(f"{container}/{encoding}")
    cases = []
    for k in range(CASES):
        case = tmp_path / f"case{k:02d}"
        shutil.copytree(good, case)
        _damage(rng, case)
        cases.append(str(case))
    r = subprocess.run([sys.executable, "-c", CHILD], input=json.dumps(cases), text=True,
                       capture_output=True, timeout=300)
    assert r.returncode == 0, f"crashed or hung after {r.stdout.splitlines()[-1:]}:\n{r.stderr}"
    bad = json.loads(r.stdout.splitlines()[-1])
    assert not bad, "\n".join(f"{c} {w}:\n{t}" for c, w, t in bad[:3])


LABEL_EDITS = ["", "-1", "3.5", "1e39", "-1e39", "nan", "inf", "10" * 40, "²", "cat", "0x10",
               "../../etc/passwd", "/abs.png", "a,b", '"', "\x00", "9" * 12]


def _edit_labels(rng, rows: list[list[str]]) -> list[list[str]]:
    """A random edit of a labels table: a cell replaced, a row cut or doubled, a column
    added or dropped."""
    rows = [list(r) for r in rows]
    kind = rng.randrange(5)
    k = rng.randrange(1, len(rows))
    if kind == 0:
        rows[k][rng.randrange(len(rows[k]))] = rng.choice(LABEL_EDITS)
    elif kind == 1:
        del rows[k]
    elif kind == 2:
        rows.insert(k, list(rows[k]))
    elif kind == 3:
        rows[k].append(rng.choice(LABEL_EDITS))
    else:
        rows[k] = rows[k][:1]
    return rows


@pytest.mark.parametrize("table", ["class", "integer", "targets"])
def test_edited_labels_files_end_in_a_set_or_one_clean_error(tmp_path, table):
    """Random edits of a labels file: every conversion ends in a set that verifies, or a
    ValueError or ConversionError; bounded in time, nothing else raised."""
    import csv

    from fastdata.converters.units import ConversionError
    from fastdata.shards.verify import verify

    src = plain_folder(tmp_path / "src", per_class=3)
    paths = sorted(os.path.relpath(os.path.join(d, f), src)
                   for d, _, fs in os.walk(src) for f in fs)
    cells = {"class": lambda k: [["cat", "dog"][k % 2]], "integer": lambda k: [str(k % 4)],
             "targets": lambda k: [str(k * 0.25), "1"]}[table]
    header = ["path", "label"] if table != "targets" else ["path", "a", "b"]
    good = [header] + [[p, *cells(k)] for k, p in enumerate(paths)]
    rng = random.Random(table)
    for case in range(10):
        rows = good
        for _ in range(rng.randint(1, 3)):
            rows = _edit_labels(rng, rows)
        labels = tmp_path / f"l{case}.csv"
        with open(labels, "w", newline="") as f:
            csv.writer(f).writerows(rows)
        out = str(tmp_path / f"o{case}")
        try:
            m = convert(src, out, sizes=[8], labels=str(labels), num_workers=1, progress=False)
        except (ValueError, ConversionError) as e:
            assert "\n" not in str(e), (case, rows, e)
            continue
        assert verify(out) == [], (case, rows)
        assert m["num_samples"] + len(m["skipped"]) >= 1


def _hook_raises(image, rng):
    raise KeyError("a hook's own error")


def _hook_returns_junk(image, rng):
    return [[1, 2], [3]]


def _hook_returns_float(image, rng):
    return image.astype("float32")


def _hook_returns_none(image, rng):
    return None


def _batch_returns_one(images, labels):
    return images


def _batch_returns_bad_labels(images, labels):
    return images, labels[:1]


def _batch_returns_strings(images, labels):
    return "images", "labels"


@pytest.mark.parametrize("hooks", [
    dict(sample_transform=_hook_raises), dict(sample_transform=_hook_returns_junk),
    dict(sample_transform=_hook_returns_float), dict(sample_transform=_hook_returns_none),
    dict(batch_transform=_batch_returns_one), dict(batch_transform=_batch_returns_bad_labels),
    dict(batch_transform=_batch_returns_strings)])
@pytest.mark.parametrize("workers", ["thread", "process"])
def test_misbehaving_hooks_end_in_an_error_that_names_them(tmp_path, hooks, workers):
    """A user's hook that raises or returns the wrong thing: an error naming the hook (and,
    for a sample hook, the sample), on threads and processes alike; never a hang or a
    batch of wrong shape."""
    import fastdata

    src = plain_folder(tmp_path / "src", per_class=3)
    convert(src, str(tmp_path / "s"), sizes=[8], num_workers=1, progress=False)
    loader = fastdata.Loader(str(tmp_path / "s"), batch_size=3, device="cpu",
                             backend=fastdata.TorchBackend(num_workers=1, workers=workers), **hooks)
    with pytest.raises(Exception) as e:
        list(loader)
    text = str(e.value) + "".join(getattr(e.value, "__notes__", []))
    assert ("sample_transform" in text and "sample " in text) if "sample_transform" in hooks \
        else "batch_transform" in text, text
    loader.close()
