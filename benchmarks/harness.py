"""What the benchmark scripts share: interleaved rounds, the CPU time of a process tree, the
machine's facts, and results written as JSON in one schema (``benchmarks/README.md``).

A script imports it as ``from benchmarks.harness import ...`` (scripts run as modules from the
repository's root: ``benchmarks/README.md``).
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable

#: the version of the results' JSON layout (``benchmarks/README.md``)
SCHEMA = 1


def interleaved(variants: dict[str, Callable[[], dict]], rounds: int) -> dict[str, list[dict]]:
    """Each variant's ``fn()`` once a round, the order reversed every other round so that a
    drift of the machine's speed hits every variant alike; each variant's results, a dict of
    figures per round."""
    runs: dict[str, list[dict]] = {k: [] for k in variants}
    names = list(variants)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            runs[name].append(variants[name]())
    return runs


def fresh_run(code: str, *args: str, env: dict | None = None) -> dict:
    """``code`` run with ``args`` in a fresh interpreter (warnings off, the repository's root
    on its path, ``env`` added to the environment): the last line it prints, read as JSON."""
    env = {**os.environ, "PYTHONPATH": os.getcwd(), **(env or {})}
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code, *args], check=True,
                         capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def medians(runs: list[dict]) -> dict:
    """The median of each figure over a variant's rounds."""
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]} if runs else {}


def _tree(pid: int) -> list[int]:
    kids: list[str] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids += f.read().split()
            except OSError:
                pass
    except OSError:
        return []
    return [pid] + [q for k in kids for q in _tree(int(k))]


def tree_cpu_seconds() -> float:
    """CPU seconds of this process, of its live descendants (a loader's worker processes, kept
    from one epoch to the next) and of the children already waited for."""
    ticks = 0
    for pid in _tree(os.getpid()):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])     # utime, stime
        except (OSError, IndexError):
            pass
    t = os.times()
    if not ticks:       # no /proc: this process's own times
        return t.user + t.system + t.children_user + t.children_system
    return ticks / os.sysconf("SC_CLK_TCK") + t.children_user + t.children_system


def peak_rss_mib() -> float:
    """This process's peak resident memory in MiB, from ``/proc/self/status``' ``VmHWM``
    (``getrusage``'s ``ru_maxrss`` keeps the peak of the process it was forked from, before
    its ``exec``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    """What a figure was measured on: CPU model and usable cores, Python, torch, PIL (and
    whether it is pillow-simd), the GPU, the commit, the date."""
    facts: dict = {"cpu": _cpu_model(), "cores": len(os.sched_getaffinity(0)),
                   "python": platform.python_version(),
                   "date": datetime.date.today().isoformat()}
    for name in ("torch", "PIL", "fastdata"):
        try:
            facts[name] = getattr(__import__(name), "__version__", "?")
        except ImportError:
            pass
    try:
        import torch

        if torch.cuda.is_available():
            facts["gpu"] = torch.cuda.get_device_name()
    except ImportError:
        pass
    try:
        facts["commit"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        facts["commit"] = None
    return facts


def write_results(path: str, benchmark: str, rows: list[dict]) -> None:
    """The results of one run as JSON at ``path`` (its folder made): ``{"schema",
    "benchmark", "command", "machine", "rows"}`` (``benchmarks/README.md``)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    doc = {"schema": SCHEMA, "benchmark": benchmark,
           "command": " ".join(["python", *sys.orig_argv[1:]]),
           "machine": machine(), "rows": rows}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
