"""Converting the data users already have: the same photos, labels and captions as a folder
with a labels file, as parquet (Hugging Face's hub layout), as WebDataset tars and as a
Hugging Face ``save_to_disk`` folder, interleaved round by round; then, on the same parquet
input, the peers' own converters beside fastdata's (figures in docs/performance.md,
"Converting: from parquet, tars and Hugging Face datasets").

    python -m benchmarks.inputs.make_photos /tmp/photos
    python -W ignore -m benchmarks.convert.sources /tmp/photos --work /tmp/fd-sources \\
        --rounds 5 --venv webdataset=/tmp/peers/webdataset --venv litdata=/tmp/peers/litdata \\
        --venv streaming=/tmp/peers/streaming --json benchmarks/results/RUN/sources.json

The inputs are made once in ``--work`` from the photos (each photo's class and the caption
``benchmarks.loading.fields_cpu`` draws): ``labels.csv``; ``hub/data/train-*.parquet``
written by ``datasets`` (``Image`` with its bytes, ``ClassLabel``, the caption; row groups
of 100 rows, as the hub's image datasets have); ``tars/shard-{000000..000005}.tar`` of
``jpg`` + ``cls`` + ``txt`` members; ``hf/``, the same dataset's ``save_to_disk``. Every
conversion runs in a fresh interpreter (clock started after the imports): raw HDF5 at 256
px, the default decode workers. img/s, CPU ms an image (the process and its workers), the
peak RSS of the converting process and of its largest worker. After the rounds, every set
is compared with the folder's sample by sample (the pixels of each image, its class, its
caption).

The peers, each in its own virtual environment (``--venv``), read the same parquet file row
group by row group with pyarrow and write the same 256 px centre-cropped squares (PIL:
``ImageOps.fit``, bicubic), JPEG quality 90, with the class and caption, as their docs show:
WebDataset's ``ShardWriter`` in a loop, MosaicML Streaming's ``MDSWriter`` in a loop,
LitData's ``optimize`` over the row groups with 2 workers. fastdata converts the same file
with ``--encoding jpeg --quality 90`` (and raw). Rounds interleaved as above.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from benchmarks.harness import interleaved, medians, write_results

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

FASTDATA = """
import json, resource, sys, time
from benchmarks.harness import peak_rss_mib, tree_cpu_seconds
from fastdata.converters.convert import convert
src, out, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
t, c = time.perf_counter(), tree_cpu_seconds()
m = convert(src, out, sizes=[256], progress=False, overwrite=True, **options)
dt = time.perf_counter() - t
print(json.dumps({"img_s": m["num_samples"] / dt, "secs": dt,
                  "cpu_ms": (tree_cpu_seconds() - c) / m["num_samples"] * 1e3,
                  "peak_mib": peak_rss_mib(),
                  "child_peak_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
                  "samples": m["num_samples"]}))
