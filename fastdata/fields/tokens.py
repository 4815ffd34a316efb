"""``tokens``: a variable-length sequence of integers per sample (a tokenised caption), stored
as the integers' bytes in one dtype."""
from __future__ import annotations

import json

import numpy as np

from fastdata.checks import choice
from fastdata.fields.base import (
    MAX_VALUE_BYTES,
    FieldError,
    FieldKind,
    check_bytes,
    limited,
    register,
)
from fastdata.fields.cells import Stats, token_dtype

DTYPES = ("uint16", "int32", "int64")


@register
class TokensField(FieldKind):
    """Integers per sample, any number of them; a batch holds a list of int64 tensors (pad or
    pack them in a per-field batch function).

    Args:
        dtype: how each is stored: ``"uint16"`` (vocabularies up to 65,536), ``"int32"`` or
            ``"int64"``.

    Raises:
        ValueError: a dtype not in ``DTYPES``.
    """

    kind = "tokens"
    fixed = False

    def __init__(self, *, dtype: str = "int32"):
        self.token_dtype = np.dtype(choice("dtype", dtype, DTYPES))

    @classmethod
    def from_column(cls, cells) -> TokensField:
        """The smallest dtype that holds every integer of the column."""
        stats = Stats(cells)
        return cls(dtype=token_dtype(stats.lo, stats.hi))

    def params(self) -> dict:
        return {"dtype": self.token_dtype.name}

    def parse(self, cell, where: str) -> np.ndarray:
        if isinstance(cell, str):
            text = cell.strip()
            try:
                cell = json.loads(text) if text.startswith("[") else [int(t) for t in text.split()]
            except ValueError:
                raise FieldError(f"{where}: {text[:40]!r} is not a list of integers") from None
        try:
            values = np.asarray(cell)
        except (TypeError, ValueError):
            values = np.zeros(0, object)
        if values.ndim != 1 or (len(values) and values.dtype.kind not in "iu"):
            raise FieldError(f"{where}: {str(cell)[:40]!r} is not a list of integers")
        info = np.iinfo(self.token_dtype)
        if len(values) and (values.min() < info.min or values.max() > info.max):
            raise FieldError(f"{where}: a token outside {self.token_dtype.name}'s "
                             f"{info.min}..{info.max}")
        check_bytes(len(values) * self.token_dtype.itemsize, where)
        return values.astype(self.token_dtype)

    def to_bytes(self, value: np.ndarray) -> bytes:
        return np.ascontiguousarray(value, self.token_dtype).tobytes()

    def from_bytes(self, data: bytes, where: str) -> np.ndarray:
        limited(data, where, MAX_VALUE_BYTES)
        if len(data) % self.token_dtype.itemsize:
            raise FieldError(f"{where}: {len(data)} bytes are not whole "
                             f"{self.token_dtype.name} tokens")
        return np.frombuffer(data, self.token_dtype)

    def collate(self, values):
        import torch

        return [torch.from_numpy(np.array(v, np.int64)) for v in values]     # writable copies
