"""fastdata beside what a user would pick instead, on a CPU: the same photos, the same
augmentation, one script, each peer in its own virtual environment.

    python -m benchmarks.inputs.make_photos /tmp/photos
    python -W ignore -m benchmarks.peers.peers_cpu /tmp/photos --work /tmp/fd-peers \\
        --venv webdataset=/tmp/peers/webdataset --venv litdata=/tmp/peers/litdata \\
        --venv streaming=/tmp/peers/mosaicml-streaming --venv ffcv=/tmp/peers/ffcv \\
        --venv spdl=/tmp/peers/spdl

A peer's venv holds torch (pinned to this one's version), the peer's package, numpy, h5py,
lmdb, simplejpeg, tqdm and zlib-ng, and pillow-simd as fastdata's has it (``pip install
--force-reinstall --no-deps .venv/wheels/pillow_simd-*.whl``, the wheel ``install.sh`` built),
so every PIL decode and resize runs at the same speed; fastdata runs from this tree there, for
the shared augmentation code. Each contender:

* converts the photos (centre crop, resize to 256 px; JPEG quality 90 for the peers, which
  store encoded images; fastdata raw and JPEG) with 2 processes, timed;
* loads them in a fresh process: RandomResizedCrop 224 + flip + normalise to float32, batch 64,
  shuffled, 2 DataLoader workers (fastdata: its default threads), ``--batches`` batches after
  the first; measured: the time to the first batch, img/s, the CPU time of the process and its
  workers per image, and the peak summed PSS of the process tree (sampled every 10 batches).

The baseline is ImageFolder + PIL over the photos themselves (``fastdata.bench.baseline``). The
peers' per-image augmentation is that same code (PIL decode, then the in-package
RandomResizedCrop). Prints one JSON line per contender and a markdown table.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))     # the repository
SIZE, CROP, BATCH, WORKERS = 256, 224, 64, 2

# each contender's code, written out as a module and run in its venv by
# `python peers_cpu.py --child PEER STEP ...`
COMMON = r'''
import io, os, sys, time, json, glob
import numpy as np
import torch
from PIL import Image

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


def square(path, size=256):
    """A photo centre-cropped and resized to ``size``, as JPEG quality 90 bytes."""
    with Image.open(path) as img:
        img.draft("RGB", (size, size))
        img = img.convert("RGB")
        s = min(img.size)
        l, t = (img.width - s) // 2, (img.height - s) // 2
        img = img.resize((size, size), Image.BILINEAR, box=(l, t, l + s, t + s))
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90)
    return buf.getvalue()


def augment(data):
    """JPEG bytes → RandomResizedCrop 224 + flip + normalise, float32 (3, 224, 224)."""
    from fastdata.ops.boxes import random_resized_crop_boxes
    img = Image.open(io.BytesIO(data)).convert("RGB")
    t, l, h, w = random_resized_crop_boxes(1, img.height, img.width)[0].tolist()
    img = img.resize((224, 224), Image.BILINEAR, box=(l, t, l + w, t + h))
    if torch.rand(1) < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    x = torch.from_numpy(np.array(img)).permute(2, 0, 1).float().div_(255)
    return (x - MEAN) / STD


def photos(root):
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    return [(os.path.join(root, c, f), k) for k, c in enumerate(classes)
            for f in sorted(os.listdir(os.path.join(root, c)))]


def squares(root):
    """(jpeg bytes, label) of every photo, made by 2 processes."""
    import multiprocessing as mp
    items = photos(root)
    with mp.get_context("fork").Pool(2) as pool:
        data = pool.map(square, [p for p, _ in items], chunksize=32)
    return [(d, k) for d, (_, k) in zip(data, items)]


def tree():
    """(CPU seconds, PSS MiB) of this process and its descendants."""
    me, pids = os.getpid(), [os.getpid()]
    parents = {}
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{d}/stat") as f:
                parents[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            pass
    k = 0
    while k < len(pids):
        pids += [p for p, pp in parents.items() if pp == pids[k]]
        k += 1
    cpu = pss = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            # utime, stime, and those of its children already waited for (the workers of
            # a loader's earlier epochs)
            cpu += sum(int(v) for v in fields[11:15]) / tick
            with open(f"/proc/{p}/smaps_rollup") as f:
                pss += sum(int(l.split()[1]) for l in f if l.startswith("Pss:")) / 1024
        except OSError:
            pass
    return cpu, pss


def measure(make, batches):
    t0 = time.perf_counter()
    loader = make()
    it = iter(loader)
    x, _ = next(it)
    first = time.perf_counter() - t0
    cpu0, peak = tree()
    t, n = time.perf_counter(), 0
    for k in range(batches):
        try:
            x, _ = next(it)
        except StopIteration:
            it = iter(loader)
            x, _ = next(it)
        n += len(x)
        if k % 10 == 9:
            peak = max(peak, tree()[1])
    secs = time.perf_counter() - t
    cpu = tree()[0] - cpu0
    assert x.dtype == torch.float32 and tuple(x.shape[1:]) == (3, 224, 224), x.shape
    return {"first_batch_s": round(first, 3), "img_s": round(n / secs, 1),
            "cpu_ms_per_img": round(1000 * cpu / n, 2), "peak_pss_mib": round(peak)}
'''

PEERS = {
    "webdataset": r'''
import webdataset as wds

def convert(src, out):
    os.makedirs(out, exist_ok=True)
    with wds.ShardWriter(os.path.join(out, "shard-%05d.tar"), maxcount=1000) as w:
        for i, (data, label) in enumerate(squares(src)):
            w.write({"__key__": "%07d" % i, "jpg": data, "cls": label})

def loader(out):
    urls = sorted(glob.glob(os.path.join(out, "*.tar")))
    ds = (wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False).shuffle(1000)
          .to_tuple("jpg", "cls").map_tuple(augment, lambda c: int(c)))
    return wds.WebLoader(ds.batched(64, partial=False), batch_size=None, num_workers=2)
''',
    "litdata": r'''
import litdata as ld

def _sample(item):
    return {"image": item[0], "label": item[1]}

def convert(src, out):
    ld.optimize(fn=_sample, inputs=squares(src), output_dir=out, chunk_bytes="64MB",
                num_workers=2, mode="overwrite")

class Augmented(ld.StreamingDataset):
    def __getitem__(self, index):
        s = super().__getitem__(index)
        return augment(s["image"]), s["label"]

def loader(out):
    return ld.StreamingDataLoader(Augmented(out, shuffle=True, drop_last=True), batch_size=64,
                                  num_workers=2)
''',
    "streaming": r'''
from streaming import MDSWriter, StreamingDataset

def convert(src, out):
    with MDSWriter(out=out, columns={"image": "bytes", "label": "int"}) as w:
        for data, label in squares(src):
            w.write({"image": data, "label": label})

class Augmented(StreamingDataset):
    def __getitem__(self, index):
        s = super().__getitem__(index)
        return augment(s["image"]), s["label"]

def loader(out):
    ds = Augmented(local=out, shuffle=True, batch_size=64)
    return torch.utils.data.DataLoader(ds, batch_size=64, num_workers=2, drop_last=True)
''',
    "ffcv": r'''
from ffcv.fields import IntField, RGBImageField
from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
from ffcv.loader import Loader, OrderOption
from ffcv.transforms import NormalizeImage, RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage
from ffcv.writer import DatasetWriter

class _Items:
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        data, label = self.items[i]
        return np.asarray(Image.open(io.BytesIO(data)).convert("RGB")), label

def convert(src, out):
    os.makedirs(out, exist_ok=True)
    DatasetWriter(os.path.join(out, "set.beton"), {
        "image": RGBImageField(write_mode="jpg", max_resolution=256, jpeg_quality=90),
        "label": IntField()}, num_workers=2).from_indexed_dataset(_Items(squares(src)))

def loader(out):
    mean, std = np.array([0.485, 0.456, 0.406]) * 255, np.array([0.229, 0.224, 0.225]) * 255
    return Loader(os.path.join(out, "set.beton"), batch_size=64, num_workers=2,
                  order=OrderOption.RANDOM, drop_last=True, os_cache=True, pipelines={
                      "image": [RandomResizedCropRGBImageDecoder((224, 224)),
                                RandomHorizontalFlip(), NormalizeImage(mean, std, np.float32),
                                ToTensor(), ToTorchImage()],
                      "label": [IntDecoder(), ToTensor(), Squeeze()]})
''',
    "spdl": r'''
import spdl.io
from spdl.pipeline import PipelineBuilder

def convert(src, out):      # SPDL reads files: the 256 px squares as JPEG files
    os.makedirs(out, exist_ok=True)
    for i, (data, label) in enumerate(squares(src)):
        with open(os.path.join(out, f"{label:04d}-{i:07d}.jpg"), "wb") as f:
            f.write(data)

def _load(item):
    """Decode with the crop, resize and flip in FFmpeg's filter graph (SPDL's way)."""
    from fastdata.ops.boxes import random_resized_crop_boxes
    path, label = item
    t, l, h, w = random_resized_crop_boxes(1, 256, 256)[0].tolist()
    flip = ",hflip" if torch.rand(1) < 0.5 else ""
    buf = spdl.io.load_image(path, filter_desc=f"crop={w}:{h}:{l}:{t},"
                             f"scale=224:224:flags=bilinear{flip},format=rgb24")
    return spdl.io.to_torch(buf), label

def _collate(items):
    x = torch.stack([a for a, _ in items]).permute(0, 3, 1, 2).float().div_(255)
    return (x - MEAN) / STD, torch.tensor([b for _, b in items])

class _Epochs:
    def __init__(self, out):
        self.files = [(os.path.join(out, n), int(n[:4])) for n in sorted(os.listdir(out))]

    def __iter__(self):
        order = torch.randperm(len(self.files)).tolist()
        pipe = (PipelineBuilder().add_source([self.files[i] for i in order])
                .pipe(_load, concurrency=2).aggregate(64, drop_last=True).pipe(_collate)
                .add_sink(4).build(num_threads=2))
        with pipe.auto_stop():
            yield from pipe.get_iterator(timeout=60)

def loader(out):
    return _Epochs(out)
''',
    "fastdata raw HDF5": r'''
import fastdata
from fastdata.converters.convert import convert as _convert

def convert(src, out):
    _convert(src, out, sizes=[256], num_workers=2, progress=False, overwrite=True)

def loader(out):
    return fastdata.Loader(out, batch_size=64, crop=224, device="cpu", num_workers=2)
''',
    "fastdata JPEG HDF5": r'''
import fastdata
from fastdata.converters.convert import convert as _convert

def convert(src, out):
    _convert(src, out, sizes=[256], encoding="jpeg", num_workers=2, progress=False,
             overwrite=True)

def loader(out):
    return fastdata.Loader(out, batch_size=64, crop=224, device="cpu", num_workers=2)
''',
    "baseline: ImageFolder + PIL": r'''
from fastdata.bench.baseline import baseline_loader

def convert(src, out):
    pass

def loader(out):
    return baseline_loader(out, batch_size=64, crop=224, num_workers=2)[0]
''',
}


def _module(peer: str) -> str:
    return "peer_" + "".join(c if c.isalnum() else "_" for c in peer)


def child(peer: str, step: str, src: str, out: str, batches: int) -> None:
    # a module of its own, importable by name: spawned workers (litdata's) unpickle by name
    m = __import__(_module(peer))
    if step == "convert":
        t = time.perf_counter()
        m.convert(src, out)
        print(json.dumps({"convert_s": round(time.perf_counter() - t, 2)}))
    else:
        m.torch.set_num_threads(1)
        print(json.dumps(m.measure(lambda: m.loader(out), batches)))


def run(python: str, peer: str, step: str, src: str, out: str, batches: int, work: str) -> dict:
    code = os.path.join(work, "peer-modules")
    os.makedirs(code, exist_ok=True)
    with open(os.path.join(code, _module(peer) + ".py"), "w") as f:
        f.write(COMMON + PEERS[peer])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [code, ROOT, os.environ.get(
        "PYTHONPATH")])), "OPENBLAS_NUM_THREADS": "1"}
    r = subprocess.run([python, os.path.abspath(__file__), "--child", peer, step, src, out,
                        str(batches)], capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode != 0:
        return {"error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "failed"}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("photos")
    ap.add_argument("--work", default="/tmp/fd-peers")
    ap.add_argument("--venv", action="append", default=[], metavar="PEER=DIR",
                    help="a peer's virtual environment (webdataset, litdata, streaming, ffcv, "
                         "spdl); repeatable")
    ap.add_argument("--batches", type=int, default=40, help="timed batches per contender")
    a = ap.parse_args()
    venvs = dict(v.split("=", 1) for v in a.venv)
    unknown = set(venvs) - set(PEERS)
    if unknown:
        ap.error(f"--venv: unknown peer(s) {sorted(unknown)}; valid: webdataset, litdata, "
                 f"streaming, ffcv, spdl")
    rows = []
    for peer in PEERS:
        own = peer.startswith(("fastdata", "baseline"))
        if not own and peer not in venvs:
            continue
        python = sys.executable if own else os.path.join(venvs[peer], "bin", "python")
        out = a.photos if peer.startswith("baseline") else os.path.join(
            a.work, peer.replace(" ", "-").replace(":", ""))
        row = {"contender": peer, **run(python, peer, "convert", a.photos, out, 0, a.work)}
        if "error" not in row:
            row.update(run(python, peer, "load", a.photos, out, a.batches, a.work))
        print(json.dumps(row), flush=True)
        rows.append(row)
    print("\n| loader | convert s | first batch s | img/s | CPU ms/img | peak PSS MiB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "error" in r:
            print(f"| {r['contender']} | failed: {r['error'][:80]} | | | | |")
            continue
        conv = "" if r["contender"].startswith("baseline") else r.get("convert_s", "")
        print(f"| {r['contender']} | {conv} | {r['first_batch_s']} | {r['img_s']:.0f} | "
              f"{r['cpu_ms_per_img']} | {r['peak_pss_mib']} |")


if __name__ == "__main__":
    main()
