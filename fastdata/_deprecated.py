"""Old import paths kept for one release: each module at an old path forwards its names to the
new one with a ``DeprecationWarning`` naming it."""
from __future__ import annotations

import importlib
import warnings


def forward(old: str, new: str, name: str):
    """Attribute ``name`` of module ``new``, for a ``__getattr__`` of module ``old``.

    Raises:
        AttributeError: ``new`` has no ``name``.
    """
    if name.startswith("__"):
        raise AttributeError(name)
    warnings.warn(f"{old} is deprecated and goes in the next release; import {name} from "
                  f"{new} instead", DeprecationWarning, stacklevel=3)
    return getattr(importlib.import_module(new), name)
