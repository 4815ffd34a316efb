"""``array``: a fixed shape and dtype per sample (an embedding, a feature map), stored as one
array per shard."""
from __future__ import annotations

import json

import numpy as np

from fastdata.checks import choice
from fastdata.fields.base import FieldError, FieldKind, register
from fastdata.fields.cells import json_cell, shape_of

DTYPES = ("float16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool")
#: the most values one sample's array may hold
MAX_ELEMENTS = 1 << 22


@register
class ArrayField(FieldKind):
    """An array of ``shape`` and ``dtype`` per sample; batches hold ``(B, *shape)`` tensors.

    Args:
        shape: the shape of each sample's array (a list of positive integers).
        dtype: one of ``DTYPES``.

    Raises:
        ValueError: a shape that is not positive integers, more than ``MAX_ELEMENTS`` values,
            or a dtype not in ``DTYPES``.
    """

    kind = "array"

    def __init__(self, *, shape, dtype: str = "float32"):
        dims = list(shape) if isinstance(shape, (list, tuple)) else None
        if dims is None or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0
                                   for d in dims):
            raise ValueError(f"shape={shape!r} is not valid; give positive integers, e.g. [8]")
        if int(np.prod(dims)) > MAX_ELEMENTS:
            raise ValueError(f"shape={shape!r} holds more than {MAX_ELEMENTS:,} values a sample")
        self.shape = tuple(dims)
        self.dtype = np.dtype(choice("dtype", dtype, DTYPES))

    @classmethod
    def from_column(cls, cells) -> ArrayField:
        """float32, of the first JSON array's shape.

        Raises:
            ValueError: no cell is an array.
        """
        first = next((v for v in map(json_cell, cells) if isinstance(v, list)), None)
        if first is None:
            raise ValueError("an array field needs JSON arrays of numbers in its column")
        return cls(shape=list(shape_of(first)), dtype="float32")

    def params(self) -> dict:
        return {"shape": list(self.shape), "dtype": self.dtype.name}

    def parse(self, cell, where: str) -> np.ndarray:
        if isinstance(cell, str):
            try:
                cell = json.loads(cell)
            except ValueError:
                raise FieldError(f"{where}: {cell[:40]!r} is not a JSON array") from None
        try:
            values = np.asarray(cell, dtype=np.float64 if self.dtype.kind == "f" else None)
        except (TypeError, ValueError):
            raise FieldError(f"{where}: {str(cell)[:40]!r} is not an array of numbers") from None
        if values.shape != self.shape or values.dtype.kind not in "fiub":
            raise FieldError(f"{where}: an array of shape {values.shape}, not {self.shape}")
        if self.dtype.kind in "iub" and (values.dtype.kind == "f" or not np.array_equal(
                values.astype(self.dtype), values)):
            raise FieldError(f"{where}: values that are not {self.dtype.name}")
        return values.astype(self.dtype)
