"""``Loader(fields=[...])``: which of a set's fields a batch holds, and the per-field batch
functions (``field_transforms``) that the reader workers run on them."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

from fastdata.ops.targets import moved


@dataclasses.dataclass(frozen=True)
class BatchFields:
    """The fields a batch holds, in the order asked (``"image"``, ``"label"`` and the set's
    own), and each one's batch function."""

    names: tuple[str, ...]
    transforms: dict[str, Callable] = dataclasses.field(default_factory=dict)

    def moves(self, ds) -> bool:
        """Whether a field asked for moves with the pixels (``FieldKind.moves``: boxes,
        class maps, keypoints), so that a batch's crops are drawn before its fields are read."""
        return any(n in ds.fields and ds.fields[n].moves for n in self.names)

    def read(self, ds, indices, labels: Callable[[], torch.Tensor | list | dict], drawn=None,
             stored: int = 0, out: int = 0) -> dict:
        """A batch's fields but the image: each collated (``FieldKind.collate``: a tensor for a
        fixed-size kind, else a list) and through its batch function; ``labels()``: the
        batch's labels, where asked (a detection or segmentation set's: its targets, through
        the crops). ``drawn``: the batch's crops (top, left, h, w in stored pixels of side
        ``stored``) and flips, to ``out`` pixels: a moving field's values go through them
        (None: the stored squares as they are)."""
        batch = {}
        for name in self.names:
            if name == "image":
                continue
            if name == "label":
                value = labels()
            else:
                kind = ds.fields[name]
                value = kind.collate(ds.field_values(
                    name, indices, moved(len(indices), drawn, stored, out) if kind.moves
                    else None))
            fn = self.transforms.get(name)
            batch[name] = value if fn is None else fn(value)
        return batch


def batch_fields(dataset, fields: Sequence[str] | None,
                 transforms: dict[str, Callable] | None, *, with_source: bool
                 ) -> BatchFields | None:
    """``Loader``'s ``fields`` and ``field_transforms`` checked against the set's fields.

    Returns:
        The batch's fields, or None for ``(images, labels)`` batches (``fields=None``).

    Raises:
        ValueError: a field the set does not have (naming those it has), the same name twice,
            no ``"image"``, or a transform of a field not asked for.
        TypeError: ``fields`` that is not a list of names, or a transform that is not
            callable.
    """
    if fields is None:
        if transforms:
            raise ValueError("field_transforms apply to the fields of dict batches: give "
                             "fields=[...] too")
        return None
    if isinstance(fields, str) or not all(isinstance(f, str) for f in fields):
        raise TypeError(f"fields={fields!r} is not a list of field names, e.g. "
                        f"['image', 'caption']")
    names = tuple(fields)
    _check_names(dataset, names, with_source)
    transforms = dict(transforms or {})
    _check_transforms(names, transforms)
    return BatchFields(names, transforms)


def _check_names(dataset, names: tuple[str, ...], with_source: bool) -> None:
    has = ["image", *([] if dataset.label_kind == "none" else ["label"]), *dataset.fields]
    unknown = [n for n in names if n not in has]
    if unknown:
        raise ValueError(f"fields: {dataset.location} has no field {unknown[0]!r}; its fields "
                         f"are {', '.join(has)}")
    if len(set(names)) < len(names) or "image" not in names:
        raise ValueError(f"fields={list(names)} must name each field once, \"image\" among them")
    if with_source and "source" in names:
        raise ValueError("with_source adds the key \"source\" to each batch, which is also one "
                         "of the fields asked for: leave with_source out")


def _check_transforms(names: tuple[str, ...], transforms: dict) -> None:
    for name, fn in transforms.items():
        if name not in names or name == "image":
            raise ValueError(f"field_transforms[{name!r}]: not one of the fields asked for "
                             f"({', '.join(n for n in names if n != 'image')}); the image's "
                             f"are sample_transform and batch_transform")
        if not callable(fn):
            raise TypeError(f"field_transforms[{name!r}] must be callable, not "
                            f"{type(fn).__name__}")
