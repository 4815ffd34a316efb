"""What Arrow-based sources (parquet files, Hugging Face datasets) share: which column is the
image and in which form (bytes, Hugging Face's ``{bytes, path}`` struct, or paths), the
features a Hugging Face dataset records (``ClassLabel`` names), and the other columns as a
table of labels and fields (``fastdata.converters.labels``)."""
from __future__ import annotations

import json
from dataclasses import dataclass

from fastdata.converters import decode
from fastdata.converters.sources.base import Unreadable
from fastdata.converters.table import Table
from fastdata.fields import FIELDS, FieldKind, field_of

#: column names taken for the image, in this order, where nothing else says which it is
IMAGE_NAMES = ("image", "img", "jpg", "jpeg", "png", "webp", "image_bytes")
#: names of a column of image paths, where no column holds image bytes
PATH_NAMES = ("image_path", "file_name", "path", "filepath", "image_file")
#: Arrow's numeric types, as a field's dtype
_DTYPES = {"halffloat": "float16", "float": "float32", "double": "float64", "int8": "int8",
           "int16": "int16", "int32": "int32", "int64": "int64", "uint8": "uint8",
           "uint16": "uint16", "uint32": "uint32", "uint64": "uint64", "bool": "bool"}


def hf_features(metadata: dict | None) -> dict:
    """The features a Hugging Face dataset records in an Arrow schema's metadata (its
    ``huggingface`` entry), else ``{}``: never trusted beyond their shape."""
    raw = (metadata or {}).get(b"huggingface")
    try:
        features = json.loads(raw)["info"]["features"] if raw else {}
    except (ValueError, KeyError, TypeError):
        return {}
    return features if isinstance(features, dict) else {}


@dataclass(frozen=True)
class ImageColumn:
    """The image's column and its form: ``bytes`` (binary), ``struct`` (Hugging Face's
    ``{bytes, path}``) or ``path`` (paths to image files)."""

    name: str
    form: str


def _form(t) -> str | None:
    import pyarrow as pa

    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "bytes"
    if pa.types.is_struct(t) and t.get_field_index("bytes") >= 0 and \
            _form(t.field("bytes").type) == "bytes":
        return "struct"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "path"
    return None


def image_column(schema, features: dict, given: str | None, where: str) -> ImageColumn:
    """The image's column of a table of ``schema``: ``given`` (``--image-column``), else the
    one Hugging Face's features call an ``Image``, else one named as images are
    (``IMAGE_NAMES``), else the only column of bytes, else a column of paths
    (``PATH_NAMES``).

    Raises:
        ValueError: no such column, or ``given`` names none that holds images (naming the
            file, its columns and the option to give).
    """
    names = list(schema.names)
    forms = {n: _form(schema.field(n).type) or "" for n in names}
    if given is not None:
        if not forms.get(given):
            raise ValueError(f"{where}: --image-column {given!r} is not a column of image bytes "
                             f"or paths; its columns: {_listed(schema)}")
        return ImageColumn(given, forms[given])
    typed = [n for n in names if isinstance(features.get(n), dict)
             and features[n].get("_type") == "Image" and forms[n] in ("bytes", "struct")]
    named = [n for n in IMAGE_NAMES if forms.get(n) in ("bytes", "struct")]
    binary = [n for n in names if forms[n] in ("bytes", "struct")]
    paths = [n for n in PATH_NAMES if forms.get(n) == "path"]
    found = (typed or named or (binary if len(binary) == 1 else []) or paths)[:1]
    if not found:
        raise ValueError(f"{where}: no image column (a column of image bytes, Hugging Face's "
                         f"{{bytes, path}} struct, or one of paths named "
                         f"{'/'.join(PATH_NAMES)}); its columns: {_listed(schema)}: name the "
                         f"image's with --image-column NAME")
    return ImageColumn(found[0], forms[found[0]])


def _listed(schema) -> str:
    return ", ".join(f"{f.name} ({f.type})" for f in schema)


def image_items(column, form: str) -> list:
    """A chunk of the image column as what decode workers are handed: each cell's bytes (a
    view of the Arrow buffer, not a copy), or an ``Unreadable`` for a null cell, a cell
    without bytes or one larger than an image may be."""
    import numpy as np

    data = column.flatten()[column.type.get_field_index("bytes")] if form == "struct" \
        else column         # flatten: the struct's own nulls and offset applied
    valid = data.is_valid().to_pylist() if data.null_count else None
    _, offsets_buf, values_buf = data.buffers()[:3]
    offsets = np.frombuffer(offsets_buf, np.int64 if str(data.type).startswith("large_")
                            else np.int32)[data.offset:data.offset + len(data) + 1].tolist()
    values = memoryview(values_buf) if values_buf is not None else memoryview(b"")
    out: list = []
    for k in range(len(data)):
        n = offsets[k + 1] - offsets[k]
        if valid is not None and not valid[k]:
            out.append(Unreadable(_no_bytes(column, k, form)))
        elif n > decode.MAX_FILE_BYTES:
            out.append(Unreadable(f"its image cell holds {n:,} bytes, more than an image may "
                                  f"({decode.MAX_FILE_BYTES:,})"))
        else:
            out.append(values[offsets[k]:offsets[k + 1]])
    return out


