"""A set's fields as its manifest lists them (``fields``: ``[{name, kind, params}]``), and the
rule for a field's name."""
from __future__ import annotations

from fastdata.fields.base import FieldKind, field_of
from fastdata.format import FIELD_NAME, RESERVED_FIELDS, ShardFormatError


def check_name(name: str, where: str = "field") -> str:
    """``name`` checked as a field's name: an identifier (letters, digits, ``_``, ``.``,
    ``-``; at most 64), not ``image`` or ``label``.

    Raises:
        ValueError: naming the rule it breaks.
    """
    if not isinstance(name, str) or FIELD_NAME.fullmatch(name) is None:
        raise ValueError(f"{where} name {name!r} is not valid: give letters, digits, _, . or - "
                         f"(a letter or _ first, at most 64)")
    if name in RESERVED_FIELDS:
        raise ValueError(f"{where} name {name!r} is taken: {' and '.join(RESERVED_FIELDS)} "
                         f"name the image and the label of every sample; rename the column")
    return name


def entries(fields: dict[str, FieldKind]) -> list[dict]:
    """``fields`` as the manifest's ``fields`` entries."""
    return [{"name": name, "kind": kind.kind, "params": kind.params()}
            for name, kind in fields.items()]


def fields_of(manifest: dict, where: str) -> dict[str, FieldKind]:
    """The fields of a checked manifest (``fastdata.format.check_manifest``), by name in
    their stored order; ``{}`` for a set without fields.

    Raises:
        ShardFormatError: a kind that is not registered or a parameter it refuses (naming
            the field).
    """
    out: dict[str, FieldKind] = {}
    for k, e in enumerate(manifest.get("fields") or ()):
        try:
            out[e["name"]] = field_of(e["kind"], **e.get("params", {}))
        except (TypeError, ValueError) as err:
            raise ShardFormatError(f"{where}: field fields[{k}] ({e['name']!r}) is not "
                                   f"readable: {err}") from None
    return out
