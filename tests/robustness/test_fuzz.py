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
            workers=1, progress=False)
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