def _no_bytes(column, k: int, form: str) -> str:
    if form == "struct" and column[k].is_valid:
        path = column[k].as_py().get("path")
        if path:
            return (f"its image cell names a file ({str(path)[:80]!r}) and holds no bytes: "
                    f"save the dataset with its images embedded")
    return "its image cell is null"


def known_kinds(schema, features: dict, skip: set[str]) -> tuple[dict[str, FieldKind], dict]:
    """The kinds a table's own types say (the columns not in ``skip``): a ``ClassLabel`` a
    class with its names, a list of ``ClassLabel`` a multilabel, a fixed-size list of numbers
    an array of their dtype. Returns those kinds by column, and each ``ClassLabel`` column's
    names (its cells are indices into them)."""
    import pyarrow as pa

    kinds: dict[str, FieldKind] = {}
    names: dict[str, list[str]] = {}
    for f in schema:
        if f.name in skip:
            continue
        feature: dict = features[f.name] if isinstance(features.get(f.name), dict) else {}
        inner: dict = feature["feature"] if isinstance(feature.get("feature"), dict) else {}
        if feature.get("_type") == "ClassLabel" and _names(feature):
            names[f.name] = _names(feature)
            kinds[f.name] = field_of("class", classes=names[f.name])
        elif feature.get("_type") in ("Sequence", "List") and inner.get("_type") == \
                "ClassLabel" and _names(inner):
            names[f.name] = _names(inner)
            kinds[f.name] = field_of("multilabel", classes=names[f.name])
        elif pa.types.is_fixed_size_list(f.type) and str(f.type.value_type) in (
                "halffloat", "float", "double", "int8", "int16", "int32", "int64", "uint8",
                "uint16", "uint32", "uint64", "bool") and f.type.list_size > 0:
            kinds[f.name] = field_of("array", shape=[f.type.list_size],
                                     dtype=_DTYPES[str(f.type.value_type)])
    return kinds, names


def _names(feature: dict) -> list[str]:
    names = feature.get("names")
    return [str(n) for n in names] if isinstance(names, list) and names else []


def add_rows(table: Table, columns: dict[str, list], keys: list[str], places: list,
             class_names: dict[str, list[str]]) -> None:
    """Rows into ``table``: ``columns[name]`` the cells of the source's column ``name`` (a
    ``ClassLabel``'s indices turned into their names, an index out of range into no label),
    in the order of ``table.sources``."""
    ordered = [[_named(c, class_names[name]) for c in columns[name]] if name in class_names
               else [_file(c) for c in columns[name]] for name in table.sources]
    for k, key in enumerate(keys):
        table.add(key, [col[k] for col in ordered], places[k])


def _file(cell):
    """A cell of Hugging Face's ``{bytes, path}`` struct (a second image: a class map's) as its
    bytes; any other cell as it is."""
    if isinstance(cell, dict) and isinstance(cell.get("bytes"), bytes):
        return cell["bytes"]
    return cell


def _named(cell, names: list[str]):
    if isinstance(cell, list):
        return [_named(c, names) for c in cell]
    return names[cell] if isinstance(cell, int) and 0 <= cell < len(names) else None


def label_table(schema, image: ImageColumn, features: dict, what: str, src: str,
                fields: dict[str, str] | None = None) -> tuple[Table, dict[str, list[str]]]:
    """The empty table of a source's other columns: the label's (the ``ClassLabel`` named
    ``label``, else the only ``ClassLabel``, else a column named ``label``) called
    ``label``, with its class names; columns of bytes (a second image) left out, but those
    ``fields`` (``--field NAME=KIND``) gives a kind of files (a class map's PNG). Returns the
    table and each ``ClassLabel`` column's names."""
    kinds, class_names = known_kinds(schema, features, {image.name})
    files = {n for n, k in (fields or {}).items() if k in FIELDS and FIELDS[k].binary}
    others = [f.name for f in schema if f.name != image.name
              and (_form(f.type) not in ("bytes", "struct") or f.name in files)]
    labelled = [n for n in others if n in kinds and kinds[n].kind == "class"]
    label = "label" if "label" in others else (labelled[0] if len(labelled) == 1 else None)
    table = Table(src, ["label" if n == label else n for n in others], unit="", what=what,
                  sources=others, known={n: k for n, k in kinds.items() if n != label})
    if label is not None and label in class_names:
        table.classes = class_names[label]
    return table, class_names
