"""fastdata: image shards (HDF5/LMDB) and loaders that keep the GPU fed.

``Loader`` and ``TrainStep`` import torch; they load on first use, so converting, inspecting
and verifying shards (``fastdata.convert``, ``fastdata convert / info / verify``) never pay
torch's import.
"""
from fastdata.shards import Mixture, ShardSet, open  # noqa: A004

__version__ = "0.1.0"
__all__ = ["open", "convert", "ShardSet", "Mixture", "Loader", "Backend", "TorchBackend",
           "DaliBackend", "Targets", "TrainStep", "__version__"]


def __getattr__(name: str):
    if name == "convert":
        from fastdata.converters.convert import convert
        return convert
    if name in ("Loader", "Backend", "TorchBackend", "DaliBackend"):
        import fastdata.loader
        return getattr(fastdata.loader, name)
    if name == "Targets":
        from fastdata.ops.targets import Targets
        return Targets
    if name == "TrainStep":
        from fastdata.train.step import TrainStep
        return TrainStep
    raise AttributeError(f"module 'fastdata' has no attribute {name!r}")
