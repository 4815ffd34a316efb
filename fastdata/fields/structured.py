"""``json``: a small structured value per sample (metadata, an attribute dict), stored as its
compact JSON text."""
from __future__ import annotations

import json

from fastdata.checks import integer
from fastdata.fields.base import FieldError, FieldKind, limited, register

#: the most bytes a json value may hold by default: metadata, not documents
MAX_JSON_BYTES = 1 << 20


@register
class JsonField(FieldKind):
    """A JSON value per sample (an object, a list, a number...); batches hold lists of them.

    Args:
        max_bytes: the longest value taken (its compact JSON text).

    Raises:
        ValueError: ``max_bytes`` below 1.
    """

    kind = "json"
    fixed = False

    def __init__(self, *, max_bytes: int = MAX_JSON_BYTES):
        self.max_bytes = integer("max_bytes", max_bytes, 1)

    def params(self) -> dict:
        return {} if self.max_bytes == MAX_JSON_BYTES else {"max_bytes": self.max_bytes}

    def parse(self, cell, where: str):
        if isinstance(cell, (str, bytes)):
            return self.from_bytes(cell.encode() if isinstance(cell, str) else cell, where)
        limited(self.to_bytes(cell), where, self.max_bytes)
        return cell

    def to_bytes(self, value) -> bytes:
        try:
            return json.dumps(value, separators=(",", ":"), ensure_ascii=False,
                              allow_nan=False).encode("utf-8")
        except (TypeError, ValueError) as e:
            raise FieldError(f"not a JSON value: {e}") from None

    def from_bytes(self, data: bytes, where: str):
        limited(data, where, self.max_bytes)
        try:
            return json.loads(data.decode("utf-8"), parse_constant=_no_constant)
        except (UnicodeDecodeError, ValueError) as e:
            raise FieldError(f"{where}: not JSON ({str(e)[:80]})") from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")
