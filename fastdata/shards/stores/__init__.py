"""Where a shard set's objects live, behind one small class: ``Store`` (read, download,
list, write by name), chosen by a URL's scheme from ``STORES``.

* ``file://``: a local folder (``local.LocalStore``);
* ``s3://``, ``gs://``, ``az://``, ``http(s)://``: obstore (``objectstore.ObjectStore``,
  ``pip install 'fastdata-shards[remote]'``);
* any other scheme fsspec knows (``memory://``, ``hf://``, ...): that fsspec file system
  (``fsspecstore.FsspecStore``, ``pip install fsspec`` and the file system's own package);
* a scheme of one's own: a ``Store`` subclass registered with ``register_store``.
"""
from __future__ import annotations

from fastdata.shards.stores import local, objectstore  # noqa: F401 - each registers
from fastdata.shards.stores.base import STORES, Store, is_url, redact, register_store, scheme_of

__all__ = ["STORES", "Store", "is_url", "open_store", "redact", "register_store"]


def open_store(url: str) -> Store:
    """The store of ``url``'s scheme, for the folder it names: a registered one, else an
    fsspec file system of that protocol.

    Raises:
        ValueError: no store reads the scheme (the valid ones named).
    """
    scheme = scheme_of(url)
    cls = STORES.get(scheme or "")
    if cls is None and scheme is not None and _fsspec_knows(scheme):
        from fastdata.shards.stores.fsspecstore import FsspecStore

        cls = FsspecStore
    if cls is None:
        raise ValueError(f"{redact(url)}: no store reads {scheme}:// URLs; give one of "
                         f"{', '.join(s + '://' for s in sorted(STORES))}, a scheme fsspec "
                         f"knows, or register one (fastdata.shards.stores.register_store)")
    return cls(url)


def _fsspec_knows(scheme: str) -> bool:
    """Whether an installed fsspec has a file system for ``scheme``."""
    try:
        from fsspec.registry import known_implementations, registry
    except ImportError:
        return False
    return scheme in known_implementations or scheme in registry
