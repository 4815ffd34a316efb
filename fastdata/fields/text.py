"""``text``: a UTF-8 string per sample (a caption, a prompt, a transcript), variable-length."""
from __future__ import annotations

from fastdata.checks import integer
from fastdata.fields.base import MAX_VALUE_BYTES, FieldError, FieldKind, limited, register


@register
class TextField(FieldKind):
    """A string per sample, stored as UTF-8 bytes; batches hold lists of ``str``.

    Args:
        max_bytes: the longest value taken (its UTF-8 bytes); a longer one is refused.

    Raises:
        ValueError: ``max_bytes`` below 1.
    """

    kind = "text"
    fixed = False

    def __init__(self, *, max_bytes: int = MAX_VALUE_BYTES):
        self.max_bytes = integer("max_bytes", max_bytes, 1)

    def params(self) -> dict:
        return {} if self.max_bytes == MAX_VALUE_BYTES else {"max_bytes": self.max_bytes}

    def parse(self, cell, where: str) -> str:
        if isinstance(cell, bytes):
            cell = self.from_bytes(cell, where)
        if not isinstance(cell, str):
            raise FieldError(f"{where}: {type(cell).__name__} {str(cell)[:40]!r} is not text")
        try:
            limited(cell.encode("utf-8"), where, self.max_bytes)
        except UnicodeEncodeError:      # a lone surrogate: no UTF-8 for it
            raise FieldError(f"{where}: text with a lone surrogate is not UTF-8") from None
        return cell

    def to_bytes(self, value: str) -> bytes:
        return value.encode("utf-8")

    def from_bytes(self, data: bytes, where: str) -> str:
        limited(data, where, self.max_bytes)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise FieldError(f"{where}: not UTF-8 text ({e.reason} at byte {e.start})") from None
