"""Optional dependencies, imported only when a feature needs them; the error names the extra."""
from __future__ import annotations

import importlib

#: this package's name on the package index (its import name, fastdata, is another project's
#: there): every install hint names it
DISTRIBUTION = "fastdata-shards"

EXTRAS = {"nvidia.dali": ("dali", "NVIDIA DALI"), "matplotlib": ("plot", "matplotlib"),
          "torchvision": (None, "torchvision"), "lightning": ("lightning", "Lightning"),
          "ray": ("ray", "Ray"), "obstore": ("remote", "obstore"), "fsspec": ("fsspec", "fsspec"),
          "pyarrow": ("parquet", "pyarrow")}


def require(module: str, feature: str):
    """Import ``module`` or raise ImportError saying what to install for ``feature``."""
    try:
        return importlib.import_module(module)
    except Exception as e:      # missing, or present but broken (e.g. built for another torch)
        extra, name = EXTRAS.get(module.split(".plugin")[0], (None, module))
        how = f"pip install '{DISTRIBUTION}[{extra}]'" if extra else f"pip install {name}"
        raise ImportError(f"{feature} needs {name} ({type(e).__name__}: {e}); install it with: "
                          f"{how}") from None


def available(module: str) -> tuple[bool, str]:
    """(importable, reason if not) without raising."""
    try:
        require(module, module)
        return True, ""
    except ImportError as e:
        return False, str(e)
