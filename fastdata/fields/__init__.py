"""Field kinds: what a sample holds beside its image, one module per kind, each registered by
name in ``FIELDS`` (``base``): ``class`` (``category``), ``multilabel``, ``float``
(``scalar``), ``text``, ``tokens``, ``array``, ``json`` (``structured``) and the kinds that
move with the pixels, ``boxes`` (with instance masks), ``classmap`` and ``keypoints``;
``cells``: a source's cells as the kinds read them; ``infer``: the kind of a source's column
that no one named."""
# each module registers its kind
from fastdata.fields import (  # noqa: F401
    array,
    boxes,
    category,
    classmap,
    keypoints,
    multilabel,
    scalar,
    structured,
    text,
    tokens,
)
from fastdata.fields.base import FIELDS, Column, FieldError, FieldKind, field_of, register

__all__ = ["FIELDS", "Column", "FieldError", "FieldKind", "field_of", "register"]
