"""`fastdata bench` end to end on a tiny fixture: JSON schema, table, plot; `fastdata demo`."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch
from PIL import Image

from fastdata.bench import Bench, table
from fastdata.cli import main
from fastdata.converters.convert import convert
from tests.helpers import plain_folder


@pytest.fixture(scope="module")
def bench_set(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    src = plain_folder(tmp / "src", per_class=6)
    convert(src, str(tmp / "shards"), container="hdf5", sizes=[16, 32], num_workers=1,
            progress=False)
    return src, str(tmp / "shards")


def check_stats(s, runs=2):
    assert set(s) == {"median", "min", "max", "runs"} and len(s["runs"]) == runs
    assert 0 < s["min"] <= s["median"] <= s["max"]


@pytest.mark.parametrize("model", ["none", "tiny"])
def test_bench_json_table_and_plot(bench_set, tmp_path, capsys, model):
    src, shards = bench_set
    js, png = tmp_path / "b.json", tmp_path / "b.png"
    threads = torch.get_num_threads()
    rc = main(["-q", "bench", shards, "--source", src, "--model", model, "--batch-size", "4",
               "--warmup", "1", "--batches", "2", "--repeat", "2", "--workers", "1",
               "--device", "cpu", "--json", str(js), "--plot", str(png)])
    assert rc == 0 and torch.get_num_threads() == threads    # the model's threads: restored
    out = capsys.readouterr().out
    rep = json.loads(js.read_text())
    assert rep["schema"] == "fastdata-bench/2"
    assert rep["config"]["crop"] == 32 and rep["config"]["model"] == model
    assert rep["config"]["shard_sets"] == [{"path": shards, "container": "hdf5",
                                            "encoding": "raw", "sizes": [16, 32]}]
    assert {"torch", "pil", "pil_simd", "native_kernel", "h5py", "lmdb", "dali", "cpu_count",
            "gpu"} <= set(rep["env"]) and rep["env"]["cpu"]      # the CPU's name: ratios vary
    by = {r["backend"]: r for r in rep["results"]}
    assert list(by) == ["baseline", "torch", "dali"]
    assert by["baseline"]["status"] == by["torch"]["status"] == "ok"
    assert by["baseline"]["what"].startswith(("torchvision", "in-package"))
    for name, r in by.items():
        if r["status"] == "skipped":        # only DALI may be missing, and it says why
            assert name == "dali" and "fastdata-shards[dali]" in r["reason"]
            continue
        check_stats(r["loader"]["img_per_s"])
        assert r["loader"]["vs_baseline"] > 0
        assert r["peak_pss_mb"] > 0
        if model == "none":
            assert "model" not in r
        else:
            m = r["model"]
            if name != "baseline":          # the step's layout: one computation for every row
                assert r["what"].endswith("channels_last"), r["what"]
            check_stats(m["img_per_s"])
            check_stats(m["ceiling"], runs=3)       # a run before each fed run, one after
            assert m["fraction_of_ceiling"] > 0 and 0 <= m["data_wait_frac"] <= 1
            assert rep["config"]["model_threads"] == 1 and "(the model on 1 thread)" in out
            lo, hi = m["fraction_range"]
            assert lo <= m["fraction_of_ceiling"] <= hi
            m["fraction_of_ceiling"], m["fraction_range"] = 1.2, [0.9, 1.5]
            assert f"{name}: fed above its ceiling (90%-150% over the runs), within" in table(rep)
            m["fraction_range"] = [1.1, 1.5]
            assert f"{name}: fed above its ceiling (110%-150% over the runs), in every" in \
                table(rep)
            for lo, hi in ([0.93, 12.66], [2.63, 4.11]):   # a busy machine: no share to speak of
                m["fraction_of_ceiling"], m["fraction_range"] = (lo + hi) / 2, [lo, hi]
                text = table(rep)
                assert f"{name}: unreliable: the runs put it at {lo:.0%}-{hi:.0%} of its " \
                       f"ceiling; use more --batches and --repeat, or a quieter machine" in text
                line = next(x for x in text.splitlines() if x.startswith(f"{name}: "))
                assert "noise" not in line and "fed above" not in line
        assert name in out
    assert (rep["ceiling"] is None) == (model == "none")
    with Image.open(png) as im:
        im.verify()
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size[0] >= 400


def test_plot_labels_every_panel_and_marks_rows_above_their_ceiling(bench_set):
    from fastdata.bench import figure

    def row(label, fed, ceiling, lo, hi):
        stats = {"median": fed, "min": fed * 0.9, "max": fed * 1.1}
        return {"label": label, "status": "ok", "loader": {"img_per_s": stats},
                "model": {"img_per_s": stats, "ceiling": {"median": ceiling},
                          "fraction_of_ceiling": fed / ceiling, "fraction_range": [lo, hi]}}
    report = {"config": {"size": 32, "crop": 32, "batch_size": 4, "device": "cpu", "repeat": 3},
              "ceiling": {"model": "tiny"},
              "results": [row("baseline", 50, 100, 0.45, 0.55), row("torch", 104, 100, 0.98, 1.1),
                          row("busy", 300, 100, 0.9, 12.0)]}
    fig = figure(report)
    fig.canvas.draw()
    loader_ax, fed_ax = fig.axes
    assert loader_ax.get_ylabel() == fed_ax.get_ylabel() == "images / s"
    assert any("error bars: their min-max" in t.get_text() for t in fig.texts)
    bars = [p for p in fed_ax.patches if p.get_height() > 0]
    assert [bool(b.get_hatch()) for b in bars] == [False, True, True]
    assert bars[2].get_facecolor() != bars[1].get_facecolor()      # the unreliable one greyed
    legend = fed_ax.get_legend().get_window_extent()
    assert not any(legend.overlaps(b.get_window_extent()) for b in bars)
    for n in (1, 2, 3):     # the legend inside its panel, however few its rows
        fig = figure({**report, "results": report["results"][:n]})
        fig.canvas.draw()
        legend, panel = fig.axes[1].get_legend().get_window_extent(), \
            fig.axes[1].get_window_extent()
        assert panel.x0 <= legend.x0 and legend.x1 <= panel.x1, (n, legend, panel)
        bars = [p for p in fig.axes[1].patches if p.get_height() > 0]
        assert not any(legend.overlaps(b.get_window_extent()) for b in bars)


def test_env_names_whichever_dali_build_is_installed(tmp_path):
    """On the H100 the JSON said dali: None while DALI's CUDA 13 build ran every DALI row."""
    meta = tmp_path / "nvidia_dali_cuda130-9.9.9.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: nvidia-dali-cuda130\n"
                                   "Version: 9.9.9\n")
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, "-c", "from fastdata.env import env_info; "
                          "print(env_info()['dali'])"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": path}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "9.9.9 (nvidia-dali-cuda130)"


