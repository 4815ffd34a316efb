"""``fastdata convert``: pack images (a folder, tars, parquet files, a Hugging Face dataset)
into a shard set."""

from __future__ import annotations

import argparse

from fastdata.cli.common import log, sizes_arg
from fastdata.fields import FIELDS
from fastdata.fields.infer import field_option
from fastdata.format import CONTAINERS, ENCODINGS, FITS

#: ``--source``'s kinds and what each reads (``fastdata.converters.sources``, listed here so
#: that ``--help`` does not import the converters)
SOURCE_KINDS = {"folder": "an ImageFolder tree", "labels": "a folder with --labels FILE",
                "coco": "a folder with --coco FILE", "masks": "a folder with --masks DIR",
                "webdataset": "tars of KEY.jpg + KEY.cls/.txt/.json",
                "parquet": "tables of image bytes (or paths) and columns",
                "hf": "a Hugging Face save_to_disk folder, DatasetDict or hub layout"}

HELP = ("pack images into shards: an image folder (root/<class>/...), WebDataset tars, parquet "
        "files or a Hugging Face dataset")


# ---------------------------------------------------------------- commands
#: ``fastdata convert``'s options that make a shard set what it is, and their defaults
CONVERT_DEFAULTS = {"container": "hdf5", "size": [[256]], "encoding": "raw", "quality": 90,
                    "fit": "crop", "shard_size": None, "labels": None, "coco": None, "masks": None,
                    "shuffle": None, "field": None, "source": None, "split": None,
                    "image_column": None}


def _convert_options(a) -> dict:
    """``convert()``'s keywords from the command line; with ``--resume`` and none of them
    given, those of the conversion being resumed (said in the log)."""
    given = {k: getattr(a, k) for k in CONVERT_DEFAULTS if getattr(a, k) is not None}
    if a.resume and not given:
        from fastdata.converters.resume import saved_options

        found = saved_options(a.out)
        if found is not None:
            saved, where = found
            shown = lambda v: ",".join(map(str, v)) if isinstance(v, list) else v  # noqa: E731
            log.info("resuming with the options recorded in %s: %s", where, " ".join(
                f"--{k.replace('_', '-')}" + ("" if v is True else f" {shown(v)}")
                for k, v in (("container", saved.get("container")), ("size", saved.get("sizes")),
                             ("encoding", saved.get("encoding")),
                             ("quality", saved.get("quality")), ("fit", saved.get("fit")),
                             ("shard_size", saved.get("shard_size")),
                             ("labels", saved.get("labels")), ("coco", saved.get("coco")),
                             ("masks", saved.get("masks")),
                             ("shuffle", saved.get("shuffle")),
                             ("source", saved.get("source")), ("split", saved.get("split")),
                             ("image_column", saved.get("image_column")),
                             ("field", " --field ".join(f"{n}={k}" for n, k in (
                                 saved.get("fields") or {}).items()) or None))
                if v not in (None, False)))
            return {k: v for k, v in saved.items() if v is not None}
    o = {**CONVERT_DEFAULTS, **given}
    if "quality" in given and o["encoding"] != "jpeg":
        raise ValueError(f"--quality {a.quality} applies to --encoding jpeg only (this "
                         f"conversion stores {o['encoding']} pixels): leave it out")
    return {"container": o["container"], "sizes": sorted({s for group in o["size"] for s in group}),
            "encoding": o["encoding"], "quality": o["quality"], "fit": o["fit"],
            "shard_size": o["shard_size"], "labels": o["labels"], "coco": o["coco"],
            "masks": o["masks"], "shuffle": bool(o["shuffle"]),
            "fields": dict(o["field"]) if o["field"] else None, "source": o["source"],
            "split": o["split"], "image_column": o["image_column"]}


