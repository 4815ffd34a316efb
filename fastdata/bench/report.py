"""``fastdata bench``'s report: the table, the reliability of a row, and the plot."""
from __future__ import annotations

import os

from fastdata._optional import require

SCHEMA = "fastdata-bench/2"      # 2: several shard sets (config "shard_sets", per-row "shards")


def table(report: dict) -> str:
    """The report as a fixed-width text table."""
    c = report["config"]
    sets = ", ".join(f"{d['path']} ({d['container']}, {d['encoding']})" for d in c["shard_sets"])
    cores = c.get("host_cores")
    lines = [f"{sets}: {c['size']}px → crop {c['crop']}, batch {c['batch_size']}, "
             f"{c['device']}" + (f" on {cores} host core{'s' * (cores > 1)}" if cores else "")
             + (f" (the model on {c['model_threads']} thread"
                f"{'s' * (c['model_threads'] > 1)})" if c.get("model_threads") and
                report["ceiling"] else "")
             + f", {c['batches']} batches × {c['repeat']} runs"]
    w = max([9] + [len(r["label"]) for r in report["results"]])
    gpu = any(r.get("peak_gpu_mb") is not None for r in report["results"])
    head = f"{'loader':<{w}} {'loader img/s':>13} {'(min-max)':>15} {'× base':>7}"
    if report["ceiling"]:
        head += f" {'model img/s':>12} {'ceiling':>8} {'% ceiling':>9} {'data wait':>9}"
    head += (f" {'img/s/core':>10}" if cores else "") + f" {'peak PSS':>9}" \
        + (f" {'peak GPU':>9}" if gpu else "")
    lines += [head, "-" * len(head)]
    lines += [_row(r, report, w, cores, gpu) for r in report["results"]]
    if report["ceiling"]:
        compiled = c.get("compile")
        how = "" if not compiled else " (torch.compile" + (
            f", backend {compiled}" if isinstance(compiled, str) else "") + ", fed and ceiling)"
        lines.append(f"ceiling = {report['ceiling']['model']}{how} on one fixed on-device "
                     f"batch, run before and after each fed run")
        lines += [note for r in report["results"] if r.get("model")
                  for note in [_ceiling_note(r["label"], r["model"])] if note]
    return "\n".join(lines)


def _row(r: dict, report: dict, w: int, cores: int | None, gpu: bool) -> str:
    """One row of ``table``."""
    if r["status"] != "ok":
        return (f"{r['label']:<{w}} {r['status']}"
                + (f": {r['reason']}" if "reason" in r else " (Ctrl-C)"))
    s = r["loader"]["img_per_s"]
    vs = r["loader"].get("vs_baseline")
    spread = f"{s['min']:.0f}-{s['max']:.0f}"
    times = f"{vs:.1f}x" if vs else "-"
    row = f"{r['label']:<{w}} {s['median']:>13.0f} {spread:>15} {times:>7}"
    if report["ceiling"]:
        m = r["model"]
        share = "unreliable" if unreliable(m) else f"{m['fraction_of_ceiling']:.0%}"
        row += (f" {m['img_per_s']['median']:>12.0f} {m['ceiling']['median']:>8.0f} "
                f"{share:>9} {m['data_wait_frac']:>9.0%}")
    if cores:           # what each host core gives: the fed rate where a model ran
        rate = r["model"]["img_per_s"]["median"] if report["ceiling"] else s["median"]
        row += f" {rate / cores:>10.0f}"
    return row + _megabytes(r["peak_pss_mb"]) + (_megabytes(r.get("peak_gpu_mb")) if gpu else "")


def _megabytes(mb: float | None) -> str:
    return f" {mb:>6.0f} MB" if mb is not None else f" {'-':>9}"


def _ceiling_note(label: str, m: dict) -> str:
    """What the table's share of the ceiling does not say for a fed row, if anything."""
    lo, hi = m["fraction_range"]
    if unreliable(m):
        return (f"{label}: unreliable: the runs put it at {lo:.0%}-{hi:.0%} of its ceiling; "
                f"use more --batches and --repeat, or a quieter machine")
    if m["fraction_of_ceiling"] > 1:
        why = ("within run-to-run noise; more --batches/--repeat narrow it" if lo <= 1
               else "in every pairing of the runs")
        return f"{label}: fed above its ceiling ({lo:.0%}-{hi:.0%} over the runs), {why}"
    return ""


#: the runs of a fed row may put it this many times higher, against its ceiling, in their best
#: pairing than in their worst before its share of the ceiling means nothing
UNRELIABLE_SPREAD = 2.0


#: a loader cannot feed a model faster than it runs on one batch on the device: a row above
#: this share of its ceiling in every pairing had its ceiling runs disturbed
UNRELIABLE_ABOVE = 1.25