def test_bench_skips_what_cannot_run_and_rejects_bad_values(bench_set, tmp_path, caplog):
    src, shards = bench_set
    gone = str(tmp_path / "gone")
    shutil.copytree(src, gone)
    convert(gone, str(tmp_path / "orphan"), sizes=[16], num_workers=1, progress=False)
    shutil.rmtree(gone)                            # the manifest's source folder is gone
    js = tmp_path / "s.json"
    assert main(["-q", "bench", str(tmp_path / "orphan"), "--backends", "baseline,torch,torch",
                 "--batch-size", "4", "--warmup", "0", "--batches", "1", "--repeat", "1",
                 "--json", str(js)]) == 0
    rep = json.loads(js.read_text())
    assert rep["results"][0]["status"] == "skipped" and gone in rep["results"][0]["reason"]
    assert main(["-q", "bench", shards, "--source", gone]) == 2   # a --source given: an error
    assert f"source='{gone}' is not a directory" in caplog.text   # (it was skipped as missing)
    assert rep["results"][1]["status"] == "ok" and len(rep["results"]) == 2  # torch once
    assert main(["-q", "bench", shards, "--crop", "0"]) == 2   # was taken as no crop
    assert "crop=0 is not valid" in caplog.text
    assert main(["-q", "bench", shards, "--backends", "torch,ffcv"]) == 2
    assert "backends=ffcv is not valid; choose from baseline, torch, dali" in caplog.text
    bad = tmp_path / "no" / "b.json"        # refused before the timing, not after it
    assert main(["-q", "bench", shards, "--backends", "torch", "--json", str(bad)]) == 2
    assert f"--json {bad}: folder {bad.parent} does not exist" in caplog.text
    txt = tmp_path / "b.txt"                # was: every row timed, then matplotlib's error
    assert main(["-q", "bench", shards, "--backends", "torch", "--plot", str(txt)]) == 2
    assert f"--plot {txt}: matplotlib cannot write 'txt' files; use one of" in caplog.text


