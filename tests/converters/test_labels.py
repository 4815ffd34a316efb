"""Labels from a CSV file: single-label, multi-label and regression sets, end to end."""
from __future__ import annotations

import csv
import json
import os
import shutil

import numpy as np
import pytest
import torch

import fastdata
from fastdata.cli import main as cli
from fastdata.converters.convert import convert
from fastdata.format import ShardFormatError
from fastdata.shards.verify import verify
from fastdata.train.fit import evaluate
from fastdata.train.step import TrainStep, loss_for
from tests.helpers import earlier_targets_set, smooth

N = 12


@pytest.fixture(scope="module")
def flat(tmp_path_factory):
    """A flat folder of N images (no class folders) and their sorted names."""
    root = tmp_path_factory.mktemp("flat") / "src"
    root.mkdir()
    for k in range(N):
        smooth(30 + k, 20 + k, k).save(root / f"im{k:02d}.jpg", quality=95)
    return str(root), [f"im{k:02d}.jpg" for k in range(N)]


def write_csv(path, header, rows) -> str:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return str(path)


def targets(k: int) -> list:
    return [k % 2, (k // 2) % 2, 1]


@pytest.mark.parametrize("container", ["hdf5", "lmdb"])
def test_class_names_and_integers_from_a_flat_folder(flat, tmp_path, container):
    src, names = flat
    by_name = write_csv(tmp_path / "n.csv", ["path", "label"],
                        [[p, ["dog", "cat", "bird"][k % 3]] for k, p in enumerate(names)])
    m = convert(src, str(tmp_path / "a"), container=container, sizes=[16], labels=by_name,
                progress=False)
    ds = fastdata.open(str(tmp_path / "a"))
    assert m["label_kind"] == ds.label_kind == "class" and ds.classes == ["bird", "cat", "dog"]
    want = [ds.classes.index(["dog", "cat", "bird"][k % 3]) for k in range(N)]
    assert ds.labels.dtype == np.int64 and ds.labels.tolist() == want
    by_int = write_csv(tmp_path / "i.csv", ["path", "label"], [[p, k % 4 + 1]
                                                              for k, p in enumerate(names)])
    convert(src, str(tmp_path / "b"), container=container, sizes=[16], labels=by_int,
            progress=False)
    ds = fastdata.open(str(tmp_path / "b"))
    assert ds.classes == ["0", "1", "2", "3", "4"]      # an integer label is its index
    assert ds.labels.tolist() == [k % 4 + 1 for k in range(N)]


@pytest.mark.parametrize("container", ["hdf5", "lmdb"])
def test_multi_label_sets_load_as_float_multi_hot_on_both_backends(flat, tmp_path, container):
    src, names = flat
    labels = write_csv(tmp_path / "m.csv", ["path", "cat", "dog", "car"],
                       [[p, *targets(k)] for k, p in enumerate(names)])
    out = str(tmp_path / "m")
    convert(src, out, container=container, sizes=[16], labels=labels, progress=False)
    ds = fastdata.open(out)
    assert ds.label_kind == "multi_label" and ds.classes == ["cat", "dog", "car"]
    assert ds.labels.dtype == np.float32 and ds.labels.tolist() == [targets(k)
                                                                    for k in range(N)]
    assert ds[3][1].tolist() == targets(3)
    kw = dict(batch_size=4, size=16, dtype=torch.uint8, augment=False, shuffle=False,
              device="cpu")
    processes = fastdata.TorchBackend(workers="process", num_workers=2)
    runs = [list(fastdata.Loader(out, num_workers=2, **kw)),
            list(fastdata.Loader(out, backend=processes, **kw))]
    if container == "lmdb":
        pytest.importorskip("nvidia.dali")
        runs.append(list(fastdata.Loader(out, backend="dali", num_workers=2, **kw)))
    for run in runs:
        y = torch.cat([y for _, y in run])
        assert y.dtype == torch.float32 and y.tolist() == [targets(k) for k in range(N)]


def test_regression_targets_train_and_evaluate(flat, tmp_path):
    src, names = flat
    labels = write_csv(tmp_path / "r.csv", ["path", "age", "score"],
                       [[p, 20 + k, k / 10] for k, p in enumerate(names)])
    out = str(tmp_path / "r")
    convert(src, out, sizes=[16], labels=labels, progress=False)
    ds = fastdata.open(out)
    assert ds.label_kind == "regression" and ds.classes == ["age", "score"]
    assert np.allclose(ds.labels, [[20 + k, k / 10] for k in range(N)])
    loader = fastdata.Loader(out, batch_size=4, size=16, train=False, device="cpu")
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 2))
    step = TrainStep(model, torch.optim.SGD(model.parameters(), lr=1e-4), precision="fp32",
                     loss_fn=loss_for(ds.label_kind))
    x, y = next(iter(loader))
    assert y.shape == (4, 2) and torch.isfinite(step(x, y))
    mse = evaluate(step, loader)
    with torch.no_grad():
        want = torch.cat([(model(x) - y).square() for x, y in loader]).mean()
    assert np.isclose(mse, float(want), rtol=1e-5)


