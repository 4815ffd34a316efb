"""Boxes and instance masks from a COCO annotations file (``fastdata convert SRC OUT --coco
instances.json``).

Each image of the file's ``images`` is ``SRC/<file_name>``; its class list is the file's
``categories`` in id order (their names, which must be distinct). What is kept:

* an image of the file that is under SRC, with its valid annotations (none is fine: a
  negative). Images under SRC the file does not list, and images it lists that SRC lacks, are
  skipped, as are images with more than ``MAX_BOXES`` annotations;
* an annotation with a known ``image_id`` and ``category_id`` and a ``bbox`` of four finite
  numbers with positive width and height; its ``segmentation`` (polygons, or RLE, compressed or
  not) where the file has any, and its ``keypoints`` where the categories name keypoints
  (COCO's person keypoints: their names and skeleton; ``fastdata.fields.keypoints``). Others
  are skipped, each named (``annotation <id>``) with why.

Coordinates are in the frame the file's ``width`` and ``height`` describe: the image upright (its
EXIF orientation applied, as its pixels are stored), or as stored if that is the frame they
match (an orientation that swaps the sides); where both match, upright (detectron2's
convention). An image whose size matches neither keeps its pixels, without boxes (reported).
They are read as the source is scanned (in processes) and become the set's field ``label`` of
kind ``boxes`` (``fastdata.fields.boxes``: ``detection_field``), with crowd flags, masks and
keypoints: turned upright with the pixels and placed on the square as the fit placed them (a
box clipped to it; dropped when nothing of it is left). A mask is kept as outlines,
drawn at each batch's output size: a polygon's as the file gives them (pixel edges at whole
coordinates, as a ``bbox``'s: a pixel is inside where its centre is, so a polygon along a
region's edges gives its pixels, where pycocotools' rasterisation can add a pixel at the right
and bottom), a crowd region's RLE decoded as pycocotools decodes it and kept as the
``rectangles`` that tile it (drawn again exactly at the image's size). An annotation without a
``segmentation`` in a set with masks gets its box as its mask.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import numpy as np

from fastdata.converters.geometry import frame
from fastdata.converters.scan import FieldValues, Files, Scan, source_folder, walk_images
from fastdata.converters.table import relative
from fastdata.converters.units import read_limited
from fastdata.fields import field_of
from fastdata.fields.base import check_bytes
from fastdata.fields.boxes import BoxesField
from fastdata.fields.keypoints import KeypointsField

#: an annotations file larger than this is refused before it is parsed (COCO 2017's largest,
#: train instances, is 448 MiB; parsed, JSON takes several times its size in memory)
MAX_COCO_BYTES = 1 << 30
#: an image with more annotations than this is skipped (COCO's most: a few hundred)
MAX_BOXES = 2048
#: an annotation whose polygons have more points than this in all is skipped
MAX_POINTS = 100_000
#: nor one whose outlines are longer than this many pixels in all: a hostile zigzag of
#: long edges would take as long to draw into every batch that holds it
MAX_TRACE = 1_000_000


@dataclass
class Coco:
    """A checked annotations file: ``images`` path -> (id, width, height); ``annotations``
    image id -> its valid annotations; ``masks``: whether any has a segmentation;
    ``keypoints``: the categories' keypoints (``fastdata.fields.keypoints``), if they have
    any."""
    classes: list[str]
    images: dict[str, tuple[int, int, int]]
    annotations: dict[int, list[dict]]
    masks: bool
    keypoints: KeypointsField | None = None


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _load(path: str) -> dict:
    """The file parsed (opened without blocking, checked before a byte is read)."""
    data = read_limited(path, MAX_COCO_BYTES, "annotations file")
    try:
        d = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"annotations file {path} is not readable JSON ({e})") from None
    if not isinstance(d, dict) or not all(isinstance(d.get(k), list) for k in
                                          ("images", "annotations", "categories")):
        raise ValueError(f"annotations file {path} is not COCO's: it needs lists images, "
                         f"annotations and categories")
    return d


def _categories(path: str, cats: list) -> tuple[list[str], dict[int, int]]:
    ok = [c for c in cats if isinstance(c, dict) and isinstance(c.get("id"), int)
          and isinstance(c.get("name"), str) and c["name"]]
    if len(ok) != len(cats) or not cats:
        raise ValueError(f"annotations file {path}: categories must be a non-empty list of "
                         f"{{id: integer, name: text}}")
    ok.sort(key=lambda c: c["id"])
    names = [c["name"] for c in ok]
    if len(set(names)) != len(names) or len({c["id"] for c in ok}) != len(ok):
        raise ValueError(f"annotations file {path}: category names and ids must be distinct")
    return names, {c["id"]: k for k, c in enumerate(ok)}


def _keypoints_of(path: str, cats: list) -> KeypointsField | None:
    """The keypoints the categories name (COCO's person keypoints: their names and skeleton,
    1-based indices); None where none has any. Every category that has some must name the
    same ones."""
    named = [c for c in cats if c.get("keypoints")]
    if not named:
        return None
    names = named[0]["keypoints"]
    skeleton = named[0].get("skeleton") or []
    try:
        if any(c["keypoints"] != names for c in named) or not all(
                isinstance(n, str) for n in names):
            raise ValueError("categories name different keypoints")
        pairs = [(names[a - 1], names[b - 1]) for a, b in skeleton
                 if isinstance(a, int) and isinstance(b, int) and 0 < a <= len(names)
                 and 0 < b <= len(names)]
        return field_of("keypoints", names=names, skeleton=pairs)    # type: ignore[return-value]
    except (TypeError, ValueError) as e:
        raise ValueError(f"annotations file {path}: the categories' keypoints are not one list "
                         f"of distinct names with a skeleton of pairs of them ({e})") from None


def _images(images: list, skipped: list) -> dict[str, tuple[int, int, int]]:
    out: dict[str, tuple[int, int, int]] = {}
    ids = set()
    for k, im in enumerate(images):
        ok = isinstance(im, dict) and isinstance(im.get("id"), int) and all(
            isinstance(im.get(n), int) and 0 < im[n] <= 1 << 16 for n in ("width", "height"))
        rel = relative(im["file_name"]) if ok and isinstance(im.get("file_name"), str) else None
        if rel is None or im["id"] in ids or rel in out:
            skipped.append({"path": f"images[{k}]", "kind": "bad_label",
                            "reason": "annotations file: not an image "
                            "entry {id, file_name inside the source folder, width, height} "
                            "(or one listed again)"})
            continue
        ids.add(im["id"])
        out[rel] = (im["id"], im["width"], im["height"])
    return out


def _segmentation_problem(seg, h: int, w: int) -> str | None:
    """Why ``seg`` is not a usable COCO segmentation of an h x w image, or None."""
    if isinstance(seg, list):
        return _polygons_problem(seg, h, w)
    if isinstance(seg, dict):
        return _rle_problem(seg, h, w)
    return "segmentation is neither polygons nor RLE"


def _polygons_problem(seg: list, h: int, w: int) -> str | None:
    if not seg or not all(isinstance(p, list) and len(p) >= 6 and len(p) % 2 == 0
                          for p in seg):
        return "segmentation is not a list of polygons of 3 or more points"
    if sum(map(len, seg)) > 2 * MAX_POINTS:
        return f"polygons of more than {MAX_POINTS} points"
    trace = 0
    for p in seg:
        a = np.asarray(p if all(map(_number, p)) else [np.nan], np.float64)
        if not np.isfinite(a).all() or (np.abs(a[0::2]) > 2 * w).any() \
                or (np.abs(a[1::2]) > 2 * h).any():
            return "a polygon's points are not finite numbers near the image"
        x, y = a[0::2], a[1::2]
        trace += int(np.ceil(np.maximum(np.abs(np.roll(x, -1) - x),
                                        np.abs(np.roll(y, -1) - y))).sum())
    return f"polygon outlines of more than {MAX_TRACE} pixels" if trace > MAX_TRACE else None


def _rle_problem(seg: dict, h: int, w: int) -> str | None:
    counts, size = seg.get("counts"), seg.get("size")
    if size != [h, w]:
        return f"RLE size {str(size)[:40]} is not the image's [{h}, {w}]"
    try:
        if isinstance(counts, str) and len(counts) <= 8 * (h * w + 1):
            counts = _string_counts(counts)
        if isinstance(counts, list) and len(counts) <= h * w + 1 and all(
                isinstance(c, int) and c >= 0 for c in counts) and sum(counts) == h * w:
            return _column_runs_problem(np.asarray(counts, np.int64), h)
    except ValueError:
        pass
    return f"RLE counts are not a COCO string or list of counts covering {h}x{w} pixels"


def _column_runs_problem(counts: np.ndarray, h: int) -> str | None:
    """Why an RLE's region would be too many outlines to keep (its runs of 1 cut at each
    column's end, each at most a rectangle: ``rectangles``), or None."""
    ends = np.cumsum(counts)
    starts = ends - counts
    ones = counts[1::2] > 0
    runs = int(((ends[1::2] - 1) // h - starts[1::2] // h + 1)[ones].sum())
    return f"RLE of more than {MAX_POINTS // 4} runs in its columns" if \
        runs > MAX_POINTS // 4 else None


def _annotation(a, coco_images: dict[int, tuple[int, int]], cats: dict[int, int],
                keypoints: KeypointsField | None = None) -> tuple[dict | None, str | None]:
    """``(annotation, None)`` if usable, else ``(None, why)``."""
    if not isinstance(a, dict):
        return None, "not an object"
    if a.get("image_id") not in coco_images or isinstance(a.get("image_id"), bool):
        return None, f"image_id {str(a.get('image_id'))[:40]} is not an image of the file"
    if a.get("category_id") not in cats or isinstance(a.get("category_id"), bool):
        return None, f"category_id {str(a.get('category_id'))[:40]} is not a category"
    box = a.get("bbox")
    if not (isinstance(box, list) and len(box) == 4 and all(map(_number, box))
            and box[2] > 0 and box[3] > 0):
        return None, "bbox is not 4 finite numbers [x, y, width, height], width and height > 0"
    if a.get("iscrowd", 0) not in (0, 1):
        return None, "iscrowd is not 0 or 1"
    w, h = coco_images[a["image_id"]]
    seg = a.get("segmentation")
    if seg is not None and seg != []:
        why = _segmentation_problem(seg, h, w)
        if why is not None:
            return None, why
    else:
        seg = None
    points = None
    if keypoints is not None:
        points, why = _points(a.get("keypoints"), len(keypoints.names))
        if why is not None:
            return None, why
    return {"bbox": [float(v) for v in box], "category": cats[a["category_id"]],
            "iscrowd": int(a.get("iscrowd", 0)), "segmentation": seg,
            "keypoints": points}, None


def _points(values, k: int) -> tuple[np.ndarray | None, str | None]:
    """An annotation's ``keypoints`` (``[x1, y1, v1, ...]``, pixels) as ``(k, 3)``, or why
    not; none given: ``k`` points not labelled."""
    if values is None:
        return np.zeros((k, 3)), None
    if not (isinstance(values, list) and len(values) == 3 * k and all(map(_number, values))):
        return None, f"keypoints is not {3 * k} finite numbers [x1, y1, v1, ...]"
    p = np.asarray(values, np.float64).reshape(k, 3)
    if not np.isin(p[:, 2], (0, 1, 2)).all():
        return None, "a keypoint's visibility is not 0, 1 or 2"
    return p, None


def read_coco(path: str) -> tuple[Coco, list[dict]]:
    """Parse and check a COCO annotations file: the usable part, and what is skipped.

    Raises:
        ValueError: not a regular file, too large, not JSON, not COCO's layout, or categories
            that are not distinct.
    """
    d = _load(path)
    classes, cats = _categories(path, d["categories"])
    keypoints = _keypoints_of(path, d["categories"])
    skipped: list[dict] = []
    images = _images(d["images"], skipped)
    by_id = {i: (w, h) for i, w, h in images.values()}
    annotations: dict[int, list[dict]] = {}
    for k, a in enumerate(d["annotations"]):
        ann, why = _annotation(a, by_id, cats, keypoints)
        name = a.get("id", k) if isinstance(a, dict) else k
        if ann is None:
            skipped.append({"path": f"annotation {str(name)[:40]}", "reason": why,
                            "kind": "bad_label"})
        else:
            annotations.setdefault(a["image_id"], []).append(ann)
    masks = any(x["segmentation"] is not None for v in annotations.values() for x in v)
    return Coco(classes, images, annotations, masks, keypoints), skipped


def scan_coco(root: str, path: str, *, workers: int = 1, progress: bool = False) -> Scan:
    """The images under ``root`` that the COCO file ``path`` lists, sorted by path, their
    annotations read (``read_targets``); what either side lacks becomes a skipped entry
    (``read_coco``'s errors)."""
    root = source_folder(root)
    coco, skipped = read_coco(path)
    ignored: dict[str, int] = {}
    present = set(walk_images(root, "", ignored))
    skipped += [{"path": p, "reason": "not in the annotations file", "kind": "unlabelled"}
                for p in sorted(present - set(coco.images))]
    skipped += [{"path": p, "reason": "in the annotations file, not an image in the source "
                 "folder", "kind": "missing"} for p in sorted(set(coco.images) - present)]
    paths = []
    for p in sorted(present & set(coco.images)):
        n = len(coco.annotations.get(coco.images[p][0], []))
        if n > MAX_BOXES:
            skipped.append({"path": p, "reason": f"{n} annotations, more than {MAX_BOXES}",
                            "kind": "bad_label"})
        else:
            paths.append(p)
    files = Files()
    files.extend(paths, 0)
    values, notes = read_targets(root, paths, coco, workers=workers, progress=progress)
    return Scan(root, coco.classes, files.freeze(), ignored, skipped=skipped + notes,
                label_kind="detection", values=values)


# ---- a crowd region's RLE, decoded as pycocotools decodes it ----

def _string_counts(s: str) -> list[int]:
    """pycocotools' compressed RLE counts (6 bits a character, deltas from the count two
    before after the third). Raises ValueError on a malformed string."""
    counts: list[int] = []
    p, n = 0, len(s)
    while p < n:
        x = k = 0
        more = True
        while more:
            c = ord(s[p]) - 48 if p < n else -1
            if not 0 <= c < 64 or k >= 7:
                raise ValueError("malformed RLE string")
            x |= (c & 0x1F) << 5 * k
            more = bool(c & 0x20)
            p, k = p + 1, k + 1
            if not more and c & 0x10:
                x |= -1 << 5 * k
        counts.append(x + counts[-2] if len(counts) > 2 else x)
    return counts


def _rle(counts: list[int], h: int, w: int) -> np.ndarray:
    a = np.asarray(counts, np.int64)
    if (a < 0).any() or a.sum() != h * w:
        raise ValueError(f"RLE counts do not cover {h}x{w} pixels")
    values = np.resize(np.array([0, 1], np.uint8), len(a))
    return np.repeat(values, a).reshape(w, h).T


def rle_mask(segmentation: dict, h: int, w: int) -> np.ndarray:
    """A COCO RLE segmentation (string or list counts) as an ``(h, w)`` uint8 mask of 0 and 1:
    pycocotools' ``annToMask``. Raises ValueError on malformed RLE."""
    c = segmentation["counts"]
    return _rle(_string_counts(c) if isinstance(c, str) else c, h, w)


def rectangles(mask: np.ndarray) -> np.ndarray:
    """The rectangles that tile a mask's 1s: ``(n, 4)`` int64 ``x0, y0, x1, y1`` on pixel
    edges (pixel ``(c, r)`` is ``[c, c + 1) x [r, r + 1)``), each column's runs, those of
    neighbouring columns over the same rows joined. As outlines they draw the mask again
    exactly at its size (a pixel is inside where its centre is)."""
    edges = np.diff(np.pad(mask.T.astype(np.int8), ((0, 0), (1, 1))), axis=1)
    col, top = np.nonzero(edges == 1)
    _, bottom = np.nonzero(edges == -1)     # paired with the starts: each column's in order
    order = np.lexsort((col, bottom, top))
    col, top, bottom = col[order], top[order], bottom[order]
    first = np.ones(len(col), bool)
    first[1:] = (top[1:] != top[:-1]) | (bottom[1:] != bottom[:-1]) | (col[1:] != col[:-1] + 1)
    a = np.flatnonzero(first)
    b = np.r_[a[1:], len(col)] - 1
    return np.stack([col[a], top[a], col[b] + 1, bottom[a]], 1)


def detection_field(coco: Coco) -> BoxesField:
    """The kind of a detection set's field ``label``: boxes of the file's categories, with
    crowd flags, masks where any annotation has a segmentation, keypoints where the
    categories name them."""
    return BoxesField(classes=coco.classes, masks=coco.masks, crowd=True,
                      keypoints=None if coco.keypoints is None else coco.keypoints.params())


def _outlines(a: dict, h: int, w: int) -> list[np.ndarray]:
    """An annotation's mask as outlines ``(k, 2)`` in the file's pixels: its polygons, its
    RLE's ``rectangles``, or (none given) its box."""
    seg = a["segmentation"]
    if isinstance(seg, dict):
        r = rectangles(rle_mask(seg, h, w)).astype(np.float64)
        return list(r[:, [0, 1, 2, 1, 2, 3, 0, 3]].reshape(-1, 4, 2))
    if seg is None:         # its box, as pycocotools makes a mask of a box
        x0, y0, bw, bh = a["bbox"]
        seg = [[x0, y0, x0 + bw, y0, x0 + bw, y0 + bh, x0, y0 + bh]]
    return [np.asarray(p, np.float64).reshape(-1, 2) for p in seg]


def _image_targets(src: str, path: str, entry: tuple, anns: list[dict], kind: BoxesField,
                   skipped: list):
    """One image's value of the field ``label`` (``detection_field``), in fractions of the
    picture upright; ``entry``: its (id, width, height) in the file."""
    _, w, h = entry
    f = frame(os.path.join(src, path), (w, h))
    b = np.array([a["bbox"] for a in anns], np.float64).reshape(-1, 4)
    x, y = f.points(np.stack([b[:, 0], b[:, 0] + b[:, 2]]), np.stack([b[:, 1], b[:, 1] + b[:, 3]]))
    boxes = np.stack([x.min(0), y.min(0), x.max(0), y.max(0)], 1).clip(0, 1)
    keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
    for k in np.flatnonzero(~keep):
        skipped.append({"path": path, "kind": "note", "reason": f"annotation {k} of the "
                        f"image: its box is outside the picture, dropped"})
    kept = [a for a, k in zip(anns, keep) if k]
    rows = np.zeros((len(kept), kind.width), np.float32)
    rows[:, :4] = boxes[keep]
    rows[:, 4] = [a["category"] for a in kept]
    rows[:, 5] = [a["iscrowd"] for a in kept]
    if kind.points is not None and kept:
        rows[:, 6:] = _moved_points(f, np.stack([a["keypoints"] for a in kept])).reshape(
            len(kept), -1)
    if not kind.masks:
        return rows
    polygons = []
    for a in kept:
        outlines = []
        for xy in _outlines(a, h, w):
            px, py = f.points(xy[:, 0], xy[:, 1])
            outlines.append(np.stack([px, py], 1).astype(np.float32))
        polygons.append(outlines)
    return {"boxes": rows, "polygons": polygons}


def _moved_points(f, p: np.ndarray) -> np.ndarray:
    """Keypoints ``(n, K, 3)`` in the file's pixels through the image's orientation: as
    fractions of the picture upright; where they fall off it, or are not labelled, ``v = 0``
    (at 0, 0). COCO's coordinates are integers in ``[0, W - 1]``: the pixel's centre is half a
    pixel on (detectron2's rule)."""
    x, y = f.points(p[..., 0] + 0.5, p[..., 1] + 0.5)
    v = np.where((x >= 0) & (x < 1) & (y >= 0) & (y < 1) & (p[..., 2] > 0), p[..., 2], 0)
    out = np.stack([x, y, v], -1)
    out[v == 0] = 0
    return out.astype(np.float32)


def _chunk_targets(job: tuple) -> list[tuple]:
    """A pool task: each image's value of the field ``label`` as its column stores it, with
    what it skipped."""
    src, kind, images = job
    out = []
    empty = kind.to_bytes({"boxes": np.zeros((0, kind.width), np.float32), "polygons": []}
                          if kind.masks else np.zeros((0, kind.width), np.float32))
    for path, entry, anns in images:
        skipped: list[dict] = []
        try:
            stored = kind.to_bytes(_image_targets(src, path, entry, anns, kind, skipped))
            check_bytes(len(stored), f"{path}: its annotations")
        except (ValueError, OSError) as e:      # its pixels are still read: no boxes
            skipped.append({"path": path, "reason": f"annotations: {e}; kept without boxes",
                            "kind": "note"})
            stored = empty
        out.append((stored, skipped))
    return out


def read_targets(src: str, paths: list[str], coco: Coco, *, workers: int = 1,
                 progress: bool = False) -> tuple[FieldValues, list[dict]]:
    """The boxes, masks and keypoints of the images ``paths`` (in this order), made by
    ``workers`` processes (each sent its images' annotations only).

    Returns:
        Their values as the field ``label`` (``detection_field``), and the notes on what of
        them could not be used.
    """
    from fastdata.converters.pool import each_in_processes

    kind = detection_field(coco)
    values, notes = FieldValues({"label": kind}), []
    images = [(p, coco.images[p], coco.annotations.get(coco.images[p][0], [])) for p in paths]
    for stored, why in each_in_processes(_chunk_targets, (src, kind), images, workers=workers,
                                         what="annotations", progress=progress):
        values.add_stored((stored,))
        notes += why
    return values, notes
