"""``fastdata.Loader`` and its backends.

- ``facade``: ``Loader``, which validates the arguments, owns the ``Order`` and the stages, and
  takes a backend by name (``BACKENDS``) or as an instance.
- ``spec``: ``Spec`` (the settings of one pass) and the ``Backend`` base (options, bound copy).
- ``host``: the host stage both backends share (``HostReader``, ``HostStage``); ``workers``:
  its reader threads and worker processes; ``buffers``: the reused buffers.
- ``torch_backend``, ``dali_backend`` (with ``dali_ops``, its pipeline's ops): the two
  backends; ``decode``: where the torch backend decodes JPEG shards.
"""
from fastdata.loader.dali_backend import DaliBackend
from fastdata.loader.facade import BACKENDS, DTYPES, Loader
from fastdata.loader.spec import Backend
from fastdata.loader.torch_backend import TorchBackend

__all__ = ["BACKENDS", "DTYPES", "Backend", "DaliBackend", "Loader", "TorchBackend"]
