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
Boxes and masks go through the same orientation and fit to the square as the pixels; a box is
clipped to the square, and dropped (reported) when nothing of it is left. Masks are decoded at
the image's size exactly as pycocotools decodes them, then resampled (nearest) to each stored
size. An annotation without a ``segmentation`` in a set with masks gets its box as its mask.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass

import numpy as np

from fastdata.converters.geometry import frame
from fastdata.converters.scan import Files, Scan, source_folder, walk_images
from fastdata.converters.table import relative
from fastdata.converters.units import read_limited
from fastdata.fields import field_of
from fastdata.fields.keypoints import KeypointsField
from fastdata.shards.annotations import encode_masks

#: an annotations file larger than this is refused before it is parsed (COCO 2017's largest,
#: train instances, is 448 MiB; parsed, JSON takes several times its size in memory)
MAX_COCO_BYTES = 1 << 30
#: an image with more annotations than this is skipped (COCO's most: a few hundred)
MAX_BOXES = 2048
#: an annotation whose polygons have more points than this in all is skipped
MAX_POINTS = 100_000
#: nor one whose outlines, traced at pycocotools' 5x, are longer than this many points in all
#: (a hostile zigzag of long edges would take GBs to trace)
MAX_TRACE = 4_000_000


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
    digest: str
    keypoints: KeypointsField | None = None


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _load(path: str) -> tuple[dict, str]:
    """The file parsed, and its SHA-256 (opened without blocking, checked before a byte is
    read)."""
    data = read_limited(path, MAX_COCO_BYTES, "annotations file")
    try:
        d = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"annotations file {path} is not readable JSON ({e})") from None
    if not isinstance(d, dict) or not all(isinstance(d.get(k), list) for k in
                                          ("images", "annotations", "categories")):
        raise ValueError(f"annotations file {path} is not COCO's: it needs lists images, "
                         f"annotations and categories")
    return d, hashlib.sha256(data).hexdigest()


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
        x, y = np.trunc(5 * a[0::2] + 0.5), np.trunc(5 * a[1::2] + 0.5)
        trace += int(np.maximum(np.abs(np.roll(x, -1) - x), np.abs(np.roll(y, -1) - y)).sum())
    return f"polygon outlines of more than {MAX_TRACE} points" if trace > MAX_TRACE else None


def _rle_problem(seg: dict, h: int, w: int) -> str | None:
    counts, size = seg.get("counts"), seg.get("size")
    if size != [h, w]:
        return f"RLE size {str(size)[:40]} is not the image's [{h}, {w}]"
    try:
        if isinstance(counts, str) and len(counts) <= 8 * (h * w + 1):
            counts = _string_counts(counts)
        if isinstance(counts, list) and len(counts) <= h * w + 1 and all(
                isinstance(c, int) and c >= 0 for c in counts) and sum(counts) == h * w:
            return None
    except ValueError:
        pass
    return f"RLE counts are not a COCO string or list of counts covering {h}x{w} pixels"


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
    d, digest = _load(path)
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
    return Coco(classes, images, annotations, masks, digest, keypoints), skipped


def scan_coco(root: str, path: str) -> Scan:
    """The images under ``root`` that the COCO file ``path`` lists, sorted by path; what
    either side lacks becomes a skipped entry (``read_coco``'s errors)."""
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
    return Scan(root, coco.classes, files.freeze(), ignored, skipped=skipped,
                label_kind="detection", coco=coco)


# ---- masks, decoded as pycocotools decodes them ----

