"""Semantic class maps from a folder of PNGs parallel to the images (``fastdata convert SRC
OUT --masks MASKS``).

Image ``SRC/<path>/<name>.<ext>`` has the class map ``MASKS/<path>/<name>.png``: one 8-bit
value a pixel (mode ``L``, or ``P`` whose palette indices are the classes, as Pascal VOC's),
each a class index, 255 for pixels of no class. The classes are ``"0"`` to the largest index
found. An image without a class map is skipped and reported; one whose map is not such a PNG
of its size (stored, or upright: ``fastdata.converters.geometry``) is kept, of no class, with a
note. The maps are read as the source is scanned (in processes), turned upright (one of more
than 4096 x 4096 pixels resampled nearest to fewer: ``classmap``'s limit), and become the set's
field ``label`` of kind ``classmap`` (``fastdata.fields.classmap``): placed on the square as the
fit placed the pixels, a pad's borders 255.
"""
from __future__ import annotations

import hashlib
import io
import os
import stat

import numpy as np
from PIL import Image, UnidentifiedImageError

from fastdata.converters.geometry import frame
from fastdata.converters.scan import FieldValues, Files, Scan, walk_images
from fastdata.converters.units import read_limited
from fastdata.fields.classmap import IGNORE, ClassMapField, within_limit

#: a class map file larger than this is refused before it is read
MAX_MAP_BYTES = 64 << 20
#: nor one of more pixels (a PNG's header can claim any size)
MAX_MAP_PIXELS = 1 << 28


def map_path(masks: str, path: str) -> str:
    """The class map of the image at ``path`` (relative to SRC)."""
    return os.path.join(masks, os.path.splitext(path)[0] + ".png")


def scan_masks(root: str, masks: str, *, workers: int = 1, progress: bool = False) -> Scan:
    """The images under ``root`` (any layout) that have a class map in ``masks``, sorted by
    path, their maps read (``read_maps``); the others become skipped entries.

    Raises:
        FileNotFoundError: ``root`` or ``masks`` is not a folder.
    """
    root, masks = os.path.abspath(root), os.path.abspath(masks)
    for what, folder in (("source", root), ("masks", masks)):
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"{what} folder {folder!r} does not exist or is not a "
                                    f"directory")
    ignored: dict[str, int] = {}
    paths, skipped = [], []
    digest = hashlib.sha256(masks.encode("utf-8", "surrogateescape"))
    for p in sorted(walk_images(root, "", ignored)):
        try:
            st = os.stat(map_path(masks, p))
        except OSError:
            st = None
        if st is None or not stat.S_ISREG(st.st_mode):
            skipped.append({"path": p, "kind": "unlabelled",
                            "reason": f"no class map {os.path.splitext(p)[0]}.png in {masks}"})
            continue
        paths.append(p)
        digest.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\0".encode("utf-8",
                                                                       "surrogateescape"))
    files = Files()
    files.extend(paths, 0)
    values, classes, notes = read_maps(root, masks, paths, workers=workers, progress=progress)
    return Scan(root, classes, files.freeze(), ignored, skipped=skipped + notes,
                label_kind="segmentation", masks=(masks, digest.hexdigest()), values=values)


def read_map(path: str) -> np.ndarray:
    """A class map PNG's values, ``(height, width)`` uint8.

    Raises:
        ValueError: not a regular file, too large, not a PNG, or not one value a pixel.
    """
    data = read_limited(path, MAX_MAP_BYTES, "class map")
    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.format != "PNG" or img.mode not in ("L", "P"):
                raise ValueError(f"class map {path} is a {img.format} of mode {img.mode}, not "
                                 f"a PNG of one 8-bit value a pixel (mode L or P)")
            if img.width * img.height > MAX_MAP_PIXELS:
                raise ValueError(f"class map {path} claims {img.width}x{img.height} pixels")
            return np.asarray(img)
    except Image.DecompressionBombError as e:   # claims more pixels than any image holds
        raise ValueError(f"class map {path} is refused as a decompression bomb ({e})") from None
    except (UnidentifiedImageError, OSError, SyntaxError) as e:
        raise ValueError(f"class map {path} is not a readable PNG ({e})") from None


def _upright(path: str, m: np.ndarray) -> np.ndarray:
    """The class map ``m`` of the image at ``path``, upright as its pixels are stored.

    Raises:
        ValueError: the map's size is not the image's, stored or upright.
    """
    f = frame(path, (m.shape[1], m.shape[0]))
    return m if f.orientation == 1 else np.asarray(Image.fromarray(m).transpose(
        _TRANSPOSE[f.orientation]))


#: EXIF orientation → the transpose that turns a picture upright (``ImageOps.exif_transpose``)
_TRANSPOSE = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180,
              4: Image.Transpose.FLIP_TOP_BOTTOM, 5: Image.Transpose.TRANSPOSE,
              6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
              8: Image.Transpose.ROTATE_90}


def _chunk_maps(job: tuple) -> list[tuple]:
    """A pool task: each image's class map upright, as the ``classmap`` kind stores it, its
    largest class index, and its note where it has no usable map (kept, of no class)."""
    src, masks, paths = job
    kind, out = ClassMapField(), []
    for path in paths:
        try:
            m = _upright(os.path.join(src, path), read_map(map_path(masks, path)))
        except (ValueError, OSError) as e:      # its pixels are still read: it has no map
            out.append((kind.to_bytes(np.full((1, 1), IGNORE, np.uint8)), -1,
                        [{"path": path, "kind": "note", "reason": f"class map: {e}; kept, "
                          f"all of it of no class ({IGNORE})"}]))
            continue
        labelled = m[m != IGNORE]
        out.append((kind.to_bytes(within_limit(m)), int(labelled.max()) if labelled.size
                    else -1, []))
    return out


def read_maps(src: str, masks: str, paths: list[str], *, workers: int, progress: bool
              ) -> tuple[FieldValues, list[str], list[dict]]:
    """The class maps of the images ``paths`` (in this order), read by ``workers`` processes.

    Returns:
        Their values as the field ``label`` (``classmap``, its classes ``"0"`` to the largest
        index found), the classes, and the notes on images kept without a usable map.
    """
    from fastdata.converters.pool import each_in_processes

    values, top, notes = FieldValues({"label": ClassMapField()}), -1, []
    for stored, largest, why in each_in_processes(_chunk_maps, (src, masks), paths,
                                                  workers=workers, what="class maps",
                                                  progress=progress):
        values.add_stored((stored,))
        top = max(top, largest)
        notes += why
    classes = [str(k) for k in range(max(top, 0) + 1)]
    values.fields["label"] = ClassMapField(classes=classes)     # its values' bytes as stored
    return values, classes, notes
