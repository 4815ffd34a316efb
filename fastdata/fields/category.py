"""``class``: one class per sample, stored as its index (int64) into the field's ``classes``."""
from __future__ import annotations

import re

import numpy as np

from fastdata.fields.base import FieldError, FieldKind, class_names, register

#: integer labels are class indices below this: one row's label must not make millions
MAX_CLASSES = 1 << 20
_INTEGER = re.compile(r"[0-9]+")


@register
class ClassField(FieldKind):
    """A class per sample.

    Args:
        classes: the class names, in index order (a source's names, or ``0..K-1``).

    Raises:
        ValueError: no class, a name that is not a string, or the same name twice.
    """

    kind = "class"
    dtype = np.dtype(np.int64)

    def __init__(self, *, classes):
        self.classes = names = class_names(classes)
        self._index = {c: k for k, c in enumerate(names)}

    @classmethod
    def from_column(cls, cells) -> ClassField:
        """Non-negative integers are class indices (``0..max``, so that a label is its index);
        any other values are names, sorted.

        Raises:
            ValueError: an integer label of ``MAX_CLASSES`` or more.
        """
        names = {str(c).strip() for c in cells}
        if names and all(_INTEGER.fullmatch(n) for n in names):
            top = max(int(n) if len(n.lstrip("0")) < 8 else MAX_CLASSES for n in names)
            if top >= MAX_CLASSES:
                raise ValueError(f"a class index of {MAX_CLASSES:,} or more: integer labels are "
                                 f"class indices 0..{MAX_CLASSES - 1}; give class names instead")
            return cls(classes=[str(k) for k in range(top + 1)])
        return cls(classes=sorted(names))

    def params(self) -> dict:
        return {"classes": self.classes}

    def parse(self, cell, where: str) -> int:
        name = str(cell).strip()
        if name not in self._index:
            raise FieldError(f"{where}: {name!r} is not one of the field's "
                             f"{len(self.classes)} classes")
        return self._index[name]

    def check(self, column, count: int, where: str) -> None:
        super().check(column, count, where)
        v = column.values
        if len(v) and (v.min() < 0 or v.max() >= len(self.classes)):
            raise FieldError(f"{where}: class indices outside 0..{len(self.classes) - 1}")
