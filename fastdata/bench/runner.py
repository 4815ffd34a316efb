"""``fastdata bench``: loaders against each other, against a plain PIL pipeline, and against
the model's ceiling (the same step on one fixed on-device batch: no input pipeline).

For each backend (``baseline``: ImageFolder + PIL + DataLoader over the source folder, once;
``torch`` and ``dali`` on each shard set given, so one run compares containers and encodings),
after ``warmup`` batches, ``repeat`` runs of ``batches`` batches each:

* loader only: images/s (median, min, max over the runs);
* with a model: the same ``TrainStep`` fed by the loader, and on one fixed on-device batch of
  the set's images (the ceiling: a run before each fed run and one after the last, while the
  loader's workers wait with their read-ahead full, so none competes with the model); each fed
  run's share of the ceiling is against the ceiling runs on either side of it, so a load that
  changes over the bench weighs on both sides of each share; and the fraction of wall time
  the step waited for the next batch;
* peak PSS of the process tree (workers included), sampled after every run.

On CUDA the model timings use CUDA events. A backend that cannot run here (DALI not installed,
no source folder for the baseline) is reported as skipped with the reason.
"""
from __future__ import annotations

import functools
import gc
import logging
import math
import os
import re
import statistics
import time

import torch

from fastdata._optional import available
from fastdata.bench.report import SCHEMA
from fastdata.checks import integer
from fastdata.env import resolve_device, usable_cpus
from fastdata.format import SPATIAL_KINDS
from fastdata.interrupt import SigintLatch

log = logging.getLogger("fastdata.bench")


#: what `fastdata bench` can compare: the baseline pipeline and each loader backend
CONTENDERS = ("baseline", "torch", "dali")
#: batches of a row traced with ``--profile``
PROFILE_BATCHES = 5


def rss_tree_mb() -> float | None:
    """Proportional set size (MiB) of this process and its children; None off Linux."""
    pids = [os.getpid()]
    try:
        with open(f"/proc/{os.getpid()}/task/{os.getpid()}/children") as f:
            pids += [int(p) for p in f.read().split()]
    except OSError:
        return None
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += sum(int(line.split()[1]) for line in f if line.startswith("Pss:"))
        except OSError:
            pass
    return total / 1024


def _forever(loader, check=lambda: None):
    """Batches across epochs (``set_epoch`` between them); ``check()`` before each."""
    epoch = 0
    while True:
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        empty = True
        for batch in loader:
            empty = False
            check()
            yield batch
        if empty:
            raise ValueError("the loader yields no full batch: use a smaller --batch-size")
        epoch += 1


def _stats(runs: list[float]) -> dict:
    return {"median": statistics.median(runs), "min": min(runs), "max": max(runs),
            "runs": runs}