def _field_arg(text: str) -> tuple[str, str]:
    try:
        return field_option(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def run(a) -> int:
    from fastdata.converters.convert import ConversionError, convert

    try:
        convert(a.src, a.out, **_convert_options(a), num_workers=a.workers, on_error=a.on_error,
                overwrite=a.overwrite, resume=a.resume, progress=not a.quiet, engine=a.engine,
                address=a.address)
    except ConversionError as e:        # unreadable inputs: the data's fault, no traceback
        log.error("%s", e)
        return 1
    return 0


def add_args(c: argparse.ArgumentParser) -> None:
    c.add_argument("src", help="the images: a folder (ImageFolder layout; any layout with "
                   "--labels, --coco or --masks), WebDataset tars, parquet files or a Hugging "
                   "Face dataset (a file, a folder of them, a pattern such as "
                   "'shard-{000000..000127}.tar'; tars and parquet files also as s3://, gs://, "
                   "az://, https:// URLs)")
    c.add_argument("out", help="output folder for the shard set, or a URL in an object store "
                   "(s3://bucket/path, gs://, az://; needs fastdata-shards[remote])")
    resumed = " (with --resume and none of the options that shape the set: the ones it was " \
        "started with)"
    c.add_argument("--container", "--format", dest="container", choices=CONTAINERS,
                   default=None, help="container (default hdf5)")
    c.add_argument("--size", type=sizes_arg, action="append", metavar="S[,S...]",
                   help="stored square size(s), powers of two >= 8; repeatable (default 256)")
    c.add_argument("--encoding", choices=ENCODINGS, default=None,
                   help="raw uint8 pixels or JPEG records (default raw)")
    c.add_argument("--quality", type=int, default=None,
                   help="JPEG quality, 1-100, for --encoding jpeg (default 90)")
    c.add_argument("--fit", choices=FITS, default=None,
                   help="non-square images: crop (shorter side, centre crop), pad, stretch "
                   "(default crop)")
    c.add_argument("--labels", default=None, metavar="FILE",
                   help="labels and fields from a CSV, JSON Lines or parquet file instead of "
                        "class folders: a row per image, its path relative to SRC (column "
                        "`path` or `file_name`); `label`: a class per image; only 0/1 columns: "
                        "multi-label; only numbers: regression targets; any other column a "
                        "field (a caption, an embedding...), its kind inferred")
    c.add_argument("--field", type=_field_arg, action="append", metavar="NAME=KIND",
                   help="the kind of the column NAME of a labels file, parquet file or "
                        "dataset (of tar members of extension NAME), where not inferred: "
                        f"{', '.join(sorted(FIELDS))}; repeatable")
    c.add_argument("--source", choices=sorted(SOURCE_KINDS), default=None,
                   help="what SRC is (default: what its options and its look say): "
                        + "; ".join(f"{k}: {v}" for k, v in sorted(SOURCE_KINDS.items())))
    c.add_argument("--split", default=None,
                   help="the split of a Hugging Face DatasetDict (default train), or of "
                        "parquet files that hold several")
    c.add_argument("--image-column", default=None, metavar="NAME",
                   help="the image's column of a parquet file or dataset, where it is not "
                        "found by its type or name")
    c.add_argument("--coco", default=None, metavar="FILE.json",
                   help="a detection set: the images a COCO annotations file lists under SRC, "
                        "with their boxes and, where it has segmentations, instance masks")
    c.add_argument("--masks", default=None, metavar="DIR",
                   help="a segmentation set: the class map of SRC/<path>/<name>.<ext> is "
                        "DIR/<path>/<name>.png (8-bit class indices, 255: none)")
    c.add_argument("--num-workers", "--workers", dest="workers", type=int, default=None,
                   help="decode processes (default: the cores this process may use)")
    c.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="where shards are made: local decode processes, or a task per shard "
                        "on a Ray cluster (needs fastdata-shards[ray]; the same shards)")
    c.add_argument("--address", default=None, help="the Ray cluster's address for --engine "
                   "ray (default: RAY_ADDRESS, or a local cluster started for the run)")
    c.add_argument("--shuffle", action="store_true", default=None,
                   help="write the images in a seeded order, not class after class, so that "
                        "every shard mixes the classes (for Loader(shuffle_window=...))")
    c.add_argument("--shard-size", type=int, default=None,
                   help="source files per shard: a shard holds the readable ones of its "
                        "range (default: ~256 MiB of raw data per shard)")
    c.add_argument("--on-error", choices=("skip", "raise"), default="skip",
                   help="unreadable inputs: skip and report them, or stop")
    g = c.add_mutually_exclusive_group()
    g.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT")
    g.add_argument("--resume", action="store_true", help="finish an interrupted conversion, or "
                   "redo the shards of a finished one that are missing" + resumed)