def test_what_the_file_and_the_folder_disagree_on_is_reported(flat, tmp_path):
    src, names = flat
    rows = [[p, *targets(k)] for k, p in enumerate(names[:-3])]       # the last image unlisted
    rows += [["gone.jpg", 1, 0, 0], ["../" + names[0], 1, 0, 0], [names[0], 0, 0, 0],
             [names[-3], "x", 1, 0], [names[-2], 1]]
    labels = write_csv(tmp_path / "bad.csv", ["path", "cat", "dog", "car"], rows)
    m = convert(src, str(tmp_path / "o"), sizes=[16], labels=labels, progress=False)
    reasons = {s["path"]: s["reason"] for s in m["skipped"]}
    assert reasons[names[-1]] == "not in the labels file"
    assert "not an image in the source folder" in reasons["gone.jpg"]
    assert "not a path inside the source folder" in reasons["../" + names[0]]
    assert "not numbers" in reasons[names[-3]]
    assert "2 columns, the header has 4" in reasons[names[-2]]
    assert "listed again" in reasons[names[0]]
    assert len(m["skipped"]) == 6
    kinds = {s["path"]: s["kind"] for s in m["skipped"]}
    assert kinds == {names[-1]: "unlabelled", "gone.jpg": "missing", names[0]: "note",
                     "../" + names[0]: "bad_label", names[-3]: "bad_label",
                     names[-2]: "bad_label"}
    ds = fastdata.open(str(tmp_path / "o"))
    assert len(ds) == N - 3 and ds.labels[0].tolist() == targets(0)    # the first row counts
    with pytest.raises(ValueError, match="one image path column"):
        convert(src, str(tmp_path / "h"), sizes=[16], progress=False,
                labels=write_csv(tmp_path / "h.csv", ["file", "label"], []))


def test_targets_are_a_field_and_earlier_sets_still_read(flat, tmp_path, folder):
    """Multi-label rows are the shards' field ``label`` (``multilabel`` of the classes, checked
    against them); a set of the earlier form (``targets.npy`` beside the shards) reads the
    same labels, and its file is checked; version 1 sets read as class sets."""
    src, names = flat
    labels = write_csv(tmp_path / "m.csv", ["path", "cat", "dog", "car"],
                       [[p, *targets(k)] for k, p in enumerate(names)])
    out = str(tmp_path / "m")
    m = convert(src, out, sizes=[16], labels=labels, progress=False)
    assert m["version"] == 4 and "targets" not in m and not os.path.exists(
        os.path.join(out, "targets.npy"))
    assert m["fields"] == [{"name": "label", "kind": "multilabel",
                            "params": {"classes": ["cat", "dog", "car"]}}]
    ds = fastdata.open(out)
    assert ds.fields == {} and ds.labels.tolist() == [targets(k) for k in range(N)]
    assert verify(out) == []
    m["fields"][0]["params"]["classes"] = ["cat", "dog"]
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(m, f)
    with pytest.raises(ShardFormatError, match="fields"):
        fastdata.open(out)
    out = earlier_targets_set(src, str(tmp_path / "v2"), ["cat", "dog", "car"],
                              np.array([targets(k) for k in range(N)], np.float32))
    ds = fastdata.open(out)
    assert ds.manifest["version"] == 2 and ds.labels.tolist() == [targets(k) for k in range(N)]
    assert verify(out) == []
    with open(os.path.join(out, "targets.npy"), "r+b") as f:
        f.seek(-4, os.SEEK_END)
        f.write(np.float32(0.5).tobytes())
    with pytest.raises(ShardFormatError, match="targets.npy: damaged"):
        fastdata.open(out).labels
    assert [p.shard for p in verify(out)] == ["targets.npy"]
    os.remove(os.path.join(out, "targets.npy"))
    os.symlink(labels, os.path.join(out, "targets.npy"))
    with pytest.raises(ShardFormatError, match="cannot open"):
        fastdata.open(out).labels
    old = str(tmp_path / "v1")
    convert(folder, old, sizes=[16], progress=False)
    path = os.path.join(old, "manifest.json")
    with open(path) as f:
        m = json.load(f)
    m["version"] = 1
    del m["label_kind"]
    with open(path, "w") as f:
        json.dump(m, f)
    ds = fastdata.open(old)
    assert ds.label_kind == "class" and len(ds.labels) == 21