def unreliable(model: dict) -> bool:
    """Whether a fed row's runs disagree too much for its share of the ceiling to mean
    anything (a busy machine, or too few batches)."""
    lo, hi = model["fraction_range"]
    return hi > UNRELIABLE_SPREAD * lo or lo > UNRELIABLE_ABOVE


def check_plot_path(path: str) -> None:
    """Before the timing: matplotlib installed, and a file type it writes (no suffix: PNG)."""
    require("matplotlib", "--plot")
    from matplotlib.figure import Figure

    kinds = Figure().canvas.get_supported_filetypes()
    kind = os.path.splitext(path)[1].lstrip(".").lower()
    if kind and kind not in kinds:
        raise ValueError(f"--plot {path}: matplotlib cannot write {kind!r} files; use one of "
                         f"{', '.join(sorted(kinds))} (e.g. bench.png)")


def _plot_fed(ax, ok: list[dict], model: str) -> None:
    """The fed panel: model img/s per row, each with its own ceiling (taken around its loader:
    drift moves both); a bar above its ceiling is hatched, an unreliable one greyed."""
    fed = [r["model"]["img_per_s"] for r in ok]
    colours = ["0.75" if unreliable(r["model"]) else "tab:green" for r in ok]
    err = [[f["median"] - f["min"] for f in fed], [f["max"] - f["median"] for f in fed]]
    bars = ax.bar(range(len(ok)), [f["median"] for f in fed], color=colours, capsize=4,
                  tick_label=[r["label"] for r in ok], yerr=err)
    for bar, r in zip(bars, ok):
        if r["model"]["fraction_of_ceiling"] > 1:
            bar.set_hatch("//")
    ax.scatter(range(len(ok)), [r["model"]["ceiling"]["median"] for r in ok], marker="_",
               s=1500, linewidths=2, color="tab:red", zorder=3, label="ceiling (its runs)")
    ax.bar([0], [0], color="white", edgecolor="black", hatch="//", label="above its ceiling")
    if "0.75" in colours:
        ax.bar([0], [0], color="0.75", label="unreliable (runs disagree)")
    ax.set_title(f"{model} fed by the loader")
    ax.set_ylim(0, max(max(f["max"] for f in fed),
                       max(r["model"]["ceiling"]["median"] for r in ok)))


def _fit_legend(ax) -> None:
    """The panel's legend in as many columns as its width holds, with room above the bars
    for its lines (after the figure's layout, which sets the width)."""
    renderer = ax.figure.canvas.get_renderer()
    entries = len(ax.get_legend_handles_labels()[0])
    for ncol in range(min(3, entries), 0, -1):
        legend = ax.legend(loc="upper center", ncol=ncol, framealpha=0.9, fontsize=7,
                           markerscale=0.4)
        if legend.get_window_extent(renderer).width <= ax.get_window_extent(renderer).width:
            break
    lines = -(-entries // ncol)
    ax.set_ylim(0, ax.get_ylim()[1] * (1.15 + 0.1 * lines))


def plot(report: dict, path: str) -> None:
    """Bar chart (PNG): loader-only img/s per backend, and model img/s vs the ceiling."""
    import matplotlib.pyplot as plt

    fig = figure(report)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def figure(report: dict):
    """``plot``'s matplotlib figure."""
    require("matplotlib", "--plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in report["results"] if r["status"] == "ok"]
    names = [r["label"] for r in ok]
    panels = 2 if report["ceiling"] else 1
    fig, axes = plt.subplots(1, panels, figsize=((2 + 0.8 * len(ok)) * panels + 1, 4.5),
                             squeeze=False)
    ax = axes[0][0]
    med = [r["loader"]["img_per_s"]["median"] for r in ok]
    err = [[m - r["loader"]["img_per_s"]["min"] for m, r in zip(med, ok)],
           [r["loader"]["img_per_s"]["max"] - m for m, r in zip(med, ok)]]
    ax.bar(names, med, yerr=err, color="tab:blue", capsize=4)
    ax.set_title("loader only")
    if report["ceiling"]:
        _plot_fed(axes[0][1], ok, report["ceiling"]["model"])
    c = report["config"]
    for ax in axes[0]:
        ax.set_ylabel("images / s")
        ax.tick_params(axis="x", labelrotation=20 if len(ok) > 3 else 0)
    fig.suptitle(f"{c['size']}px, crop {c['crop']}, batch {c['batch_size']}, {c['device']}")
    fig.text(0.01, 0.01, f"bars: median of {c['repeat']} runs; error bars: their min-max",
             fontsize=8, color="0.3")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    if report["ceiling"]:
        _fit_legend(axes[0][1])
    return fig
