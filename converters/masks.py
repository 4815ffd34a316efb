"""Semantic class maps from a folder of PNGs parallel to the images (``fastdata convert SRC
OUT --masks MASKS``).

Image ``SRC/<path>/<name>.<ext>`` has the class map ``MASKS/<path>/<name>.png``: one 8-bit
value a pixel (mode ``L``, or ``P`` whose palette indices are the classes, as Pascal VOC's),
each a class index, 255 for pixels of no class. The classes are ``"0"`` to the largest index
found. An image without a class map, or whose map is not such a PNG of its size (stored, or
upright: ``fastdata.converters.geometry``), is skipped and reported. Maps go through the same
orientation and fit as the pixels, resampled nearest; ``fit="pad"``'s borders are 255.
"""
from __future__ import annotations

import hashlib
import io
import os
import stat

import numpy as np
from PIL import Image, UnidentifiedImageError

from fastdata.converters.geometry import frame
from fastdata.converters.scan import Files, Scan, walk_images
from fastdata.converters.units import read_limited
from fastdata.fields.classmap import IGNORE, encode_runs

#: a class map file larger than this is refused before it is read
MAX_MAP_BYTES = 64 << 20
#: nor one of more pixels (a PNG's header can claim any size)
MAX_MAP_PIXELS = 1 << 28


def map_path(masks: str, path: str) -> str:
    """The class map of the image at ``path`` (relative to SRC)."""
    return os.path.join(masks, os.path.splitext(path)[0] + ".png")


def scan_masks(root: str, masks: str) -> Scan:
    """The images under ``root`` (any layout) that have a class map in ``masks``, sorted by
    path; the others become skipped entries.

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
    return Scan(root, ["0"], files.freeze(), ignored, skipped=skipped,
                label_kind="segmentation", masks=(masks, digest.hexdigest()))


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


def _chunk_maps(job: tuple) -> list[tuple]:
    """A pool task: each image's class map at every stored size (``encode_runs``'d),
    its largest class index, and what it skipped."""
    src, masks, paths, sizes, fit = job
    out = []
    for path in paths:
        try:
            m = read_map(map_path(masks, path))
            f = frame(os.path.join(src, path), (m.shape[1], m.shape[0]), sizes[-1], fit)
            squares = f.class_map(m, sizes, IGNORE)
        except (ValueError, OSError) as e:      # its pixels were read: it has no map
            squares = {s: np.full((s, s), IGNORE, np.uint8) for s in sizes}
            out.append(({s: encode_runs(v) for s, v in squares.items()}, -1,
                        [{"path": path, "kind": "note", "reason": f"class map: {e}; kept, "
                          f"all of it of no class ({IGNORE})"}]))
            continue
        labelled = m[m != IGNORE]
        out.append(({s: encode_runs(v) for s, v in squares.items()},
                    int(labelled.max()) if labelled.size else -1, []))
    return out


def write_class_maps_of(out_path: str, src: str, masks: str, paths, sizes, fit: str,
                        skipped: list, *, workers: int = 1, progress=None) -> tuple[dict, int]:
    """The class maps of the converted images ``paths`` (in sample order) into ``out_path``,
    made by ``workers`` processes; what cannot be used is appended to ``skipped``. Returns
    the manifest's ``annotations`` entry and the largest class index found (-1: none)."""
    from fastdata.converters.pool import CHUNK, map_in_processes
    from fastdata.shards.annotations import write_class_maps

    jobs = ((src, masks, paths[i:i + CHUNK], tuple(sizes), fit)
            for i in range(0, len(paths), CHUNK))
    maps: dict[int, list] = {size: [] for size in sizes}
    top = -1
    for chunk in map_in_processes(_chunk_maps, jobs, workers, "class maps"):
        for squares, largest, why in chunk:
            for size in sizes:
                maps[size].append(squares[size])
            top = max(top, largest)
            skipped += why
            if progress is not None:
                progress()
    return write_class_maps(out_path, maps), top
