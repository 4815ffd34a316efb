"""The ``fastdata`` command line: convert, info, verify, demo."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from fastdata.format import CONTAINERS, ENCODINGS, FITS, check_size

log = logging.getLogger("fastdata")


def echo(text: str = "") -> None:
    sys.stdout.write(text + "\n")


def _sizes(text: str) -> list[int]:
    try:
        return [check_size(t) for t in text.split(",") if t.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


# ---------------------------------------------------------------- commands
def cmd_convert(a) -> int:
    from converters.convert import convert

    sizes = sorted({s for group in a.size for s in group}) if a.size else [256]
    convert(a.src, a.out, container=a.format, sizes=sizes, encoding=a.encoding,
            quality=a.quality, fit=a.fit, workers=a.workers, shard_size=a.shard_size,
            on_error=a.on_error, overwrite=a.overwrite, resume=a.resume, progress=not a.quiet)
    return 0


def info_dict(path: str) -> dict:
    import numpy as np

    from fastdata.readers import ShardSet

    ds = ShardSet(path)
    m = ds.manifest
    counts = np.bincount(ds.labels, minlength=len(ds.classes))
    return {
        "path": ds.root, "container": ds.container, "encoding": ds.encoding,
        "quality": m.get("quality"), "sizes": list(ds.sizes), "fit": m["fit"],
        "samples": len(ds), "classes": dict(zip(ds.classes, map(int, counts))),
        "shards": len(m["shards"]), "bytes": sum(s["bytes"] for s in m["shards"]),
        "skipped": m["skipped"], "ignored": m["ignored"], "empty_classes": m["empty_classes"],
        "source": m["source"], "format_version": m["version"],
    }


def print_info(d: dict) -> None:
    enc = d["encoding"] + (f" (quality {d['quality']})" if d["quality"] else "")
    echo(f"{d['path']}")
    echo(f"  {d['samples']} samples in {d['shards']} {d['container']} shards, {enc}, "
         f"sizes {', '.join(map(str, d['sizes']))} (fit: {d['fit']}), "
         f"{_human(d['bytes'])} on disk")
    echo(f"  {len(d['classes'])} classes:")
    width = max(map(len, d["classes"]), default=0)
    for name, n in d["classes"].items():
        echo(f"    {name:<{width}}  {n}")
    if d["empty_classes"]:
        echo(f"  empty classes (kept so indices match folder names): "
             f"{', '.join(d['empty_classes'])}")
    echo(f"  skipped (unreadable): {len(d['skipped'])}")
    for s in d["skipped"]:
        echo(f"    {s['path']}: {s['reason']}")
    if d["ignored"]:
        echo("  ignored (not images): " + ", ".join(f"{k}: {v}" for k, v in d["ignored"].items()))


def cmd_info(a) -> int:
    if a.env:
        from fastdata.env import SIMD_FIX, env_info

        env = env_info()
        if a.json:
            echo(json.dumps(env, indent=1))
        else:
            for k, v in env.items():
                echo(f"{k:>14}: {v}")
            if not env["pil_simd"]:
                echo(f"  warning: PIL is not pillow-simd; fix: {SIMD_FIX}")
        if not a.out:
            return 0
    if not a.out:
        raise SystemExit("fastdata info: give a shard set directory (or --env)")
    d = info_dict(a.out)
    echo(json.dumps(d, indent=1, ensure_ascii=False)) if a.json else print_info(d)
    return 0


def cmd_verify(a) -> int:
    from fastdata.verify import verify

    problems = verify(a.out, progress=not a.quiet)
    for p in problems:
        echo(f"DAMAGED {p}")
    echo(f"{a.out}: " + ("OK" if not problems else f"{len(problems)} problems found"))
    return 0 if not problems else 1


def cmd_demo(a) -> int:
    from converters.convert import convert
    from fastdata.demo import make_sample_folder

    root = os.path.abspath(a.dir)
    src = os.path.join(root, "images")
    if not os.path.isdir(src):
        log.info("drawing the sample image folder in %s", src)
        make_sample_folder(src)
    for container in CONTAINERS:
        out = os.path.join(root, f"shards-{container}")
        convert(src, out, container=container, sizes=[32, 64], overwrite=True,
                progress=not a.quiet)
        print_info(info_dict(out))
    return 0


# ---------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fastdata", description="Image shards and fast loaders "
                                "for PyTorch training.")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars or info logs")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("convert", help="pack an image folder (root/<class>/...) into shards")
    c.add_argument("src", help="image folder, ImageFolder layout")
    c.add_argument("out", help="output directory for the shard set")
    c.add_argument("--format", choices=CONTAINERS, default="hdf5", help="container")
    c.add_argument("--size", type=_sizes, action="append", metavar="S[,S...]",
                   help="stored square size(s), powers of two >= 8; repeatable (default 256)")
    c.add_argument("--encoding", choices=ENCODINGS, default="raw")
    c.add_argument("--quality", type=int, default=90, help="JPEG quality for --encoding jpeg")
    c.add_argument("--fit", choices=FITS, default="crop",
                   help="non-square images: crop (shorter side, centre crop), pad, stretch")
    c.add_argument("--workers", type=int, default=None, help="decode processes (default: "
                   "all cores)")
    c.add_argument("--shard-size", type=int, default=None,
                   help="samples per shard (default: ~256 MiB of raw data per shard)")
    c.add_argument("--on-error", choices=("skip", "raise"), default="skip",
                   help="unreadable inputs: skip and report (default) or stop")
    g = c.add_mutually_exclusive_group()
    g.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT")
    g.add_argument("--resume", action="store_true", help="finish an interrupted conversion")
    c.set_defaults(func=cmd_convert)

    i = sub.add_parser("info", help="describe a shard set (or the environment with --env)")
    i.add_argument("out", nargs="?")
    i.add_argument("--json", action="store_true")
    i.add_argument("--env", action="store_true", help="versions, pillow-simd check, GPU")
    i.set_defaults(func=cmd_info)

    v = sub.add_parser("verify", help="recompute checksums, decode every JPEG")
    v.add_argument("out")
    v.set_defaults(func=cmd_verify)

    d = sub.add_parser("demo", help="draw a sample dataset, convert it, show it")
    d.add_argument("--dir", default="fastdata-demo", help="working directory (default "
                   "./fastdata-demo)")
    d.set_defaults(func=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if a.quiet else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return a.func(a)
    except (ValueError, FileExistsError, FileNotFoundError) as e:
        log.error("%s", e)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
