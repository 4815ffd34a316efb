"""Facts about the running environment: which PIL is live (pillow-simd or not), versions, the
device to use (``resolve_device``), the CPUs to use (``usable_cpus``); what a fork of worker
processes needs (``parent_garbage_frozen``); and one process-wide setting for the CLI's CPU runs
(``keep_freed_memory``)."""
from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import platform
import warnings
from importlib import metadata

from fastdata._optional import DISTRIBUTION

SIMD_FIX = "pip install --force-reinstall --no-deps pillow-simd"


def pil_is_simd() -> bool:
    """True when the imported PIL is pillow-simd (its versions carry a ``.postN`` suffix).

    Any later ``pip install`` of a package that requires Pillow silently replaces pillow-simd
    with Pillow; this check sees the module actually imported, not what pip thinks.
    """
    import PIL

    return ".post" in PIL.__version__


def warn_if_not_simd() -> None:
    if not pil_is_simd():
        warnings.warn(f"the live PIL is Pillow, not pillow-simd: resizing is ~5x slower. "
                      f"Fix: {SIMD_FIX}", RuntimeWarning, stacklevel=3)


def resolve_device(device=None):
    """``device`` (None: CUDA when available, else the CPU) as a checked ``torch.device``."""
    import torch

    try:
        dev = torch.device(device if device is not None else
                           ("cuda" if torch.cuda.is_available() else "cpu"))
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r} is not valid; use 'cpu' or 'cuda[:N]'")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={str(device)!r} but CUDA is not available (torch "
                         f"{torch.__version__}); use device='cpu'")
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        raise ValueError(f"device={str(device)!r} is not valid; torch sees "
                         f"{torch.cuda.device_count()} CUDA device(s): "
                         f"'cuda:0'..'cuda:{torch.cuda.device_count() - 1}'")
    return dev


def usable_cpus(cgroup_root: str = "/sys/fs/cgroup") -> int:
    """CPUs this process may use: its affinity mask (``taskset``, Slurm's and containers'
    cpusets), capped by a cgroup CPU quota (``docker --cpus``, Kubernetes CPU limits), the
    default for worker counts. ``os.cpu_count()`` counts the whole machine: with it, a job given
    8 of a node's 128 cores would start 128 decode processes.
    """
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = _cgroup_cpu_quota(cgroup_root)
    return max(1, min(n, quota) if quota else n)


def local_world_size() -> int:
    """The ranks of this node: ``LOCAL_WORLD_SIZE`` as torchrun sets it, else 1."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def confine(cpus) -> None:
    """Run this process, every thread it has and every one and every process it starts later,
    on the cores ``cpus`` only (as ``taskset`` would have started it): a benchmark of what a
    GPU gets from the few host cores it has on a node.

    Raises:
        ValueError: a core that this process may not use.
    """
    cpus = set(cpus)
    allowed = os.sched_getaffinity(0)
    if not cpus or not cpus <= allowed:
        raise ValueError(f"cpus {_ranges(sorted(cpus))} are not all usable here; this process "
                         f"may use {_ranges(sorted(allowed))}")
    tasks = os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else ["0"]
    for tid in tasks:
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:      # a thread that has just ended
            pass


def _ranges(cpus: list[int]) -> str:
    """``[0, 1, 2, 5]`` → ``"0-2,5"`` (``taskset``'s notation)."""
    out, start = [], None
    for i, c in enumerate(cpus):
        if start is None:
            start = c
        if i + 1 == len(cpus) or cpus[i + 1] != c + 1:
            out.append(f"{start}-{c}" if c != start else f"{c}")
            start = None
    return ",".join(out)


def parse_cpus(text: str) -> set[int]:
    """``"0-3,8"`` → ``{0, 1, 2, 3, 8}``; a ValueError naming what is not a core list."""
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise ValueError(f"--cpus {text!r} is not a list of cores such as 0-3 or 0,2,4-7") \
            from None
    return cpus


def usable_memory(cgroup_root: str = "/sys/fs/cgroup") -> int | None:
    """Bytes of memory this process may use: the machine's, capped by a cgroup memory limit
    (``docker --memory``, Kubernetes memory limits), where going over is the OOM killer.
    None where the machine's size is unknown."""
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    for words in _cgroup_files(cgroup_root, "memory", ("memory.max",),
                               ("memory.limit_in_bytes",)):
        if words[0].isdigit():              # v2 writes "max" for no limit
            memory = min(memory, int(words[0]))
    return memory


def check_fits(what: str, nbytes: float, fix: str) -> None:
    """Refuse ``what`` where it needs ``nbytes`` of memory, more than is available now
    (``available_memory``): a hostile manifest or state is an error, not an OOM kill.

    Raises:
        ValueError: naming ``what``, the bytes it needs, those there are and ``fix``.
    """
    memory = available_memory()
    if memory is not None and nbytes > memory:
        raise ValueError(f"{what} needs {_gib(nbytes)} of memory, more than the "
                         f"{_gib(memory)} available: {fix}")


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:,.1f} GiB"


