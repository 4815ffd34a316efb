"""Hugging Face datasets (``--source hf``), read without the ``datasets`` package: a
``save_to_disk`` folder (``state.json``, ``dataset_info.json`` and Arrow files), a
``DatasetDict``'s folder (``dataset_dict.json``; ``--split``, default ``train``), or the hub's
layout of parquet files (``data/train-00000-of-00001.parquet``: ``parquet``'s).

The features say what each column is: the ``Image`` the image (its embedded bytes), a
``ClassLabel`` the class with its names (the one named ``label``, else the only one; another
is a ``class`` field), a list of ``ClassLabel`` a ``multilabel`` field, a fixed-size list of
numbers an ``array``; any other ``Value`` or ``Sequence`` a field of the kind its values are
(as a labels file's columns, ``--field NAME=KIND`` to say it). Rows are in the dataset's
order (its Arrow files in ``state.json``'s order); a sample's key is ``FILE/ROW``.

The Arrow files are memory-mapped and their images never copied here: each image is handed
to a decode worker as its byte range in the file (Arrow keeps a column's bytes contiguous
and uncompressed), which it reads itself.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
from tqdm import tqdm

from fastdata._optional import require
from fastdata.converters.labels import kept, labels_of, samples
from fastdata.converters.scan import Scan
from fastdata.converters.sources import arrow
from fastdata.converters.sources.base import (
    Indexed,
    Places,
    Source,
    Span,
    Unreadable,
    register,
)
from fastdata.converters.sources.parquet import ParquetSource
from fastdata.converters.sources.pieces import Piece
from fastdata.converters.table import relative
from fastdata.converters.units import ConversionError, read_limited
from fastdata.shards.stores import is_url

#: the most bytes of a dataset's JSON files read
MAX_JSON = 64 << 20
#: ``a`` of an image without a byte range: a null cell, or a path without bytes
_NULL, _PATH_ONLY = -1, -2


class ArrowImages(Indexed):
    """A dataset's images: ``(a, b)`` their byte range in an Arrow file (``a`` negative: no
    bytes, and why)."""

    def read(self, piece: Piece, a: np.ndarray, b: np.ndarray) -> Iterator:
        for off, size in zip(a.tolist(), b.tolist()):
            if off >= 0:
                yield Span(piece.where, off, size)
            else:
                yield Unreadable("its image cell is null" if off == _NULL else
                                 "its image cell names a file and holds no bytes: save the "
                                 "dataset with its images embedded")


def _json(path: str) -> dict:
    try:
        out = json.loads(read_limited(path, MAX_JSON, "Hugging Face dataset file"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not readable JSON ({e})") from None
    if not isinstance(out, dict):
        raise ValueError(f"{path} is not a JSON object")
    return out


@register
class HFSource(Source):
    """A Hugging Face dataset on disk (see the module's docstring).

    Args:
        src: a ``save_to_disk`` folder, a ``DatasetDict``'s, or a hub layout's.
        fields: the kind of a column by name, where its features do not say it.
        split: a ``DatasetDict``'s split (default ``train``), or the hub layout's.
        image_column: the image's column, where the features name none.
    """

    kind = "hf"
    takes = ("fields", "split", "image_column")
    described = ("a Hugging Face dataset: a save_to_disk folder, a DatasetDict's (--split) or "
                 "the hub's layout of parquet files")

    @classmethod
    def claims(cls, src: str) -> bool:
        return not is_url(src) and any(os.path.isfile(os.path.join(src, n)) for n in (
            "state.json", "dataset_dict.json"))

    def scan(self, *, progress: bool) -> Scan:
        if is_url(self.src) or not os.path.isdir(self.src):
            return ParquetSource(self.src, workers=self.workers, **self.options).scan(
                progress=progress)
        folder = self._split_folder(os.path.abspath(self.src))
        if folder is None:      # the hub's layout
            return ParquetSource(self.src, workers=self.workers, **self.options).scan(
                progress=progress)
        state = _json(os.path.join(folder, "state.json"))
        info = _json(os.path.join(folder, "dataset_info.json"))
        files = [f.get("filename") for f in state.get("_data_files") or []
                 if isinstance(f, dict)]
        names = [relative(f) for f in files]
        if not names or None in names or any(os.sep in n for n in names if n):
            raise ValueError(f"{folder}/state.json: its _data_files ({files[:3]}) are not "
                             f"files of the dataset's folder")
        features: dict = info["features"] if isinstance(info.get("features"), dict) else {}
        pieces = [_piece(folder, n) for n in names if n]
        return self._scan(pieces, features, progress)

    def _split_folder(self, src: str) -> str | None:
        """The folder of the dataset to read: SRC, or its split's; None for the hub's
        layout."""
        if os.path.isfile(os.path.join(src, "dataset_dict.json")):
            splits = _json(os.path.join(src, "dataset_dict.json")).get("splits") or []
            split = self.options["split"] or ("train" if "train" in splits else None)
            if split is None or split not in splits:
                raise ValueError(f"{src} is a DatasetDict of the splits "
                                 f"{', '.join(map(str, splits))}: choose one with --split"
                                 + (f" ({split!r} is not one)" if split else ""))
            return os.path.join(src, relative(split) or "-")
        if os.path.isfile(os.path.join(src, "state.json")):
            if self.options["split"] is not None:
                raise ValueError(f"--split {self.options['split']}: {src} is one dataset "
                                 f"(a save_to_disk folder), not a DatasetDict of splits")
            return src
        return None

    def _scan(self, pieces: list[Piece], features: dict, progress: bool) -> Scan:
        locations = Places()                # each row's file, and its image's bytes
        table: Any = None
        class_names: Any = None
        image: Any = None
        schema: Any = None
        bar = tqdm(total=sum(p.size for p in pieces), unit="B", unit_scale=True,
                   desc="index arrow", disable=not progress, dynamic_ncols=True)
        for number, piece in enumerate(pieces):
            row = 0
            for batch, base in _batches(piece):
                if table is None:
                    schema = batch.schema
                    image = arrow.image_column(schema, features, self.options["image_column"],
                                               piece.shown)
                    if image.form == "path":
                        raise ValueError(f"{piece.shown}: the image column {image.name!r} "
                                         f"holds paths; a dataset's images are its Image "
                                         f"feature's bytes")
                    table, class_names = arrow.label_table(schema, image, features,
                                                           "dataset", piece.where,
                                                           self.options["fields"])
                elif batch.schema.names != schema.names:
                    raise ValueError(f"{piece.shown}: its columns differ from the first file's")
                for place in _add_batch(batch, base, piece, number, row, table, class_names,
                                        image):
                    locations.append([place])
                row += batch.num_rows
            bar.update(piece.size)
        bar.close()
        if table is None:
            raise ConversionError(f"{self.src}: the dataset has no rows")
        labels = labels_of(table, self.options["fields"])
        if not kept(table, labels):
            raise ConversionError(f"no usable row in {self.src} ({len(labels.bad)} left out, "
                                  f"e.g. {labels.bad[:1]})")
        files, targets, values = samples(table, labels)
        return Scan(os.path.abspath(self.src), labels.names, files, skipped=labels.bad,
                    label_kind=labels.kind, targets=targets, values=values,
                    images=ArrowImages(pieces, locations.kept(labels.rows)))


def _piece(folder: str, name: str) -> Piece:
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{folder}: its state.json lists {name}, which is missing: "
                                f"save the dataset again")
    st = os.stat(path)
    return Piece(name, path, st.st_size, f"{st.st_size}:{st.st_mtime_ns}")


def _batches(piece: Piece):
    """The record batches of an Arrow file (the stream format ``save_to_disk`` writes, or
    the file format), memory-mapped, each with the address its file starts at."""
    pa = require("pyarrow", "Hugging Face dataset sources")
    try:
        with pa.memory_map(piece.where) as m:
            base = m.read_buffer(1).address if piece.size else 0
            m.seek(0)
            try:
                reader = pa.ipc.open_stream(m)
            except pa.ArrowInvalid:
                m.seek(0)
                file_reader = pa.ipc.open_file(m)
                yield from ((file_reader.get_batch(k), base)
                            for k in range(file_reader.num_record_batches))
                return
            for batch in reader:
                yield batch, base
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{piece.shown} is not a readable Arrow file ({e})") from None


def _add_batch(batch, base: int, piece: Piece, number: int, start: int, table, class_names,
               image) -> list[tuple[int, int, int]]:
    """A record batch's rows into ``table``; returns their images' places ``(file, offset,
    size)`` in the Arrow file."""
    keys = [f"{piece.name}/{start + r}" for r in range(batch.num_rows)]
    arrow.add_rows(table, {n: batch.column(n).to_pylist() for n in table.sources}, keys,
                   [f"{piece.name} row {start + r}" for r in range(batch.num_rows)],
                   class_names)
    return [(number, a, b) for a, b in _spans(batch.column(image.name), image.form, base,
                                              piece)]


def _spans(column, form: str, base: int, piece: Piece) -> list[tuple[int, int]]:
    """Each cell's image as ``(offset, size)`` in the mapped file (``_NULL``/``_PATH_ONLY``
    and 0 where it has no bytes).

    Raises:
        ValueError: the column's bytes are not in the file as they are (a compressed
            file).
    """
    data = column.flatten()[column.type.get_field_index("bytes")] if form == "struct" \
        else column
    _, offsets_buf, values_buf = data.buffers()[:3]
    wide = str(data.type) == "large_binary"
    offsets = np.frombuffer(offsets_buf, np.int64 if wide else np.int32)[
        data.offset:data.offset + len(data) + 1].astype(np.int64)
    at = (values_buf.address - base) if values_buf is not None else 0
    if values_buf is not None and not 0 <= at <= piece.size - values_buf.size:
        raise ValueError(f"{piece.shown}: its image bytes are not stored as they are (a "
                         f"compressed Arrow file): save the dataset without compression")
    valid = data.is_valid().to_pylist() if data.null_count else [True] * len(data)
    out = []
    for k in range(len(data)):
        if valid[k]:
            out.append((at + int(offsets[k]), int(offsets[k + 1] - offsets[k])))
        else:
            has_path = form == "struct" and column[k].is_valid and column[k]["path"].is_valid
            out.append((_PATH_ONLY if has_path else _NULL, 0))
    return out
