"""``multilabel``: a set of classes per sample, stored multi-hot (float32, one column a class)."""
from __future__ import annotations

import numpy as np

from fastdata.fields.base import FieldError, FieldKind, class_names, register
from fastdata.fields.cells import json_cell


@register
class MultiLabelField(FieldKind):
    """Any of ``classes`` per sample; parsed from a ``|``- or ``;``-separated list of names (or
    a JSON list of them).

    Args:
        classes: the class names, in column order.

    Raises:
        ValueError: no class, a name that is not a string, or the same name twice.
    """

    kind = "multilabel"
    dtype = np.dtype(np.float32)

    def __init__(self, *, classes):
        self.classes = names = class_names(classes)
        self.shape = (len(names),)
        self._index = {c: k for k, c in enumerate(names)}

    @classmethod
    def from_column(cls, cells) -> MultiLabelField:
        """The names the cells hold (``|``- or ``;``-separated, or JSON lists), sorted."""
        names: set[str] = set()
        for v in map(json_cell, cells):
            if isinstance(v, str):
                sep = "|" if "|" in v else ";"
                names.update(n.strip() for n in v.split(sep) if n.strip())
            elif isinstance(v, list):
                names.update(str(n) for n in v)
        return cls(classes=sorted(names))

    def params(self) -> dict:
        return {"classes": self.classes}

    def parse(self, cell, where: str) -> np.ndarray:
        if isinstance(cell, str):
            sep = "|" if "|" in cell else ";"
            cell = [c.strip() for c in cell.split(sep) if c.strip()]
        if not isinstance(cell, (list, tuple)):
            raise FieldError(f"{where}: {cell!r} is not a list of class names")
        hot = np.zeros(len(self.classes), np.float32)
        for name in cell:
            if name not in self._index:
                raise FieldError(f"{where}: {name!r} is not one of the field's "
                                 f"{len(self.classes)} classes")
            hot[self._index[name]] = 1
        return hot

    def check(self, column, count: int, where: str) -> None:
        super().check(column, count, where)
        if not np.isin(column.values, (0, 1)).all():
            raise FieldError(f"{where}: multi-hot values other than 0 and 1")