def available_memory(cgroup_root: str = "/sys/fs/cgroup") -> int | None:
    """Bytes that more page cache could take without pushing out anything but page cache:
    the machine's ``MemAvailable``, capped at each cgroup level by its limit less what the
    cgroup holds besides file pages (the program's own memory, other processes'). Where
    /proc/meminfo is missing, ``usable_memory()``."""
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f if ":" in line)
        memory = int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return usable_memory(cgroup_root)
    for words in _cgroup_files(cgroup_root, "memory", ("memory.max", "memory.current",
                                                       "memory.stat"),
                               ("memory.limit_in_bytes", "memory.usage_in_bytes",
                                "memory.stat")):
        stat = dict(zip(words[2::2], words[3::2]))
        file = str(stat.get("file", stat.get("total_cache", stat.get("cache", "0"))))  # v2, v1
        if words[0].isdigit() and words[1].isdigit() and file.isdigit():
            memory = min(memory, int(words[0]) - int(words[1]) + int(file))
    return max(memory, 0)


def _cgroup_cpu_quota(root: str) -> int | None:
    """ceil(quota / period) of this process's cgroup (v2 ``cpu.max``, v1 ``cpu.cfs_*``): the
    smallest on its way to the root."""
    quotas = []
    for words in _cgroup_files(root, "cpu", ("cpu.max",),
                               ("cpu.cfs_quota_us", "cpu.cfs_period_us")):
        try:
            quota, period = int(words[0]), int(words[1])
        except (ValueError, IndexError):   # v2 writes "max" for no quota
            continue
        if quota > 0 and period > 0:        # v1 writes -1 for no quota
            quotas.append(-(-quota // period))
    return min(quotas, default=None)


def _cgroup_files(root: str, controller: str, v2: tuple, v1: tuple):
    """The words of this process's cgroup files of ``controller`` (v2 names ``v2``, v1 names
    ``v1``, joined): in the cgroup /proc/self/cgroup names and each one above it (a limit on a
    parent applies too), up to the hierarchy's root, which is a container's own cgroup."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return
    for _, controllers, path in (line for line in lines if len(line) == 3):
        if controllers == "":
            base, names = root, v2
        elif controller in controllers.split(","):
            base, names = os.path.join(root, controllers), v1
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for d in (os.path.join(base, *parts[:k]) for k in range(len(parts), -1, -1)):
            try:
                words = []
                for name in names:
                    with open(os.path.join(d, name)) as f:
                        words += f.read().split()
            except OSError:
                continue
            if words:
                yield words


@contextlib.contextmanager
def parent_garbage_frozen():
    """Around the start of forked workers: this process's objects out of the garbage
    collector's reach (``gc.freeze``, as Python's docs advise before a fork) until they are
    forked, so that no child ever collects this process's garbage: a CUDA tensor left in a
    reference cycle and freed in a forked child aborts it ("CUDA error: initialization
    error"). It costs nothing, where a ``gc.collect()`` before the fork costs a pass over
    every object torch made. Objects the program froze itself stay frozen; its garbage since
    then is collected instead."""
    if gc.get_freeze_count():
        gc.collect()
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def keep_freed_memory(limit: int = 1 << 30) -> bool:
    """Have glibc's malloc keep freed blocks of up to ``limit`` bytes for reuse instead of
    unmapping them (``mallopt`` M_MMAP_THRESHOLD and M_TRIM_THRESHOLD).

    A training step on the CPU allocates its activations afresh at every step; by default
    glibc maps blocks this large anew each time and faults their pages in again, which this
    setting avoids. CUDA's caching allocator already does this for GPU memory.
    Process-wide, for programs (``fastdata train`` and ``bench`` on a CPU), not for library
    code. Returns False where there is no glibc ``mallopt``.
    """
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, limit)) and bool(
        mallopt(m_trim_threshold, min(2 * limit, 2**31 - 1)))


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def cpu_name() -> str:
    """The CPU's model as Linux names it, with its family and model numbers (a virtual machine
    may name only the vendor, "AMD EPYC"; the numbers still tell the generation), else what
    ``platform`` knows. Speed ratios between pipelines differ from one CPU to another."""
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if not key.strip():
                    break                       # the end of the first CPU's block
                fields.setdefault(key.strip(), value.strip())
    if "model name" in fields:
        return (f"{fields['model name']} (family {fields.get('cpu family', '?')}, "
                f"model {fields.get('model', '?')})")
    return platform.processor() or platform.machine()


def _dali_version() -> str | None:
    """DALI's version and build, whichever is installed: the ``[dali]`` extra's
    nvidia-dali-cuda120, or the builds for other CUDA versions (cuda110, cuda130)."""
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name.startswith("nvidia-dali"):
            return f"{dist.version} ({name})"
    return None


def env_info() -> dict:
    import PIL
    import PIL.features
    import torch

    from fastdata import kernels

    memory = usable_memory()
    info = {
        "python": platform.python_version(),
        "fastdata": _version(DISTRIBUTION),
        "torch": torch.__version__,
        "numpy": _version("numpy"),
        "h5py": _version("h5py"),
        "lmdb": _version("lmdb"),
        "pil": PIL.__version__,
        "pil_simd": pil_is_simd(),
        "libjpeg_turbo": bool(PIL.features.check_feature("libjpeg_turbo")),
        "webp": bool(PIL.features.check("webp")),
        "simplejpeg": _version("simplejpeg"),
        "native_kernel": kernels.native() is not None,    # kernels/_native.c, built at install
        "dali": _dali_version(),
        "torchvision": _version("torchvision"),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable_cpus(),
        "usable_memory_gib": round(memory / 2**30, 1) if memory else None,
        "cuda": torch.cuda.is_available(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    return info