def test_baseline_leaves_out_the_inputs_the_conversion_skipped(bench_set, tmp_path, caplog):
    src = shutil.copytree(bench_set[0], tmp_path / "src")
    (src / "a" / "broken.jpg").write_bytes(b"\xff\xd8\xff not a JPEG")
    convert(str(src), str(tmp_path / "shards"), sizes=[16], num_workers=1, progress=False)
    js = tmp_path / "b.json"
    argv = ["-q", "bench", str(tmp_path / "shards"), "--backends", "baseline", "--batch-size",
            "18", "--warmup", "0", "--batches", "1", "--repeat", "1", "--workers", "1",
            "--device", "cpu", "--json", str(js)]
    assert main(argv) == 0          # the baseline read all 18 images the shards hold
    row = json.loads(js.read_text())["results"][0]
    assert row["status"] == "ok" and row["what"].endswith("1 unreadable input(s) left out as "
                                                           "in the shards")
    copy = shutil.copytree(src, tmp_path / "copy")         # another folder: nothing known
    assert main(argv[:-2] + ["--source", str(copy)]) == 2
    assert f"cannot identify image file '{copy / 'a' / 'broken.jpg'}'" in caplog.text


def test_one_run_compares_shard_sets(bench_set, tmp_path, capsys, caplog):
    src, shards = bench_set
    jpeg = str(tmp_path / "jpeg")
    convert(src, jpeg, container="lmdb", encoding="jpeg", sizes=[16], num_workers=1, progress=False)
    js = tmp_path / "m.json"
    argv = ["bench", shards, jpeg, "--backends", "baseline,torch", "--batch-size", "4",
            "--warmup", "0", "--batches", "1", "--repeat", "1", "--workers", "1",
            "--device", "cpu", "--json", str(js), "-q"]
    assert main(argv) == 0
    rep = json.loads(js.read_text())
    assert rep["config"]["size"] == 16            # the largest size both sets hold
    rows = [(r["label"], r["shards"], r["status"]) for r in rep["results"]]
    assert rows == [("baseline", None, "ok"), ("torch hdf5 raw", shards, "ok"),
                    ("torch lmdb jpeg", jpeg, "ok")]
    assert "torch lmdb jpeg" in capsys.readouterr().out
    assert main(argv[:-3] + ["--size", "32"]) == 2     # not stored in the JPEG set
    assert "size 32 is not stored in" in caplog.text and "jpeg" in caplog.text
    convert(src, str(tmp_path / "tiny"), sizes=[8], num_workers=1, progress=False)
    assert main(["-q", "bench", shards, str(tmp_path / "tiny")]) == 2
    assert "share no stored size" in caplog.text


