"""``fastdata info``: describe a shard set, or the environment."""

from __future__ import annotations

import argparse
import json

from fastdata._optional import DISTRIBUTION
from fastdata.checks import printable
from fastdata.cli.common import echo, human_bytes
from fastdata.format import json_text, skip_summary

HELP = "describe a shard set (or the environment with --env)"


def info_dict(path: str) -> dict:
    import numpy as np

    from fastdata.shards import ShardSet
    from fastdata.shards.annotations import IGNORE, Annotations, ClassMaps

    ds = ShardSet(path)
    m = ds.manifest
    ann = ds.annotations
    counts: np.ndarray | list | None
    extra: dict = {}
    if ds.label_kind == "class":
        # a remote set's labels are in its shards: counted where the manifest has them, else
        # not at all (reading them would download the whole set); a local set's are read
        counts = m.get("class_counts") if ds.url is not None else \
            np.bincount(ds.labels, minlength=len(ds.classes))
    elif isinstance(ann, Annotations):          # detection: the boxes of each class
        counts = np.bincount(ann.classes, minlength=len(ds.classes))
        extra = {"boxes": len(ann.boxes), "instance_masks": ann.has_masks,
                 "images_without_boxes": int((ann.counts(np.arange(len(ds))) == 0).sum()),
                 "keypoints": ann.keypoints_kind and ann.keypoints_kind.names}
    elif ds.label_kind == "detection":          # its boxes the field "label"
        counts, extra = _boxes_of(ds)
    elif isinstance(ann, ClassMaps):            # segmentation: the pixels of each class
        _, runs, values = ann.maps[ds.sizes[-1]]
        pixels = np.bincount(values, weights=runs, minlength=256)
        counts = pixels[:len(ds.classes)]
        extra = {"ignored_pixels": int(pixels[IGNORE]), "map_size": ds.sizes[-1]}
    elif ds.label_kind == "segmentation":       # its maps the field "label"
        counts, extra = _map_pixels(ds)
    elif ds.label_kind == "multi_label":        # the images holding each class
        labels = ds.labels
        counts = labels.sum(0) if len(labels) else np.zeros(len(ds.classes))
    else:                                       # regression: no count per target
        counts = np.full(len(ds.classes), len(ds))
    return {
        **extra,
        "label_kind": ds.label_kind,
        "path": ds.location, "container": ds.container, "encoding": ds.encoding,
        "quality": m.get("quality"), "sizes": list(ds.sizes), "fit": m["fit"],
        "samples": len(ds), "classes": dict(zip(ds.classes, map(int, counts)))
        if counts is not None else dict.fromkeys(ds.classes),
        "shards": len(m["shards"]), "bytes": sum(s["bytes"] for s in m["shards"]),
        "skipped": m["skipped"], "ignored": m["ignored"], "empty_classes": m["empty_classes"],
        "source": m["source"], "format_version": m["version"],
        "readahead_at_random": ds.readahead, "remote": ds.url is not None,
        "fields": _fields(ds),
    }


def _fields(ds) -> dict:
    """Each field's kind and what its values hold (a remote set's: its kind alone, since its
    values are in shards not fetched)."""
    import numpy as np

    from fastdata.fields import Column

    out = {}
    for name, kind in ds.fields.items():
        if ds.url is not None or kind.fixed:
            out[name] = kind.describe(Column(np.zeros(0)))
            continue
        lengths = [np.diff(reader.column(name).offsets) for reader in ds.shards]
        offsets = np.concatenate([[0], np.cumsum(np.concatenate(lengths))]).astype(np.int64)
        out[name] = kind.describe(Column(np.zeros(0, np.uint8), offsets))
    ds.close()
    return out


#: the skipped inputs ``info`` lists (``--json`` and the manifest have them all)
SHOWN_SKIPPED = 20


def _print_skipped(d: dict) -> None:
    p = printable
    skipped = d["skipped"]
    echo(f"  skipped: {len(skipped)}" + (f" ({skip_summary(skipped)})" if skipped else ""))
    for s in skipped[:SHOWN_SKIPPED]:
        echo(f"    {p(s['path'])}: {p(s['reason'])}")
    if len(skipped) > SHOWN_SKIPPED:
        echo(f"    ... and {len(skipped) - SHOWN_SKIPPED} more (every one: `fastdata info "
             f"{p(d['path'])} --json`, or the manifest's \"skipped\")")


def _boxes_of(ds) -> tuple:
    """A detection set's boxes of each class, and how many it has, with masks or not, the
    names of each box's keypoints (if any), and how many images have none; a remote set's
    are not counted (that would download the whole set)."""
    import numpy as np

    kind = ds.label_field
    extra = {"boxes": None, "instance_masks": kind.masks, "images_without_boxes": None,
             "keypoints": kind.points and kind.points.names}
    if ds.url is not None:
        return None, extra
    counts, boxes, empty = np.zeros(len(ds.classes), np.int64), 0, 0
    for a in range(0, len(ds), 256):
        for v in ds.field_values("label", np.arange(a, min(a + 256, len(ds)))):
            rows = v["boxes"] if kind.masks else v
            counts += np.bincount(rows[:, 4].astype(np.int64), minlength=len(ds.classes))
            boxes, empty = boxes + len(rows), empty + (not len(rows))
    return counts, {**extra, "boxes": boxes, "images_without_boxes": empty}


