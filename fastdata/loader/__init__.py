"""``fastdata.Loader`` and its backends.

- ``facade``: ``Loader``, which validates the arguments, owns the ``Order`` and the stages, and
  picks a backend by name (``BACKENDS``).
- ``spec``: ``Spec`` (the settings of one pass) and the ``Backend`` base.
- ``torch_backend``, ``dali_backend``: the two backends; ``workers`` and ``buffers``: the torch
  backend's worker processes and the reused buffers of both; ``decode``: where JPEG shards are
  decoded.
"""
from fastdata.loader.facade import BACKENDS, DTYPES, Loader

__all__ = ["BACKENDS", "DTYPES", "Loader"]