def _polygon_toggles(xy: np.ndarray, h: int, w: int) -> np.ndarray:
    """Column-major positions where a polygon's mask changes value, by pycocotools' rule:
    the outline traced at 5x, then where it crosses each column's centre."""
    x = np.trunc(5 * xy[0::2] + 0.5).astype(np.int64)       # C's (int): toward zero
    y = np.trunc(5 * xy[1::2] + 0.5).astype(np.int64)
    xe, ye = np.roll(x, -1), np.roll(y, -1)
    dx, dy = np.abs(xe - x), np.abs(ye - y)
    flip = ((dx >= dy) & (x > xe)) | ((dx < dy) & (y > ye))
    xs, xe = np.where(flip, xe, x), np.where(flip, x, xe)
    ys, ye = np.where(flip, ye, y), np.where(flip, y, ye)
    along_x = dx >= dy
    steps = np.maximum(dx, dy)
    slope = np.where(along_x, ye - ys, xe - xs) / np.maximum(steps, 1)
    n = steps + 1
    edge = np.repeat(np.arange(len(n)), n)
    d = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)
    t = np.where(flip[edge], steps[edge] - d, d)
    ax = along_x[edge]
    u = np.where(ax, t + xs[edge], np.trunc(xs[edge] + slope[edge] * t + 0.5))
    v = np.where(ax, np.trunc(ys[edge] + slope[edge] * t + 0.5), t + ys[edge])
    u, v = u.astype(np.int64), v.astype(np.int64)
    moved = np.flatnonzero(u[1:] != u[:-1]) + 1
    xd = (np.where(u[moved] < u[moved - 1], u[moved], u[moved] - 1) + 0.5) / 5 - 0.5
    yd = (np.minimum(v[moved], v[moved - 1]) + 0.5) / 5 - 0.5
    keep = (np.floor(xd) == xd) & (xd >= 0) & (xd <= w - 1)
    yd = np.ceil(np.clip(yd[keep], 0, h))
    return xd[keep].astype(np.int64) * h + yd.astype(np.int64)


def _columns(toggles: np.ndarray, h: int, w: int) -> tuple[int, np.ndarray]:
    """From column-major toggle positions (two at one place cancel), the mask's columns
    that hold any of it: ``(first column, (columns, h) uint8)``, column-major."""
    inside = toggles[toggles < h * w]
    if not len(inside):
        return 0, np.zeros((0, h), np.uint8)
    first, last = int(inside.min()) // h, int(inside.max()) // h
    flips = np.bincount(inside - first * h, minlength=(last - first + 1) * h)
    return first, (np.cumsum(flips) & 1).astype(np.uint8).reshape(-1, h)


def _mask_columns(segmentation, h: int, w: int) -> tuple[int, np.ndarray]:
    """A COCO segmentation as ``_columns`` gives it: its polygons' union, or its RLE."""
    if isinstance(segmentation, dict):
        c = segmentation["counts"]
        return 0, _rle(_string_counts(c) if isinstance(c, str) else c, h, w).T
    parts = [_columns(_polygon_toggles(np.asarray(p, np.float64), h, w), h, w)
             for p in segmentation]
    parts = [(x, m) for x, m in parts if len(m)]
    if not parts:
        return 0, np.zeros((0, h), np.uint8)
    first = min(x for x, _ in parts)
    out = np.zeros((max(x + len(m) for x, m in parts) - first, h), np.uint8)
    for x, m in parts:      # several polygons: their union
        out[x - first:x - first + len(m)] |= m
    return first, out


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


def coco_mask(segmentation, h: int, w: int) -> np.ndarray:
    """A COCO segmentation (polygons, or RLE with string or list counts) as an ``(h, w)``
    uint8 mask of 0 and 1: pycocotools' ``annToMask``. Raises ValueError on malformed RLE."""
    first, columns = _mask_columns(segmentation, h, w)
    mask = np.zeros((w, h), np.uint8)
    mask[first:first + len(columns)] = columns
    return mask.T