"""

PEER_COMMON = r'''
import io, json, os, resource, sys, time
import pyarrow.parquet as pq
from PIL import Image, ImageOps

def rows(path, group):
    """(image bytes, label, caption) of one row group."""
    t = pq.ParquetFile(path).read_row_group(group, columns=["image", "label", "caption"])
    for image, label, caption in zip(t.column("image").to_pylist(),
                                     t.column("label").to_pylist(),
                                     t.column("caption").to_pylist()):
        yield image["bytes"], label, caption

def square(data):
    """The photo as a 256 px centre-cropped square, JPEG quality 90."""
    img = ImageOps.fit(Image.open(io.BytesIO(data)).convert("RGB"), (256, 256),
                       Image.BICUBIC)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90)
    return buf.getvalue()

def everything(path):
    for g in range(pq.ParquetFile(path).num_row_groups):
        yield from rows(path, g)
'''

PEERS = {
    "webdataset": r'''
import webdataset as wds

def convert(path, out):
    os.makedirs(out, exist_ok=True)
    n = 0
    with wds.ShardWriter(os.path.join(out, "shard-%06d.tar"), maxcount=1000, verbose=0) as w:
        for n, (data, label, caption) in enumerate(everything(path), 1):
            w.write({"__key__": "%07d" % n, "jpg": square(data), "cls": label, "txt": caption})
    return n
''',
    "streaming": r'''
from streaming import MDSWriter

def convert(path, out):
    n = 0
    with MDSWriter(out=out, columns={"image": "bytes", "label": "int", "caption": "str"}) as w:
        for n, (data, label, caption) in enumerate(everything(path), 1):
            w.write({"image": square(data), "label": label, "caption": caption})
    return n
''',
    "litdata": r'''
import litdata as ld

def _group(item):
    path, g = item
    for data, label, caption in rows(path, g):
        yield {"image": square(data), "label": label, "caption": caption}

def convert(path, out):
    groups = pq.ParquetFile(path).num_row_groups
    ld.optimize(fn=_group, inputs=[(path, g) for g in range(groups)], output_dir=out,
                chunk_bytes="64MB", num_workers=2, mode="overwrite")
    return pq.ParquetFile(path).metadata.num_rows
''',
}

PEER_MAIN = r'''
def cpu():
    ru, kids = (resource.getrusage(resource.RUSAGE_SELF),
                resource.getrusage(resource.RUSAGE_CHILDREN))
    return ru.ru_utime + ru.ru_stime + kids.ru_utime + kids.ru_stime

path, out = sys.argv[1], sys.argv[2]
t, c = time.perf_counter(), cpu()        # after the imports, as fastdata's clock
n = convert(path, out)
dt = time.perf_counter() - t
kids = resource.getrusage(resource.RUSAGE_CHILDREN)
with open("/proc/self/status") as f:      # this program's own peak (ru_maxrss keeps the
    peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))  # parent's)
print(json.dumps({"img_s": n / dt, "secs": dt, "cpu_ms": (cpu() - c) / n * 1e3,
                  "peak_mib": peak / 1024, "child_peak_mib": kids.ru_maxrss / 1024,
                  "samples": n}))
'''


def make_inputs(photos: str, work: str) -> dict:
    """The photos in every form (see the module's docstring), made once in ``work``."""
    import io
    import tarfile

    import datasets

    from benchmarks.loading.fields_cpu import captioned_rows, write_labels

    rows = captioned_rows(photos)
    classes = sorted({r["label"] for r in rows})
    out = {"folder": photos, "labels": os.path.join(work, "labels.csv"),
           "hub": os.path.join(work, "hub"), "tars": os.path.join(work, "tars"),
           "hf": os.path.join(work, "hf")}
    if os.path.exists(os.path.join(work, "done")):
        return out
    os.makedirs(work, exist_ok=True)
    write_labels(out["labels"], rows, ["path", "label", "caption"])
    images = [open(os.path.join(photos, r["path"]), "rb").read() for r in rows]
    ds = datasets.Dataset.from_dict(
        {"image": [{"bytes": d, "path": r["path"]} for r, d in zip(rows, images)],
         "label": [classes.index(r["label"]) for r in rows],
         "caption": [r["caption"] for r in rows]},
        features=datasets.Features({"image": datasets.Image(),
                                    "label": datasets.ClassLabel(names=classes),
                                    "caption": datasets.Value("string")}))
    # row groups of 100 rows, as the hub's image datasets have them
    ds.to_parquet(os.path.join(out["hub"], "data", "train-00000-of-00001.parquet"),
                  batch_size=100)
    ds.save_to_disk(out["hf"])
    os.makedirs(out["tars"], exist_ok=True)
    per = -(-len(rows) // 6)
    for t in range(6):
        with tarfile.open(os.path.join(out["tars"], f"shard-{t:06d}.tar"), "w") as tf:
            for k in range(t * per, min(len(rows), (t + 1) * per)):
                r = rows[k]
                for ext, data in (("jpg", images[k]),
                                  ("cls", str(classes.index(r["label"])).encode()),
                                  ("txt", r["caption"].encode())):
                    info = tarfile.TarInfo(f"{k:07d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    open(os.path.join(work, "done"), "w").close()
    return out


def fastdata_run(src: str, out: str, options: dict):
    def run() -> dict:
        env = {**os.environ, "PYTHONPATH": ROOT}
        r = subprocess.run([sys.executable, "-W", "ignore", "-c", FASTDATA, src, out,
                            json.dumps(options)], capture_output=True, text=True, env=env,
                           check=True, cwd=ROOT)
        return json.loads(r.stdout.strip().splitlines()[-1])
    return run


def peer_run(python: str, peer: str, parquet: str, out: str, work: str):
    code = os.path.join(work, "peer-code")
    os.makedirs(code, exist_ok=True)
    script = os.path.join(code, f"convert_{peer}.py")
    with open(script, "w") as f:
        f.write(PEER_COMMON + PEERS[peer] + PEER_MAIN)

    def run() -> dict:
        subprocess.run(["rm", "-rf", out], check=True)
        r = subprocess.run([python, "-W", "ignore", script, parquet, out], capture_output=True,
                           text=True, cwd=code, timeout=3600)
        if r.returncode != 0:
            raise RuntimeError(f"{peer}: {r.stderr.strip()[-2000:]}")
        return json.loads(r.stdout.strip().splitlines()[-1])
    return run


def same_samples(reference: str, other: str, caption: str = "caption") -> None:
    """Every sample of ``other`` is ``reference``'s: the pixels, the class index, the
    caption."""
    import fastdata

    a, b = fastdata.open(reference), fastdata.open(other)
    assert len(a) == len(b), (reference, other, len(a), len(b))
    for start in range(0, len(a), 256):
        idx = list(range(start, min(len(a), start + 256)))
        assert (a.read_batch(idx) == b.read_batch(idx)).all(), (other, start)
        assert (a.labels_of(idx) == b.labels_of(idx)).all(), (other, start)
        assert a.field_values("caption", idx) == b.field_values(caption, idx), (other, start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("photos")
    p.add_argument("--work", default="/tmp/fd-sources")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--peer-rounds", type=int, default=3)
    p.add_argument("--venv", action="append", default=[], metavar="PEER=DIR")
    p.add_argument("--json", default=None, help="write the results here")
    a = p.parse_args()
    work = os.path.abspath(a.work)
    inputs = make_inputs(a.photos, work)
    parquet = os.path.join(inputs["hub"], "data", "train-00000-of-00001.parquet")
    sets = {k: os.path.join(work, f"set-{k}") for k in ("folder", "parquet", "tars", "hf")}
    variants = {
        "folder": fastdata_run(inputs["folder"], sets["folder"], {"labels": inputs["labels"]}),
        "parquet": fastdata_run(parquet, sets["parquet"], {}),
        "tars": fastdata_run(os.path.join(inputs["tars"], "shard-{000000..000005}.tar"),
                             sets["tars"], {}),
        "hf": fastdata_run(inputs["hf"], sets["hf"], {}),
    }
    rows = []
    for name, runs in interleaved(variants, a.rounds).items():
        rows.append({"stage": "sources", "variant": name, **medians(runs), "rounds": runs})
        print("convert", name, {k: round(v, 3) for k, v in medians(runs).items()}, flush=True)
    for name in ("parquet", "hf"):
        same_samples(sets["folder"], sets[name])
    same_samples(sets["folder"], sets["tars"], caption="txt")
    print("every set holds the folder's samples", flush=True)

    venvs = dict(v.split("=", 1) for v in a.venv)
    peers = {"fastdata raw": fastdata_run(parquet, os.path.join(work, "peer-fd-raw"), {}),
             "fastdata JPEG": fastdata_run(parquet, os.path.join(work, "peer-fd-jpeg"),
                                           {"encoding": "jpeg", "quality": 90})}
    for peer, venv in venvs.items():
        peers[peer] = peer_run(os.path.join(venv, "bin", "python"), peer, parquet,
                               os.path.join(work, f"peer-{peer}"), work)
    if venvs:
        for name, runs in interleaved(peers, a.peer_rounds).items():
            rows.append({"stage": "peers", "variant": name, **medians(runs), "rounds": runs})
            print("peers", name, {k: round(v, 3) for k, v in medians(runs).items()},
                  flush=True)
    base = next(r["img_s"] for r in rows if r["variant"] == "folder")
    for r in rows:
        if r["stage"] == "sources":
            r["of_folder"] = r["img_s"] / base
        print(f"{r['stage']:8} {r['variant']:14} {r['img_s']:7.0f} img/s  "
              f"{r['cpu_ms']:.2f} CPU ms/img  peak {r['peak_mib']:.0f} MiB"
              + (f"  {r['of_folder']:.3f} of the folder's" if "of_folder" in r else ""))
    if a.json:
        write_results(a.json, "convert.sources", rows)


if __name__ == "__main__":
    main()