def test_cli_labels_info_and_resume(flat, tmp_path, capsys):
    src, names = flat
    labels = write_csv(tmp_path / "m.csv", ["path", "cat", "dog", "car"],
                       [[p, *targets(k)] for k, p in enumerate(names)])
    out = str(tmp_path / "o")
    assert cli(["-q", "convert", src, out, "--size", "16", "--labels", labels,
                "--shard-size", "5"]) == 0
    assert cli(["info", out, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["label_kind"] == "multi_label"
    assert info["classes"] == {"cat": N // 2, "dog": N // 2, "car": N}
    assert cli(["info", out]) == 0
    assert "3 classes, multi-label: samples holding each:" in capsys.readouterr().out
    os.remove(os.path.join(out, "manifest.json"))
    os.remove(os.path.join(out, "shard-00002.h5"))
    shutil.copy(labels, tmp_path / "kept.csv")
    assert cli(["-q", "convert", src, out, "--resume"]) == 0    # the saved options: --labels
    assert fastdata.open(out).labels.tolist() == [targets(k) for k in range(N)]


@pytest.mark.parametrize("kind", ["multi_label", "regression"])
def test_fastdata_train_picks_the_loss_of_the_label_kind(flat, tmp_path, capsys, kind):
    src, names = flat
    header = ["path", "cat", "dog", "car"] if kind == "multi_label" else ["path", "age"]
    rows = [[p, *targets(k)] if kind == "multi_label" else [p, k / N]
            for k, p in enumerate(names)]
    out = str(tmp_path / "o")
    convert(src, out, sizes=[16], labels=write_csv(tmp_path / "l.csv", header, rows),
            progress=False)
    assert cli(["-q", "train", out, "--val", out, "--model", "tiny", "--epochs", "1",
                "--batch-size", "4", "--device", "cpu", "--workers", "0", "--log-every", "0",
                "--schedule", "none"]) == 0
    said = capsys.readouterr().out
    assert ("held-out accuracy" in said and "each label counted" in said
            if kind == "multi_label" else "held-out mean squared error" in said), said


def test_integer_labels_keep_their_index_and_a_huge_one_costs_one_skipped_row(flat, tmp_path):
    """An integer label of 10^9 used to make 10^9 class names (MemoryError): its row is
    skipped, naming its line; the others keep their integer as their class index."""
    from fastdata.converters.labels import MAX_CLASSES

    src, names = flat
    rows = [[p, [2, 10, 0][k % 3]] for k, p in enumerate(names)]
    rows[4][1] = 10 ** 9
    m = convert(src, str(tmp_path / "a"), sizes=[16], progress=False,
                labels=write_csv(tmp_path / "l.csv", ["path", "label"], rows))
    ds = fastdata.open(str(tmp_path / "a"))
    assert len(ds.classes) == 11 and ds.classes[10] == "10"
    kept = [r for k, r in enumerate(rows) if k != 4]
    assert ds.labels.tolist() == [r[1] for r in kept]
    (bad,) = [s for s in m["skipped"] if s["path"] == names[4]]
    assert "line 6" in bad["reason"] and f"not below {MAX_CLASSES}" in bad["reason"]


@pytest.mark.parametrize("odd", ["-1", "3.5", "cat", "²"])
def test_integer_labels_mixed_with_others_are_refused_naming_the_row(flat, tmp_path, odd):
    """One such label turned every class into a name sorted as text: 10 came before 2."""
    src, names = flat
    rows = [[p, k % 3 + 1] for k, p in enumerate(names)]
    rows[7][1] = odd
    labels = write_csv(tmp_path / "l.csv", ["path", "label"], rows)
    with pytest.raises(ValueError, match=r"line 9: label .* is not a non-negative integer"):
        convert(src, str(tmp_path / "a"), sizes=[16], progress=False, labels=labels)
    assert cli(["-q", "convert", src, str(tmp_path / "b"), "--size", "16", "--labels",
                labels]) == 2


def test_a_target_beyond_float32_is_skipped_not_stored_as_inf(flat, tmp_path):
    src, names = flat
    rows = [[p, k * 0.5, 1.0] for k, p in enumerate(names)]
    rows[3][1] = "1e39"
    m = convert(src, str(tmp_path / "a"), sizes=[16], progress=False,
                labels=write_csv(tmp_path / "l.csv", ["path", "a", "b"], rows))
    (bad,) = [s for s in m["skipped"] if s["path"] == names[3]]
    assert "line 5" in bad["reason"] and "float32" in bad["reason"]
    assert verify(str(tmp_path / "a")) == []
    assert np.isfinite(fastdata.open(str(tmp_path / "a")).labels).all()


def test_a_fifo_as_the_labels_file_is_refused_not_waited_on(flat, tmp_path):
    src, _ = flat
    fifo = tmp_path / "labels.csv"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        convert(src, str(tmp_path / "a"), sizes=[16], progress=False, labels=str(fifo))


def test_a_labels_set_is_repaired_by_the_commands_verify_prints(flat, tmp_path, capsys):
    """The options kept in the manifest left out the labels file: `convert SRC OUT --resume`
    then failed with "no class directories"."""
    src, names = flat
    labels = write_csv(tmp_path / "l.csv", ["path", "label"],
                       [[p, ["dog", "cat"][k % 2]] for k, p in enumerate(names)])
    out = str(tmp_path / "o")
    convert(src, out, sizes=[16], shard_size=4, labels=labels, progress=False)
    before = fastdata.open(out).labels.tolist()
    os.remove(os.path.join(out, fastdata.open(out).manifest["shards"][1]["file"]))
    assert cli(["-q", "verify", out]) == 1
    command = capsys.readouterr().out.splitlines()[-1].split()
    assert command[:2] == ["fastdata", "convert"] and command[-1] == "--resume"
    assert cli(["-q", *command[1:]]) == 0
    assert verify(out) == [] and fastdata.open(out).labels.tolist() == before
    write_csv(labels, ["path", "label"], [[p, ["dog", "cat"][k % 3 % 2]]
                                          for k, p in enumerate(names)])
    os.remove(os.path.join(out, fastdata.open(out).manifest["shards"][1]["file"]))
    assert cli(["-q", *command[1:]]) != 0       # another labels file: not the same set


def test_a_shuffled_multi_label_set_keeps_each_image_with_its_targets(flat, tmp_path):
    src, names = flat
    labels = write_csv(tmp_path / "m.csv", ["path", "cat", "dog", "car"],
                       [[p, *targets(k)] for k, p in enumerate(names)])
    for d in ("plain", "mixed"):
        convert(src, str(tmp_path / d), sizes=[16], labels=labels, progress=False,
                shuffle=d == "mixed")
    plain, mixed = fastdata.open(tmp_path / "plain"), fastdata.open(tmp_path / "mixed")

    def by_image(ds):
        raw = ds.read_batch(range(len(ds)))
        return sorted((raw[i].tobytes(), tuple(ds.labels[i].tolist())) for i in range(len(ds)))
    assert by_image(mixed) == by_image(plain)
    assert mixed.labels.tolist() != plain.labels.tolist()       # another order


def test_a_conversion_says_why_inputs_were_left_out_and_warns_when_most_were(flat, tmp_path,
                                                                           caplog, capsys):
    """Skips counted by their kind, not all "unreadable"; a duplicate row's image is kept and
    noted; a conversion that keeps 1 of 12 images says so; `info` says the same."""
    src, names = flat
    rows = [[names[0], "cat"], [names[0], "dog"]]          # a duplicate; 11 images unlisted
    labels = write_csv(tmp_path / "one.csv", ["path", "label"], rows)
    out = str(tmp_path / "o")
    with caplog.at_level("INFO"):
        m = convert(src, out, sizes=[16], labels=labels, progress=False)
    assert m["num_samples"] == 1 and len(m["skipped"]) == 12
    assert "(11 without labels, 1 notes on inputs that were kept; " in caplog.text
    assert "only 1 of the 12 inputs were converted (11 without labels)" in caplog.text
    assert f"note on {names[0]}: labels file one.csv line 3: listed again" in caplog.text
    assert cli(["info", out]) == 0
    assert "skipped: 12 (11 without labels, 1 notes on inputs that were kept)" in \
        capsys.readouterr().out
