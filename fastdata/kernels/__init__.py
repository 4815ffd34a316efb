"""Compiled kernels, each loaded lazily and at most once per process.

- ``_native`` (``_native.c``): the CPU image kernels (crop and resize, colour, the converter's
  pixel packing); ``fastdata.kernels.cpu`` checks their arguments.
- ``_guard`` (``_guard.c``): the fault guard of shard maps (``fastdata.shards.mapped``).
- ``_jpeg`` (``_jpeg.c``): JPEG records decoded where their crops need them, with
  libjpeg-turbo; ``fastdata.kernels.jpeg`` checks their arguments.
- ``fastdata.kernels.gpu``: the GPU kernels, where Triton imports.

Each loader returns the module, or None where it was not built or does not import; callers
fall back to torch operations (typed ``Any``: compiled modules have no stubs). Nothing here
imports torch.
"""
from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import Any


@functools.cache
def native() -> Any:
    """The C image kernels, or None where they were not built."""
    return _optional("fastdata.kernels._native")


@functools.cache
def guard() -> Any:
    """The fault guard, or None where it was not built (or on a platform without SIGBUS)."""
    module = _optional("fastdata.kernels._guard")
    return module if module is not None and hasattr(module, "guard") else None


@functools.cache
def jpeg_decoder() -> Any:
    """The JPEG region decoder, or None where it was not built."""
    return _optional("fastdata.kernels._jpeg")


@functools.cache
def triton() -> Any:
    """``fastdata.kernels.gpu`` where Triton imports, else None."""
    try:
        return importlib.import_module("fastdata.kernels.gpu")
    except Exception:  # noqa: BLE001 - no Triton, or a broken one: the torch operations
        return None


def _optional(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
