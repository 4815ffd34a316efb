"""fastdata: image shards (HDF5/LMDB) and loaders that keep the GPU fed."""
from fastdata.loaders import Loader
from fastdata.readers import ShardSet, open  # noqa: A004
from fastdata.train.step import TrainStep

__version__ = "0.1.0"
__all__ = ["open", "ShardSet", "Loader", "TrainStep", "__version__"]