@pytest.mark.parametrize("model", ["none", "tiny"])
def test_ctrl_c_keeps_the_rows_done(bench_set, tmp_path, capsys, monkeypatch, model):
    """Ctrl-C as the second row starts (its first batch, or its first ceiling step): the table,
    JSON and plot still come out with the first row's figures, the rest marked, exit 130."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT is not Python's default handler here")
    src, shards = bench_set
    lmdb = str(tmp_path / "lmdb")
    convert(src, lmdb, container="lmdb", sizes=[32], num_workers=1, progress=False)
    calls, real = [], Bench._loader

    def loader(self, backend, ds):
        calls.append(backend)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return real(self, backend, ds)
    monkeypatch.setattr(Bench, "_loader", loader)
    js, png = tmp_path / "i.json", tmp_path / "i.png"
    rc = main(["-q", "bench", shards, lmdb, "--backends", "torch,baseline", "--model", model,
               "--batch-size", "4", "--warmup", "0", "--batches", "2", "--repeat", "1",
               "--workers", "1", "--device", "cpu", "--json", str(js), "--plot", str(png)])
    assert rc == 130 and calls == ["torch", "torch"]        # the baseline never started
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    rep = json.loads(js.read_text())
    assert rep["interrupted"] is True
    assert [(r["label"], r["status"]) for r in rep["results"]] == [
        ("torch hdf5 raw", "ok"), ("torch lmdb raw", "interrupted"), ("baseline", "interrupted")]
    check_stats(rep["results"][0]["loader"]["img_per_s"], runs=1)
    if model == "tiny":
        assert len(rep["ceiling"]["img_per_s"]["runs"]) == 2       # the first row's only
    assert "torch lmdb raw interrupted (Ctrl-C)" in capsys.readouterr().out
    with Image.open(png) as im:
        im.verify()


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path, capsys):
    """Every stage of the demo on a tiny sample (a busy 2-core machine ran the full one past
    the suite's timeout)."""
    assert main(["-q", "demo", "--dir", str(tmp_path / "demo"), "--epochs", "1",
                 "--per-class", "8", "--bench-batches", "2"]) == 0
    out = capsys.readouterr().out
    assert "held-out accuracy" in out and "bench.json" in out
    rep = json.loads((tmp_path / "demo" / "bench.json").read_text())
    assert rep["config"]["model"] == "resnet8"


def test_a_sample_folder_killed_while_drawing_is_drawn_whole_next_time(tmp_path):
    """`fastdata demo` draws only when the folder is missing: a draw killed halfway used to
    leave a folder that the next demo took as it was (361 of 480 images, 5 of 6 classes)."""
    import time

    from fastdata.cli.sample_data import CLASSES, make_sample_folder

    root = tmp_path / "images" / "train"
    code = "import sys; from fastdata.cli.sample_data import make_sample_folder as m; " \
        "m(sys.argv[1], " \
           "per_class=400)"
    proc = subprocess.Popen([sys.executable, "-c", code, str(root)])
    partial, deadline = tmp_path / "images" / "train.partial", time.time() + 60
    while proc.poll() is None and time.time() < deadline and sum(
            len(f) for _, _, f in os.walk(partial)) < 20:
        time.sleep(0.02)
    assert proc.poll() is None, "the drawing finished before it could be killed"
    proc.kill()
    proc.wait(timeout=60)
    assert not root.exists()
    make_sample_folder(str(root), per_class=3)
    assert sorted(os.listdir(root)) == sorted(CLASSES) and not partial.exists()
    assert all(len(os.listdir(root / c)) == 3 for c in CLASSES)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_keep_freed_memory_stops_page_faults_on_reallocation():
    """A 64 MiB block freed and allocated again: with glibc's defaults it is unmapped and
    faulted in anew each time (a minor fault per page, 4 KiB or huge); after
    keep_freed_memory, reused."""
    code = """if True:
        import resource, sys, numpy as np
        from fastdata.env import keep_freed_memory
        if sys.argv[1] == "keep":
            assert keep_freed_memory()
        np.ones(64 << 20, np.uint8)                  # allocated, touched, freed
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(4):
            np.ones(64 << 20, np.uint8)
        print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
    faults = {side: int(subprocess.run([sys.executable, "-c", code, side], check=True,
                                       capture_output=True, text=True).stdout)
              for side in ("default", "keep")}
    assert faults["default"] >= 4 * 32 and faults["keep"] < faults["default"] // 10, faults


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
def test_cpus_confines_the_whole_bench_and_reports_per_core(bench_set, tmp_path):
    src, shards = bench_set
    js = tmp_path / "b.json"
    script = ("import os, sys, fastdata.cli as c\n"
              "rc = c.main(sys.argv[1:])\n"
              "print('affinity', sorted(os.sched_getaffinity(0)))\n"
              "sys.exit(rc)")
    args = ["-q", "bench", shards, "--backends", "torch", "--batch-size", "4", "--warmup", "1",
            "--batches", "2", "--repeat", "1", "--device", "cpu", "--cpus", "0",
            "--json", str(js)]
    r = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "affinity [0]" in r.stdout and "on 1 host core," in r.stdout
    rep = json.loads(js.read_text())
    assert rep["config"]["host_cores"] == 1 and rep["config"]["num_workers"] == 1
    row = next(x for x in r.stdout.splitlines() if x.startswith("torch"))
    rate = rep["results"][0]["loader"]["img_per_s"]["median"]
    assert row.split()[-3] == f"{rate:.0f}"        # img/s per core: all of it on one core
    bad = subprocess.run([*[sys.executable, "-m", "fastdata.cli"], *args[:-2], "--cpus",
                          "0-9999"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "cpus 0-9999 are not all usable here; this process may use " \
        "0-" in bad.stderr, bad.stderr


@pytest.mark.parametrize("model", ["none", "tiny"])
def test_profile_writes_a_trace_per_row_of_its_batches(bench_set, tmp_path, model):
    """`--profile DIR`: a torch.profiler trace of a few batches of each row (fed to the step
    where there is a model), as Chrome trace JSON, which TensorBoard and Perfetto read."""
    from fastdata.bench.runner import PROFILE_BATCHES

    src, shards = bench_set
    js, traces = tmp_path / "b.json", tmp_path / "traces"
    assert main(["-q", "bench", shards, "--source", src, "--model", model, "--backends",
                 "baseline,torch", "--batch-size", "4", "--warmup", "1", "--batches", "2",
                 "--repeat", "1", "--num-workers", "1", "--device", "cpu", "--json", str(js),
                 "--profile", str(traces)]) == 0
    rep = json.loads(js.read_text())
    for r in rep["results"]:
        assert r["peak_gpu_mb"] is None                 # on a CPU
        with open(r["profile"]) as f:
            events = json.load(f)["traceEvents"]
        names = [e.get("name", "") for e in events]
        assert os.path.dirname(r["profile"]) == str(traces)
        assert r["profile"].endswith(".pt.trace.json")
        assert names.count("fastdata: next batch") == PROFILE_BATCHES
        assert names.count("fastdata: step") == (PROFILE_BATCHES if model != "none" else 0)
        assert any(n.startswith("aten::") for n in names)   # the ops under them
    assert sorted(os.listdir(traces)) == ["baseline.pt.trace.json", "torch.pt.trace.json"]


def test_compile_runs_the_model_compiled_fed_and_ceiling(bench_set, tmp_path, capsys):
    """`--compile BACKEND`: the step's model through torch.compile (the eager backend traces
    it without generating code, quick enough for a test), in the ceiling and fed alike."""
    import torch._dynamo

    src, shards = bench_set
    js = tmp_path / "b.json"
    torch._dynamo.reset()
    assert main(["-q", "bench", shards, "--model", "tiny", "--backends", "torch",
                 "--batch-size", "4", "--warmup", "1", "--batches", "2", "--repeat", "1",
                 "--num-workers", "1", "--device", "cpu", "--compile", "eager",
                 "--json", str(js)]) == 0
    rep = json.loads(js.read_text())
    assert rep["config"]["compile"] == "eager"
    assert rep["results"][0]["model"]["img_per_s"]["median"] > 0
    assert "torch.compile, backend eager" in capsys.readouterr().out
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0      # it was traced
    with pytest.raises(ValueError, match="compile applies to a model"):
        Bench(shards, model="none", compile=True)


@pytest.mark.parametrize("kind, model", [("detection", "tiny_detector"),
                                         ("segmentation", "tiny_segmenter")])
def test_bench_reads_detection_and_segmentation_sets(tmp_path, kind, model):
    """Their targets reach the step (fed and ceiling); the class-folder baseline says why it
    cannot run."""
    from tests.helpers import detection_folder

    src, ann = detection_folder(tmp_path / "src", n=8, maps=True)
    out = str(tmp_path / "set")
    convert(src, out, sizes=[32], num_workers=1, progress=False,
            **({"coco": ann} if kind == "detection" else {"masks": f"{src}-maps"}))
    js = tmp_path / "b.json"
    assert main(["-q", "bench", out, "--model", model, "--backends", "baseline,torch",
                 "--batch-size", "4", "--warmup", "1", "--batches", "2", "--repeat", "1",
                 "--num-workers", "1", "--device", "cpu", "--json", str(js)]) == 0
    base, fed = json.loads(js.read_text())["results"]
    assert base["status"] == "skipped" and f"a {kind} set's labels" in base["reason"]
    assert fed["status"] == "ok" and fed["model"]["img_per_s"]["median"] > 0
    assert fed["model"]["ceiling"]["median"] > 0


def test_the_table_shows_peak_gpu_memory_where_rows_have_it():
    from fastdata.bench import table

    stats = {"median": 100.0, "min": 90.0, "max": 110.0, "runs": [100.0]}
    row = {"label": "torch", "status": "ok", "loader": {"img_per_s": stats},
           "peak_pss_mb": 700.0, "peak_gpu_mb": 1234.4}
    report = {"config": {"shard_sets": [{"path": "s", "container": "hdf5", "encoding": "raw"}],
                         "size": 32, "crop": 32, "batch_size": 4, "device": "cuda:0",
                         "batches": 2, "repeat": 1, "host_cores": 2},
              "ceiling": None, "results": [row]}
    head, _, line = table(report).splitlines()[1:4]
    assert head.endswith("peak PSS  peak GPU")
    assert line.endswith("700 MB   1234 MB")
    assert "peak GPU" not in table({**report, "results": [{**row, "peak_gpu_mb": None}]})


@pytest.mark.gpu
def test_bench_reports_each_rows_peak_gpu_memory(bench_set, tmp_path):
    src, shards = bench_set
    js = tmp_path / "b.json"
    assert main(["-q", "bench", shards, "--backends", "torch", "--model", "tiny",
                 "--batch-size", "4", "--warmup", "1", "--batches", "2", "--repeat", "1",
                 "--device", "cuda", "--json", str(js)]) == 0
    (row,) = json.loads(js.read_text())["results"]
    assert row["peak_gpu_mb"] > 0