def _map_pixels(ds) -> tuple:
    """A segmentation set's pixels of each class and of none on its stored squares of the
    largest size; a remote set's are not counted (that would download the whole set)."""
    import numpy as np

    from fastdata.fields.classmap import IGNORE
    from fastdata.ops.targets import moved

    side = ds.sizes[-1]
    if ds.url is not None:
        return None, {"ignored_pixels": None, "map_size": side}
    pixels = np.zeros(256, np.int64)
    for a in range(0, len(ds), 64):
        idx = np.arange(a, min(a + 64, len(ds)))
        for m in ds.field_values("label", idx, moved(len(idx), None, side, side)):
            pixels += np.bincount(m.ravel(), minlength=256)
    return pixels[:len(ds.classes)], {"ignored_pixels": int(pixels[IGNORE]), "map_size": side}


def print_info(d: dict) -> None:
    enc = d["encoding"] + (f" (quality {d['quality']})" if d["quality"] else "")
    p = printable       # names in a set are not trusted: no escape sequence reaches the terminal
    echo(f"{p(d['path'])}  (from {p(d['source'])})")
    plural = "" if d["shards"] == 1 else "s"
    echo(f"  {d['samples']} sample{'' if d['samples'] == 1 else 's'} in {d['shards']} "
         f"{d['container']} shard{plural}, {enc}, "
         f"sizes {', '.join(map(str, d['sizes']))} (fit: {d['fit']}), "
         f"{human_bytes(d['bytes'])} {'in the store' if d.get('remote') else 'on disk'}")
    kind, many = d.get("label_kind", "class"), len(d["classes"]) != 1
    if d.get("fields"):
        echo(f"  {len(d['fields'])} field{'' if len(d['fields']) == 1 else 's'} beside the "
             f"image{' and the label' if kind != 'none' else ''}:")
        for name, line in d["fields"].items():
            echo(f"    {p(name)}: {p(line)}")
    if kind == "none":
        echo("  no labels")
    else:
        _print_classes(d, kind, many)
    _print_skipped(d)
    if d["ignored"]:
        echo("  ignored: " + ", ".join(f"{p(k)}: {v}" for k, v in d["ignored"].items()))
    if d.get("remote"):
        return
    echo("  out of the page cache, read at random: " + (
        "with readahead (the set fits in half the memory available now)"
        if d["readahead_at_random"] else "without readahead (the set is larger than half the "
        "memory available now): each shuffled epoch reads its samples from the disk"
        + {"hdf5": ", a batch's pages asked for at once",
           "lmdb": ", a batch's pages asked for at once where earlier reads place them"
           if d["encoding"] == "raw" else ""}[d["container"]]))


def _print_classes(d: dict, kind: str, many: bool) -> None:
    p = printable
    what = {"class": ("class", "classes", ": samples each"),
            "multi_label": ("class", "classes", ", multi-label: samples holding each"),
            "regression": ("regression target", "regression targets", ""),
            "detection": ("class", "classes", ", detection: boxes of each"),
            "segmentation": ("class", "classes", f", segmentation: pixels of each at "
                                                 f"{d.get('map_size')} px")}[kind]
    if kind == "detection" and d["boxes"] is not None:
        points = d.get("keypoints")
        with_points = f", {len(points)} keypoints each ({', '.join(map(printable, points))})" \
            if points else ""
        echo(f"  {d['boxes']} boxes{' with instance masks' if d['instance_masks'] else ''}"
             f"{with_points}; {d['images_without_boxes']} images without any")
    if kind == "segmentation" and d["ignored_pixels"] is not None:
        echo(f"  class maps; {d['ignored_pixels']} pixels of no class (255) at "
             f"{d['map_size']} px")
    counted = kind != "regression" and None not in d["classes"].values()
    if kind == "class" and not counted:
        what = (*what[:2], " (the samples of each are in the shards: this set's manifest, "
                           "from an older conversion, does not count them)")
    echo(f"  {len(d['classes'])} {what[many]}{what[2]}:")
    names = {p(name): n for name, n in d["classes"].items()}
    width = max(map(len, names), default=0)
    for name, n in names.items():
        echo(f"    {name:<{width}}  {n}" if counted else f"    {name}")
    if d["empty_classes"]:
        echo(f"  empty classes (kept so that indices match the class names): "
             f"{', '.join(map(p, d['empty_classes']))}")


def run(a) -> int:
    if a.env:
        from fastdata.env import SIMD_FIX, env_info

        env = env_info()
        if a.json:
            echo(json.dumps(env, indent=1))
        else:
            width = max(map(len, env))
            for k, v in env.items():
                echo(f"{k:>{width}}: {v}")
            if not env["pil_simd"]:
                echo(f"  warning: PIL is not pillow-simd; fix: {SIMD_FIX}")
            if not env["native_kernel"]:
                echo("  warning: fastdata's C kernel was not built (no C compiler at install): "
                     "CPU augmentation runs about half as fast")
            if not env["webp"]:
                echo("  note: this PIL reads no WebP: .webp images are skipped as unreadable; "
                     "fix: install libwebp's headers (e.g. apt-get install libwebp-dev), then "
                     "./install.sh")
            if env["dali"] is None:
                echo(f"  note: DALI is not installed: backend='dali' needs it; "
                     f"pip install '{DISTRIBUTION}[dali]'")
        if not a.shards:
            return 0
    if not a.shards:
        raise SystemExit("fastdata info: give a shard set directory (or --env)")
    d = info_dict(a.shards)
    echo(json_text(d)) if a.json else print_info(d)
    return 0


def add_args(i: argparse.ArgumentParser) -> None:
    i.add_argument("shards", nargs="?", help="shard set: its folder (with manifest.json) or "
                   "URL (s3://, gs://, az://, http(s)://: the manifest alone is read)")
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.add_argument("--env", action="store_true", help="versions, pillow-simd check, GPU")
