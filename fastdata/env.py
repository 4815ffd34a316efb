"""Facts about the running environment: which PIL is live (pillow-simd or not), versions."""
from __future__ import annotations

import os
import platform
import warnings
from importlib import metadata

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


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def env_info() -> dict:
    import PIL
    import PIL.features

    import torch

    info = {
        "python": platform.python_version(),
        "fastdata": _version("fastdata"),
        "torch": torch.__version__,
        "numpy": _version("numpy"),
        "h5py": _version("h5py"),
        "lmdb": _version("lmdb"),
        "pil": PIL.__version__,
        "pil_simd": pil_is_simd(),
        "libjpeg_turbo": bool(PIL.features.check_feature("libjpeg_turbo")),
        "webp": bool(PIL.features.check("webp")),
        "simplejpeg": _version("simplejpeg"),
        "dali": _version("nvidia-dali-cuda120"),
        "torchvision": _version("torchvision"),
        "cpu_count": os.cpu_count(),
        "cuda": torch.cuda.is_available(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    return info