def _image_targets(src: str, path: str, entry: tuple, anns: list[dict], masks: bool, sizes,
                   fit: str, skipped: list):
    """One image's ``(boxes (k, 4), classes, iscrowd, {size: each mask's runs})`` in the
    square; ``entry``: its (id, width, height) in the file."""
    _, w, h = entry
    f = frame(os.path.join(src, path), (w, h), sizes[-1], fit)
    b = np.array([a["bbox"] for a in anns], np.float64).reshape(-1, 4)
    x, y = f.points(np.stack([b[:, 0], b[:, 0] + b[:, 2]]), np.stack([b[:, 1], b[:, 1] + b[:, 3]]))
    s = sizes[-1]
    boxes = np.stack([x.min(0), y.min(0), x.max(0), y.max(0)], 1).clip(0, s) / s
    keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
    for k in np.flatnonzero(~keep):
        skipped.append({"path": path, "kind": "note", "reason": f"annotation {k} of the "
                        f"image: its box is outside the stored square, dropped"})
    kept = [a for a, k in zip(anns, keep) if k]
    runs: dict[int, list[np.ndarray]] = {size: [] for size in sizes}
    for a in kept if masks else ():
        seg = a["segmentation"]
        if seg is None:         # its box, as pycocotools makes a mask of a box
            x0, y0, bw, bh = a["bbox"]
            seg = [[x0, y0, x0, y0 + bh, x0 + bw, y0 + bh, x0 + bw, y0]]
        for size, m in f.mask(_mask_columns(seg, h, w), sizes).items():
            runs[size] += encode_masks(m[None])
    points = None
    if kept and kept[0]["keypoints"] is not None:
        points = _moved_points(f, np.stack([a["keypoints"] for a in kept]), s)
    return (boxes[keep].astype(np.float32), [a["category"] for a in kept],
            [a["iscrowd"] for a in kept], runs, points)


def _moved_points(f, p: np.ndarray, s: int) -> np.ndarray:
    """Keypoints ``(n, K, 3)`` in the file's pixels through the image's orientation and fit:
    as fractions of the square; where they fall off it, or are not labelled, ``v = 0`` (at 0,
    0). COCO's coordinates are integers in ``[0, W - 1]``: the pixel's centre is half a pixel
    on (detectron2's rule)."""
    x, y = f.points(p[..., 0] + 0.5, p[..., 1] + 0.5)
    v = np.where((x >= 0) & (x < s) & (y >= 0) & (y < s) & (p[..., 2] > 0), p[..., 2], 0)
    out = np.stack([x / s, y / s, v], -1)
    out[v == 0] = 0
    return out.astype(np.float32)


def _chunk_targets(job: tuple) -> list[tuple]:
    """A pool task: ``_image_targets`` of each image of a chunk, with what it skipped."""
    src, images, masks, sizes, fit = job
    out = []
    for path, entry, anns in images:
        skipped: list[dict] = []
        try:
            result = _image_targets(src, path, entry, anns, masks, sizes, fit, skipped)
        except (ValueError, OSError) as e:      # its pixels were read: its annotations not
            skipped.append({"path": path, "reason": f"annotations: {e}; kept without boxes",
                            "kind": "note"})
            result = (np.zeros((0, 4), np.float32), [], [], {size: [] for size in sizes}, None)
        out.append((*result, skipped))
    return out


def write_coco_annotations(out_path: str, src: str, paths, coco: Coco, sizes, fit: str,
                           skipped: list, *, workers: int = 1, progress=None) -> dict:
    """The annotations of the converted images ``paths`` (in sample order) into
    ``out_path``, made by ``workers`` processes (each sent its images' annotations only);
    what cannot be used is appended to ``skipped``. Returns the manifest's ``annotations``
    entry."""
    from fastdata.converters.pool import CHUNK, map_in_processes
    from fastdata.shards.annotations import write_annotations

    jobs = ((src, [(p, coco.images[p], coco.annotations.get(coco.images[p][0], []))
                   for p in paths[i:i + CHUNK]], coco.masks, tuple(sizes), fit)
            for i in range(0, len(paths), CHUNK))
    offsets, boxes, classes, crowd, points = [0], [], [], [], []
    runs: dict[int, list[np.ndarray]] = {size: [] for size in sizes}
    k = len(coco.keypoints.names) if coco.keypoints is not None else 0
    for chunk in map_in_processes(_chunk_targets, jobs, workers, "boxes and masks"):
        for b, c, z, r, p, why in chunk:
            offsets.append(offsets[-1] + len(b))
            boxes.append(b)
            points.append(p if p is not None else np.zeros((len(b), k, 3), np.float32))
            classes += c
            crowd += z
            skipped += why
            for size in sizes:
                runs[size] += r.get(size, [])
            if progress is not None:
                progress()
    keypoints = None if coco.keypoints is None else (
        coco.keypoints, np.concatenate(points) if points else np.zeros((0, k, 3), np.float32))
    return write_annotations(out_path, offsets, np.concatenate(boxes) if boxes else
                             np.zeros((0, 4)), classes, crowd, runs if coco.masks else None,
                             keypoints)
