"""The machine as fastdata sees it: the cores and the memory a process may use."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity")
def test_worker_defaults_follow_the_cpus_this_process_may_use(shards, tmp_path):
    """A job pinned to 1 CPU (taskset, a Slurm cpuset) defaults to 1 worker, not one per core
    of the machine; a cgroup CPU quota (docker --cpus) caps it the same way."""
    from fastdata.env import usable_cpus

    code = ("import os, fastdata; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            f"print(fastdata.Loader({shards['hdf5']!r}, batch_size=4, device='cpu')"
            f".backend.host.num_workers)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1"

    mine, checked = len(os.sched_getaffinity(0)), 0
    for v1, (quota, period) in [(False, ("50000", "100000")), (True, ("50000", "100000")),
                                (False, ("max", "100000")), (True, ("-1", "100000"))]:
        root = tmp_path / f"{v1}-{quota}"
        files = {"cpu.cfs_quota_us": quota, "cpu.cfs_period_us": period} if v1 else \
            {"cpu.max": f"{quota} {period}"}
        if _stand_in_cgroups(root, "cpu" if v1 else "", files):
            assert usable_cpus(str(root)) == (1 if quota == "50000" else mine), (v1, quota)
            checked += 1
    # a container's view: its own cgroup at the root, where /proc/self/cgroup names a host path
    (tmp_path / "container").mkdir()
    (tmp_path / "container" / "cpu.max").write_text("50000 100000\n")
    with open("/proc/self/cgroup") as f:
        if any(line.startswith("0::") for line in f):               # a v2 hierarchy
            assert usable_cpus(str(tmp_path / "container")) == 1
            checked += 1
    if not checked:
        pytest.skip(NO_CGROUPS)


NO_CGROUPS = "the affinity case passed; this host shows no cgroup hierarchy to stand in for"


def _stand_in_cgroups(root, controller: str, files: dict):
    """Writes ``files`` into this process's cgroup of ``controller`` ("" for v2's unified
    hierarchy) under a stand-in root: that folder, or None where the host has no such
    hierarchy."""
    with open("/proc/self/cgroup") as f:
        groups = [line.rstrip("\n").split(":", 2) for line in f]
    for _, controllers, path in groups:
        if controllers == controller or (controller and controller in controllers.split(",")):
            d = root / (controllers if controller else "") / path.lstrip("/")
            d.mkdir(parents=True, exist_ok=True)
            for name, text in files.items():
                (d / name).write_text(text + "\n")
            return d
    return None


def test_usable_memory_follows_a_cgroup_memory_limit(tmp_path):
    """In a container limited to 2 GiB (docker --memory, a Kubernetes limit) the convert's
    memory check must count 2 GiB, not the machine: beyond the limit is the OOM killer."""
    from fastdata.env import usable_memory

    machine, checked = usable_memory(str(tmp_path / "none")), 0
    assert machine == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for v1, limit in [(False, "2147483648"), (True, "2147483648"), (False, "max"),
                      (True, str(2**63 - 4096))]:                 # v1's "no limit"
        root = tmp_path / f"{v1}-{limit}"
        name = "memory.limit_in_bytes" if v1 else "memory.max"
        if _stand_in_cgroups(root, "memory" if v1 else "", {name: limit}):
            expect = min(machine, 2**31) if limit == "2147483648" else machine
            assert usable_memory(str(root)) == expect, (v1, limit)
            checked += 1
    # a limit on a parent cgroup (a systemd slice, a pod) applies below it too
    for v1, name in [(False, "memory.max"), (True, "memory.limit_in_bytes")]:
        root = tmp_path / f"parent-{v1}"
        leaf = _stand_in_cgroups(root, "memory" if v1 else "", {name: "max" if not v1 else
                                                                str(2**63 - 4096)})
        if leaf is not None and leaf != root / ("memory" if v1 else ""):
            (leaf.parent / name).write_text("1073741824\n")
            assert usable_memory(str(root)) == min(machine, 2**30), v1
            checked += 1
    if not checked:
        pytest.skip("no cgroup hierarchy on this host to stand in for (the machine's memory "
                    "case passed)")


def test_available_memory_leaves_out_what_a_cgroup_holds_besides_file_pages(tmp_path):
    """Whether a set is read ahead at random depends on the memory more page cache could
    take: in a 2 GiB cgroup whose processes hold 1.5 GiB, 1 GiB of it file pages (which the
    cache gives up), that is 1.5 GiB, not the limit."""
    from fastdata.env import available_memory

    machine, checked = available_memory(str(tmp_path / "none")), 0      # MemAvailable
    assert 0 < machine <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for v1 in (False, True):
        files = ({"memory.limit_in_bytes": str(2 << 30), "memory.usage_in_bytes": str(3 << 29),
                  "memory.stat": f"cache 4096\nrss {1 << 29}\ntotal_cache {1 << 30}"} if v1 else
                 {"memory.max": str(2 << 30), "memory.current": str(3 << 29),
                  "memory.stat": f"anon {1 << 29}\nfile {1 << 30}"})
        if _stand_in_cgroups(tmp_path / f"v1-{v1}", "memory" if v1 else "", files):
            got = available_memory(str(tmp_path / f"v1-{v1}"))
            assert got == 3 << 29 or (got < 3 << 29 and machine < 2 << 30), (v1, got)
            checked += 1
    if not checked:
        pytest.skip("no cgroup hierarchy on this host to stand in for (MemAvailable passed)")
