"""Per-step costs behind the converter's design choices (each step timed both ways).

    python -W ignore -m benchmarks.convert.convert_steps /tmp/photos

CPU time per image (``time.process_time``, system time included), the sides of each pair
alternating round by round (each goes first in every other round), median of the rounds:
- reading a file: ``open().read()`` vs ``decode._read``; then ``prepare()`` at 256 px with the
  JPEG decoded into a fresh array per image vs into one ``decode.Scratch``;
- reading a JPEG's header and Exif orientation: ``Image.open`` + ``getexif()`` vs
  ``simplejpeg.decode_jpeg_header`` + ``decode._exif_orientation``;
- packing a 256 px RGBX image into RGB bytes: ``tobytes()`` vs ``decode._packed_rgb``; then
  into a ring slot with its CRC: ``_packed_rgb`` + a copy (the earlier way) vs
  ``decode.pack_into`` (the C kernel, from Pillow's Arrow export);
- one 196 KB ``pwrite`` per image into a fresh file (in ``--tmp``), sparse vs allocated
  first with ``posix_fallocate`` (as ``writers._allocate`` does); then into an allocated
  file, one ``pwrite`` per image vs one ``pwritev`` per 8 (``writers._pwrite_all``, a batch);
- the parent's CPU per image for handing out batches of 8 and reading their results back in
  order, 2 forked workers that each spend ~0.85 ms of CPU per image (the converter's decode
  at 256 px, stood in for by a busy loop): ``concurrent.futures.ProcessPoolExecutor`` (as the
  converter once used it) vs ``pool.Decoder``. Here the parent's CPU time is
  its own (all its threads), not the workers'.
- what the parent does just before its workers fork, with torch imported (as in
  ``benchmarks/convert/convert.py``'s process, or a notebook): ``gc.collect()`` (the earlier way) vs
  ``fastdata.env.parent_garbage_frozen``.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import gc
import io
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from collections import deque

import numpy as np
import simplejpeg
from PIL import Image

import fastdata.converters.pool as pool_mod
from fastdata.converters import decode
from fastdata.converters.scan import scan_folder
from fastdata.env import parent_garbage_frozen
from fastdata.format import crc32

WORK_S = 0.85e-3        # a worker's CPU per image


def busy_batch(batch, opts=None, ring=None, scratch=None):
    """Stands in for ``decode.prepare_batch``: the CPU time of decoding, results as small."""
    t = time.process_time()
    while time.process_time() - t < WORK_S * len(batch):
        pass
    return [(pos, None, [0], None) for pos, _ in batch]


def executor_pool(n: int):
    def run(_):
        jobs = iter([(i, f"{i:08d}.jpg") for i in range(n)])
        with cf.ProcessPoolExecutor(2, mp_context=mp.get_context("fork")) as pool:
            window: deque = deque()
            while True:
                while len(window) < 8:
                    batch = [j for _, j in zip(range(8), jobs)]
                    if not batch:
                        break
                    window.append(pool.submit(busy_batch, batch))
                if not window:
                    return
                for _ in window.popleft().result():
                    pass
    return run


def decoder_pool(n: int):
    def run(_):
        pool_mod.prepare_batch = busy_batch     # the forked workers run it
        decoder = pool_mod.Decoder(2, decode.DecodeOptions(sizes=(8,), encoding="jpeg"))
        try:
            for _ in decoder.run((i, f"{i:08d}.jpg") for i in range(n)):
                pass
        finally:
            decoder.close()
    return run


def per_item(fn, items) -> float:
    t = time.process_time()
    for x in items:
        fn(x)
    return (time.process_time() - t) / len(items) * 1e6


def pair(label: str, sides: dict, items, rounds: int, per: int = 1) -> None:
    """``per``: the µs of one call divided by this (a call that does ``per`` things)."""
    us: dict[str, list[float]] = {k: [] for k in sides}
    for r in range(rounds):
        for k, fn in list(sides.items())[::-1 if r % 2 else 1]:
            us[k].append(per_item(fn, items) / per)
    a, b = (statistics.median(v) for v in us.values())
    print(f"{label}: " + " | ".join(f"{k} {statistics.median(v):.1f} µs" for k, v in us.items())
          + f" ({b / a:.2f}x)")


def pwrite_file(tmp: str, n: int, payload: bytes, allocate: bool, per_call: int = 1):
    def run(_):
        path = os.path.join(tmp, "pwrite.bin")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            if allocate:
                os.posix_fallocate(fd, 0, n * len(payload))
            else:
                os.ftruncate(fd, n * len(payload))
            for i in range(0, n, per_call):
                os.pwritev(fd, [payload] * per_call, i * len(payload))
        finally:
            os.close(fd)
            os.remove(path)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("photos")
    ap.add_argument("--n", type=int, default=400, help="photos (and pwrites) per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tmp", default=None, help="where the pwrite file goes (default: TMPDIR)")
    a = ap.parse_args()
    files = [os.path.join(a.photos, p) for p, _ in scan_folder(a.photos).files[:a.n]]
    datas = [open(f, "rb").read() for f in files]
    pair("header + orientation", {
        "Image.open": lambda d: Image.open(io.BytesIO(d)).getexif().get(0x0112),
        "simplejpeg + marker walk": lambda d: (simplejpeg.decode_jpeg_header(d),
                                               decode._exif_orientation(d))}, datas, a.rounds)
    pair("read a JPEG file", {"open().read()": lambda f: open(f, "rb").read(),
                              "decode._read": decode._read}, files, a.rounds)
    opts = decode.DecodeOptions(sizes=(256,))
    scratch, ring = decode.Scratch(), decode.Ring(64, (256,))     # slots in turn, as workers
    pair("prepare() 256 px into the ring, decoded into", {
        "a fresh array each": lambda jf: decode.prepare(jf[1], opts, ring.get(jf[0])),
        "one Scratch": lambda jf: decode.prepare(jf[1], opts, ring.get(jf[0]), scratch)},
         list(enumerate(files)), a.rounds)
    slot = ring.get(0)
    squares = [decode.fit_square(decode._load(f, opts), 256, "crop") for f in files]
    pair("pack 256 px", {"tobytes": lambda im: im.tobytes("raw", "RGB"),
                         "_packed_rgb": decode._packed_rgb}, squares, a.rounds)
    slot = slot[0]

    def copied(im):
        p = decode._packed_rgb(im)
        slot[:] = np.frombuffer(p, np.uint8)
        return crc32(p)

    pair("pack 256 px into the ring, CRC included", {
        "_packed_rgb + copy": copied,
        "pack_into": lambda im: (decode.pack_into(im, slot), crc32(slot))}, squares, a.rounds)
    payload = bytes(3 * 256 * 256)
    with tempfile.TemporaryDirectory(dir=a.tmp) as tmp:
        pair("pwrite 196 KB", {"sparse": pwrite_file(tmp, a.n, payload, False),
                               "allocated": pwrite_file(tmp, a.n, payload, True)},
             [None], a.rounds, per=a.n)
        pair("pwrite 196 KB, allocated", {
            "1 per call": pwrite_file(tmp, a.n, payload, True),
            "8 per pwritev": pwrite_file(tmp, a.n, payload, True, per_call=8)},
             [None], a.rounds, per=a.n)
    pair("decode pool, parent", {"ProcessPoolExecutor": executor_pool(a.n * 4),
                                 "Decoder": decoder_pool(a.n * 4)},
         [None], a.rounds, per=a.n * 4)
    import torch  # noqa: F401 - its objects are what a collection walks

    def frozen(_):
        with parent_garbage_frozen():
            pass

    pair("before the workers fork, torch imported", {"gc.collect()": lambda _: gc.collect(),
                                                     "parent_garbage_frozen()": frozen},
         [None], a.rounds)


if __name__ == "__main__":
    main()