class _Clock:
    """Wall time of a block; on CUDA measured between CUDA events."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __enter__(self):
        if self.cuda:
            self.a, self.b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                enable_timing=True)
            self.a.record()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            self.b.record()
            self.b.synchronize()
            self.seconds = self.a.elapsed_time(self.b) / 1000
        else:
            self.seconds = time.perf_counter() - self.t0


def _valid_backends(backends, *, crop, **counts) -> list[str]:
    """The backends, each once in the order given; raises ValueError on a bad argument."""
    backends = list(dict.fromkeys(backends))
    bad = [b for b in backends if b not in CONTENDERS]
    if bad or not backends:
        raise ValueError(f"backends={','.join(bad) or '(none)'} is not valid; choose from "
                         f"{', '.join(CONTENDERS)}")
    for name, v in counts.items():
        integer(name, v, 0 if name == "warmup" else 1)
    integer("crop", crop, 1, optional=True)
    return backends


def _open_sets(out) -> list:
    from fastdata.shards import ShardSet

    sets = [ShardSet(p) for p in ([out] if isinstance(out, (str, os.PathLike)) else out)]
    if not sets:
        raise ValueError("give at least one shard set")
    return sets


def _common_size(sets, size: int | None) -> int:
    """``size``, or the largest stored size that every set holds; each set must hold it."""
    common = set.intersection(*(set(d.sizes) for d in sets))
    if size is None and not common:
        raise ValueError("the shard sets share no stored size (" + "; ".join(
            f"{d.location}: {', '.join(map(str, d.sizes))}" for d in sets) + ")")
    size = max(common) if size is None else size
    for d in sets:
        d.stored_size(size)    # names the set and its sizes
    return size


def _source_folder(source: str | None, ds) -> str | None:
    """The baseline's image folder: ``source``, else the manifest's where it still exists."""
    if source is not None and not os.path.isdir(source):
        raise ValueError(f"source={source!r} is not a directory (the baseline's image folder)")
    src = source or ds.manifest.get("source")
    return src if src and os.path.isdir(src) else None


class Bench:
    def __init__(self, out, *, source: str | None = None, backends=CONTENDERS,
                 model: str = "none", batch_size: int = 64, size: int | None = None,
                 crop: int | None = None, warmup: int = 5, batches: int = 50, repeat: int = 3,
                 device=None, precision: str | None = None, num_workers: int | None = None,
                 seed: int = 0, channels_last: bool | None = None, profile: str | None = None,
                 compile: bool | str = False, model_threads: int | None = None):
        """``out``: a shard set's path, or several (the fastdata backends run on each; they
        must share the stored ``size``, by default the largest they all hold).
        ``channels_last``: the fastdata loaders' layout (default: channels_last with a model,
        the layout the step runs it in; without one, the device's default).
        ``profile``: a folder for a ``torch.profiler`` trace of a few batches of each row
        (each fed to the step where there is a model), ``<row>.pt.trace.json``: TensorBoard's
        profiler plugin and Perfetto read it.
        ``compile``: the model through ``torch.compile`` (a backend's name, or True for its
        default), fed and ceiling alike: what a compiled training run has to be fed.
        ``model_threads``: on a CPU device, the intra-op threads the model's step runs on, fed
        and ceiling alike (default 1: parallel ops spin waiting for one another, and on cores
        that anything else uses, the loader's workers included, their time then follows the
        scheduler more than the model: runs 2x apart, where one thread's repeat)."""
        from fastdata.train.step import default_precision, input_dtype

        backends = _valid_backends(backends, batch_size=batch_size, batches=batches, repeat=repeat,
                            warmup=warmup, crop=crop)
        self.sets = _open_sets(out)
        self.ds = self.sets[0]          # the ceiling's images; its manifest names the source
        self.size = _common_size(self.sets, size)
        self.crop = crop or min(224, self.size)
        self.device = resolve_device(device)
        self.precision = precision or default_precision(self.device)
        self.dtype = input_dtype(self.precision, self.device)
        self.source = _source_folder(source, self.ds)
        self.backends, self.model_name = backends, model
        self.batch_size, self.warmup, self.batches, self.repeat = batch_size, warmup, batches, \
            repeat
        self.num_workers = num_workers if num_workers is not None else min(8, usable_cpus())
        self.seed = seed
        self.channels_last = True if channels_last is None and model != "none" \
            else channels_last
        self._latch = SigintLatch(enabled=False)        # run() installs one
        self.profile = profile
        self.compile = compile
        self.model_threads = integer("model_threads", 1 if model_threads is None
                                     else model_threads, 1)
        if compile and model == "none":
            raise ValueError("compile applies to a model: give one (--model)")
        if profile is not None:
            os.makedirs(profile, exist_ok=True)

    # ---- loaders ----
    def _loader(self, backend: str, ds):
        if backend == "baseline":
            from fastdata.bench.baseline import baseline_loader

            if self.ds.label_kind in SPATIAL_KINDS:
                raise _Skip(f"the baseline reads class folders, not a {self.ds.label_kind} "
                            f"set's labels (benchmarks/loading/detection_cpu.py compares a "
                            f"per-sample detection pipeline)")
            if self.source is None:
                raise _Skip(f"no source image folder: give --source (the manifest's "
                            f"{self.ds.manifest.get('source')!r} is not there)")
            # the inputs a conversion of this folder skipped as unreadable: not read here
            # either (they would stop the baseline), so it reads the images the shards hold
            real = os.path.realpath(self.source)
            skipped = {s["path"] for d in self.sets if d.manifest.get("source")
                       and os.path.realpath(d.manifest["source"]) == real
                       for s in d.manifest.get("skipped", ())}
            dl, ds = baseline_loader(self.source, batch_size=self.batch_size, crop=self.crop,
                                     num_workers=self.num_workers, device=self.device,
                                     seed=self.seed, exclude=skipped)
            return dl, ds.kind + (f", {len(skipped)} unreadable input(s) left out as in the "
                                  f"shards" if skipped else "")
        if backend == "dali":
            ok, why = available("nvidia.dali")
            if not ok:
                raise _Skip(why)
        from fastdata.loader import Loader

        loader = Loader(ds, backend=backend, batch_size=self.batch_size, train=True,
                        size=self.size, crop=self.crop, device=self.device, dtype=self.dtype,
                        channels_last=self.channels_last, num_workers=self.num_workers,
                        seed=self.seed)
        layout = "channels_last" if loader.channels_last else "NCHW"
        return loader, f"{ds.container} {ds.encoding} {self.size}px {layout}"

    def _to_device(self, x, y):
        from fastdata.ops.targets import map_tensors

        return x.to(self.device, non_blocking=True), map_tensors(
            lambda t: t.to(self.device, non_blocking=True), y)

    def loader_only(self, it, bar) -> dict:
        for _ in range(self.warmup):
            next(it)
        runs, rss = [], []
        for _ in range(self.repeat):
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            t0, n = time.perf_counter(), 0
            for _ in range(self.batches):
                x, y = self._to_device(*next(it))
                n += len(x)
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            runs.append(n / (time.perf_counter() - t0))
            rss.append(rss_tree_mb())
            bar.update()
        return {"img_per_s": _stats(runs), "rss": rss}

    # ---- model ----
    def _step(self):
        from fastdata.train import TrainStep, build_model

        torch.manual_seed(self.seed)
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True       # as `fit` trains: fixed shapes here
        from fastdata.train.step import loss_for

        model = build_model(self.model_name, len(self.ds.classes)).to(self.device)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        kind = self.ds.label_kind       # a detection model computes its own losses
        loss = None if kind in ("class", "detection") else loss_for(kind)
        # the loaders' layout (by default channels_last on every device, as `fastdata train`):
        # every backend and the ceiling then run the same computation (the baseline's NCHW
        # batches are converted per step)
        return TrainStep(model, opt, loss_fn=loss, precision=self.precision,
                         channels_last=bool(self.channels_last), compile=self.compile)

    @functools.cached_property
    def _fixed_batch(self):
        """One batch of the set's own images (centre crops, normalised) and labels, on the
        device in the step's layout: the model sees the same kind of data as when fed. (The
        layout matters: an NCHW batch here against channels_last loader batches made fed runs
        read above the ceiling on a CPU.)"""
        from fastdata.ops.crop import CropStage
        from fastdata.ops.targets import Targets, batch_targets

        idx = [k % len(self.ds) for k in range(self.batch_size)]
        raw = torch.from_numpy(self.ds.read_batch(idx, size=self.size))
        stage = CropStage(train=False, crop=self.crop, dtype=self.dtype,
                          channels_last=bool(self.channels_last))
        params = stage.params(len(idx), self.size, self.size, None)
        x = stage(raw, params=params)
        if self.ds.label_kind in SPATIAL_KINDS:     # a detection or segmentation set's targets
            return self._to_device(x, batch_targets(self.ds, idx, params,
                                                    self.size, self.crop, Targets()))
        return self._to_device(x, torch.from_numpy(self.ds.labels[idx]).long())

    def warm_ceiling(self, step) -> None:
        """``warmup`` steps on the fixed batch before any loader starts (a compiled model
        compiles here)."""
        x, y = self._fixed_batch
        for _ in range(self.warmup):
            self._latch.check()
            step(x, y)

    def ceiling(self, step, bar) -> float:
        """One run of ``step`` on one fixed on-device batch (images/s), while the loader's
        workers wait with their read-ahead full: nothing competes with the model."""
        x, y = self._fixed_batch
        with _Clock(self.device) as c:
            for _ in range(self.batches):
                self._latch.check()
                step(x, y)
        bar.update()
        return self.batch_size * self.batches / c.seconds

    def fed(self, step, it, bar) -> dict:
        """The same ``step`` fed by the loader, each run between two ceiling runs: each run's
        share of the ceiling is against the runs just before and after it, so a machine whose
        load changes over the bench moves both sides of each share alike."""
        for _ in range(self.warmup):
            step(*self._to_device(*next(it)))
        ceil = [self.ceiling(step, bar)]
        runs, waits, rss = [], [], []
        for _ in range(self.repeat):
            wait, n = 0.0, 0
            with _Clock(self.device) as c:
                for _ in range(self.batches):
                    t = time.perf_counter()
                    xb, yb = self._to_device(*next(it))
                    wait += time.perf_counter() - t
                    step(xb, yb)
                    n += len(xb)
            runs.append(n / c.seconds)
            waits.append(wait / c.seconds)
            rss.append(rss_tree_mb())
            bar.update()
            ceil.append(self.ceiling(step, bar))
        shares = [f / math.sqrt(a * b) for f, a, b in zip(runs, ceil, ceil[1:])]
        return {"img_per_s": _stats(runs), "data_wait_frac": statistics.median(waits),
                "rss": rss, "ceiling": ceil, "shares": shares}

    def _profile(self, folder: str, label: str, it, step) -> str:
        """``PROFILE_BATCHES`` batches of a row under ``torch.profiler`` (each fed to ``step``
        where there is one), its trace written into ``folder``; returns its path."""
        from torch.profiler import ProfilerActivity, profile, record_function

        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        with profile(activities=activities) as prof:
            for _ in range(PROFILE_BATCHES):
                with record_function("fastdata: next batch"):
                    x, y = self._to_device(*next(it))
                if step is not None:
                    with record_function("fastdata: step"):
                        step(x, y)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", label)
        path = os.path.join(folder, f"{name}.pt.trace.json")
        prof.export_chrome_trace(path)
        return path

    # ---- the run ----
    def _rows(self) -> list[tuple]:
        """(backend, shard set or None, label): the baseline once, the others on every set."""
        rows = []
        for name in self.backends:
            for ds in ([None] if name == "baseline" else self.sets):
                if ds is None or len(self.sets) == 1:
                    label = name
                elif sum((d.container, d.encoding) == (ds.container, ds.encoding)
                         for d in self.sets) > 1:
                    label = f"{name} {os.path.basename(ds.location.rstrip('/'))}"
                else:
                    label = f"{name} {ds.container} {ds.encoding}"
                rows.append((name, ds, label))
        return rows

    @property
    def _runs_per_row(self) -> int:
        """Timed runs per row (the progress bar's unit): loader only, or with a model also
        fed and the ceiling before and after each fed run."""
        return self.repeat * 3 + 1 if self.model_name != "none" else self.repeat

    def _row(self, name, ds, row, bar) -> dict:
        """One backend on one shard set (or the baseline): its figures, its loader closed."""
        with_model = self.model_name != "none"
        try:
            loader, what = self._loader(name, ds)
        except _Skip as e:
            bar.update(self._runs_per_row)
            return {**row, "status": "skipped", "reason": str(e)}
        it = None
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        try:
            if with_model:              # loaders start their threads on the first next()
                step = self._step()
                self.warm_ceiling(step)
            it = _forever(loader, self._latch.check)
            rec = {**row, "status": "ok", "what": what}
            lo = self.loader_only(it, bar)
            rec["loader"] = {"img_per_s": lo["img_per_s"]}
            rss = lo["rss"]
            if with_model:
                f = self.fed(step, it, bar)
                rss += f.pop("rss")
            if self.profile is not None:
                rec["profile"] = self._profile(self.profile, row["label"], it,
                                               step if with_model else None)
        finally:
            if it is not None:
                it.close()
            if hasattr(loader, "close"):
                loader.close()
            if ds is not None:          # its maps' pages would count in the next rows' PSS
                ds.close()
            del it, loader              # the baseline's persistent workers must not linger
            gc.collect()                # into the next backend's memory figures
        rss = [r for r in rss if r is not None]
        rec["peak_pss_mb"] = max(rss) if rss else None
        rec["peak_gpu_mb"] = (torch.cuda.max_memory_allocated(self.device) / 2**20
                              if self.device.type == "cuda" else None)
        if with_model:
            ceil, shares = f.pop("ceiling"), f.pop("shares")
            rec["model"] = {"name": self.model_name, **f, "ceiling": _stats(ceil),
                            "fraction_of_ceiling": statistics.median(shares),
                            # what run-to-run noise allows: the runs' shares, least and most
                            "fraction_range": [min(shares), max(shares)]}
        return rec

    def run(self, progress: bool = True) -> dict:
        """Every row; a Ctrl-C (in the main thread) stops at the next batch and the report
        keeps the rows done, the others marked "interrupted" (``report["interrupted"]``)."""
        from tqdm import tqdm

        from fastdata.env import env_info

        rows = self._rows()
        results = []
        self._latch = SigintLatch()
        threads = torch.get_num_threads()
        if self.device.type == "cpu":
            torch.set_num_threads(self.model_threads)
        try:
            with tqdm(total=len(rows) * self._runs_per_row, desc="bench", unit="run",
                      disable=not progress) as bar:
                for name, ds, label in rows:
                    bar.set_description(f"bench: {label}")
                    row = {"backend": name, "label": label, "shards": ds and ds.location}
                    if self._latch.hit:
                        results.append({**row, "status": "interrupted"})
                        continue
                    try:
                        results.append(self._row(name, ds, row, bar))
                    except KeyboardInterrupt:
                        self._latch.hit = True
                        results.append({**row, "status": "interrupted"})
        finally:
            self._latch.restore()
            torch.set_num_threads(threads)
        ceiling = [c for r in results if "model" in r for c in r["model"]["ceiling"]["runs"]]
        base = next((r for r in results if r["backend"] == "baseline" and r["status"] == "ok"),
                    None)
        for r in results:
            if base and r["status"] == "ok":
                r["loader"]["vs_baseline"] = (r["loader"]["img_per_s"]["median"]
                                              / base["loader"]["img_per_s"]["median"])
        env = env_info()
        return {
            "schema": SCHEMA,
            "config": {"shard_sets": [{"path": d.location, "container": d.container,
                                       "encoding": d.encoding, "sizes": list(d.sizes)}
                                      for d in self.sets], "size": self.size, "crop": self.crop,
                       "source": self.source, "model": self.model_name,
                       "compile": self.compile,
                       "model_threads": self.model_threads if self.device.type == "cpu"
                       else None,
                       "batch_size": self.batch_size, "warmup": self.warmup,
                       "batches": self.batches, "repeat": self.repeat,
                       "device": str(self.device), "precision": self.precision,
                       "dtype": str(self.dtype).replace("torch.", ""),
                       "num_workers": self.num_workers, "host_cores": usable_cpus()},
            "env": env,
            "ceiling": {"model": self.model_name, "img_per_s": _stats(ceiling)}
            if ceiling else None,
            "results": results,
            "interrupted": self._latch.hit,
        }


class _Skip(Exception):
    pass
