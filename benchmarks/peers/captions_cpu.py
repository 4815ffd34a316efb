"""Images with captions beside what a user would pick instead, on a CPU: the same photos and
captions, RandomResizedCrop 224 + a tokenised caption, each peer's own recommended pipeline in
its own virtual environment (as ``peers_cpu``, whose shared code it uses).

    python -m benchmarks.inputs.make_photos /tmp/photos
    python -W ignore -m benchmarks.peers.captions_cpu /tmp/photos --work /tmp/fd-captions \\
        --venv webdataset=/tmp/peers/webdataset --venv litdata=/tmp/peers/litdata \\
        --venv streaming=/tmp/peers/streaming --venv energon=/tmp/peers/energon \\
        --json benchmarks/results/RUN/captions.json

Each photo gets the caption ``benchmarks.loading.fields_cpu`` draws (8-20 words); a BPE
tokenizer (``tokenizers``, vocabulary 500) is trained on them once and every contender's
workers load it from the same file. Each contender converts the photos with their captions
(centre crop to 256 px; the peers store JPEG quality 90 and the caption as text: a tar of
``jpg`` + ``txt`` members, LitData's ``optimize`` of ``{image, caption}``, an MDS column each,
the tar that ``energon prepare`` makes a ``CaptioningSample`` dataset of), then loads them in
a fresh process: RandomResizedCrop 224 + flip + normalise to float32 and the caption tokenised
and padded to 32 (per sample in a peer's map; fastdata: a batch's at once,
``encode_batch_fast``, as the caption's ``field_transforms``; ``TOKENIZERS_PARALLELISM=false``
for all), batch 64, shuffled, 2 workers (fastdata: its default threads). Measured as
``peers_cpu``: time to the first batch, img/s, CPU ms an image (the process and its workers),
peak PSS.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

from benchmarks.peers.peers_cpu import COMMON

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))     # the repository

CAPTIONS = r'''
WORK = os.environ["FD_CAPTIONS_WORK"]
with open(os.path.join(WORK, "captions.json")) as _f:
    CAPTION = json.load(_f)         # photo path -> caption


def captioned(src):
    """(jpeg bytes, caption) of every photo (``squares``' order)."""
    items = photos(src)
    return [(d, CAPTION[os.path.relpath(p, src)]) for (d, _), (p, _) in zip(squares(src), items)]


_TOK = None


def _tokenizer():
    global _TOK
    if _TOK is None:
        from tokenizers import Tokenizer
        _TOK = Tokenizer.from_file(os.path.join(WORK, "tokenizer.json"))
        _TOK.enable_padding(pad_id=1, pad_token="[PAD]", length=32)
        _TOK.enable_truncation(32)
    return _TOK


def tokenize(text):
    """One caption as 32 token ids (a peer's per-sample map)."""
    return torch.tensor(_tokenizer().encode(text).ids)


def tokenize_batch(texts):
    """A batch's captions as (B, 32) token ids (fastdata's field transform)."""
    return torch.from_numpy(np.array([e.ids for e in _tokenizer().encode_batch_fast(texts)],
                                     np.int64))
'''

PEERS = {
    "webdataset": r'''
import webdataset as wds

def convert(src, out):
    os.makedirs(out, exist_ok=True)
    with wds.ShardWriter(os.path.join(out, "shard-%05d.tar"), maxcount=1000) as w:
        for i, (data, caption) in enumerate(captioned(src)):
            w.write({"__key__": "%07d" % i, "jpg": data, "txt": caption})

def loader(out):
    urls = sorted(glob.glob(os.path.join(out, "*.tar")))
    ds = (wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False).shuffle(1000)
          .to_tuple("jpg", "txt").map_tuple(augment, lambda t: tokenize(t.decode())))
    return wds.WebLoader(ds.batched(64, partial=False), batch_size=None, num_workers=2)
''',
    "litdata": r'''
import litdata as ld

def _sample(item):
    return {"image": item[0], "caption": item[1]}

def convert(src, out):
    ld.optimize(fn=_sample, inputs=captioned(src), output_dir=out, chunk_bytes="64MB",
                num_workers=2, mode="overwrite")

class Augmented(ld.StreamingDataset):
    def __getitem__(self, index):
        s = super().__getitem__(index)
        return augment(s["image"]), tokenize(s["caption"])

def loader(out):
    return ld.StreamingDataLoader(Augmented(out, shuffle=True, drop_last=True), batch_size=64,
                                  num_workers=2)
''',
    "streaming": r'''
from streaming import MDSWriter, StreamingDataset

def convert(src, out):
    with MDSWriter(out=out, columns={"image": "bytes", "caption": "str"}) as w:
        for data, caption in captioned(src):
            w.write({"image": data, "caption": caption})

class Augmented(StreamingDataset):
    def __getitem__(self, index):
        s = super().__getitem__(index)
        return augment(s["image"]), tokenize(s["caption"])

def loader(out):
    ds = Augmented(local=out, shuffle=True, batch_size=64)
    return torch.utils.data.DataLoader(ds, batch_size=64, num_workers=2, drop_last=True)
''',
    "energon": r'''
import subprocess
import webdataset as wds
from megatron.energon import DefaultTaskEncoder, WorkerConfig, get_loader, get_train_dataset

def convert(src, out):      # a WebDataset, then `energon prepare` (its documented steps)
    os.makedirs(out, exist_ok=True)
    with wds.ShardWriter(os.path.join(out, "shard-%05d.tar"), maxcount=1000) as w:
        for i, (data, caption) in enumerate(captioned(src)):
            w.write({"__key__": "%07d" % i, "jpg": data, "txt": caption})
    subprocess.run([os.path.join(os.path.dirname(sys.executable), "energon"), "prepare", out,
                    "--non-interactive", "--split-ratio", "1,0,0", "--sample-type",
                    "CaptioningSample", "--field-map", '{"image": "jpg", "caption": "txt"}'],
                   check=True, capture_output=True)

class Encoder(DefaultTaskEncoder):
    decoder = None          # the JPEG bytes, decoded by the shared augmentation

    def encode_sample(self, s):
        text = s.caption.decode() if isinstance(s.caption, bytes) else s.caption
        return augment(s.image), tokenize(text)

    def batch(self, samples):
        return (torch.stack([a for a, _ in samples]), torch.stack([b for _, b in samples]))

    def encode_batch(self, batch):
        return batch

def loader(out):
    ds = get_train_dataset(out, batch_size=64, batch_drop_last=True, shuffle_buffer_size=1000,
                           max_samples_per_sequence=100, task_encoder=Encoder(),
                           worker_config=WorkerConfig(rank=0, world_size=1, num_workers=2))
    return get_loader(ds)
''',
}

FASTDATA = r'''
import csv
import fastdata
from fastdata.converters.convert import convert as _convert
ENCODING = "%s"

def convert(src, out):
    labels = os.path.join(WORK, "labels.csv")
    with open(labels, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "label", "caption"])
        w.writerows([p, p.split(os.sep)[0], c] for p, c in sorted(CAPTION.items()))
    _convert(src, out, sizes=[256], encoding=ENCODING, labels=labels, num_workers=2,
             progress=False, overwrite=True)

class _Pairs:
    """The dict batches as (images, tokens), as the peers' loaders give them."""
    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        for b in self.loader:
            yield b["image"], b["caption"]

def loader(out):
    return _Pairs(fastdata.Loader(out, batch_size=64, crop=224, device="cpu", num_workers=2,
                                  fields=["image", "caption"],
                                  field_transforms={"caption": tokenize_batch}))
'''
PEERS["fastdata raw HDF5"] = FASTDATA % "raw"
PEERS["fastdata JPEG HDF5"] = FASTDATA % "jpeg"


def _module(peer: str) -> str:
    return "captions_" + "".join(c if c.isalnum() else "_" for c in peer)


def child(peer: str, step: str, src: str, out: str, batches: int) -> None:
    import time

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
        f.write(COMMON + CAPTIONS + PEERS[peer])
    # the tokenizer's own threads off in every contender, as Hugging Face advises in loaders
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [code, ROOT, os.environ.get(
        "PYTHONPATH")])), "OPENBLAS_NUM_THREADS": "1", "FD_CAPTIONS_WORK": work,
        "TOKENIZERS_PARALLELISM": "false"}
    r = subprocess.run([python, "-m", "benchmarks.peers.captions_cpu", "--child", peer, step,
                        src, out, str(batches)], capture_output=True, text=True, env=env,
                       timeout=1800, cwd=ROOT)
    if r.returncode != 0:
        return {"error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "failed"}
    return json.loads(r.stdout.strip().splitlines()[-1])


def prepare(photos: str, work: str) -> None:
    """The captions (``captions.json``) and the tokenizer trained on them."""
    from benchmarks.loading.fields_cpu import captioned_rows, labels_files

    os.makedirs(work, exist_ok=True)
    labels_files(photos, work)          # tokenizer.json, trained on the captions
    with open(os.path.join(work, "captions.json"), "w") as f:
        json.dump({r["path"]: r["caption"] for r in captioned_rows(photos)}, f)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("photos")
    ap.add_argument("--work", default="/tmp/fd-captions")
    ap.add_argument("--venv", action="append", default=[], metavar="PEER=DIR",
                    help="a peer's virtual environment (webdataset, litdata, streaming, energon); "
                         "repeatable")
    ap.add_argument("--batches", type=int, default=40, help="timed batches per contender")
    ap.add_argument("--json", default=None, help="write the results here")
    a = ap.parse_args()
    venvs = dict(v.split("=", 1) for v in a.venv)
    unknown = set(venvs) - set(PEERS)
    if unknown:
        ap.error(f"--venv: unknown peer(s) {sorted(unknown)}; valid: webdataset, litdata, "
                 f"streaming, energon")
    work = os.path.abspath(a.work)
    prepare(a.photos, work)
    rows = []
    for peer in PEERS:
        own = peer.startswith("fastdata")
        if not own and peer not in venvs:
            continue
        python = sys.executable if own else os.path.join(venvs[peer], "bin", "python")
        out = os.path.join(work, peer.replace(" ", "-"))
        shutil.rmtree(out, ignore_errors=True)      # an earlier run's, in this run's folder
        row = {"contender": peer, **run(python, peer, "convert", a.photos, out, 0, work)}
        if "error" not in row:
            row.update(run(python, peer, "load", a.photos, out, a.batches, work))
        print(json.dumps(row), flush=True)
        rows.append(row)
    print("\n| loader | convert s | first batch s | samples/s | CPU ms/sample | peak PSS MiB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "error" in r:
            print(f"| {r['contender']} | failed: {r['error'][:80]} | | | | |")
            continue
        print(f"| {r['contender']} | {r['convert_s']} | {r['first_batch_s']} | "
              f"{r['img_s']:.0f} | {r['cpu_ms_per_img']} | {r['peak_pss_mib']} |")
    if a.json:
        from benchmarks.harness import write_results

        write_results(a.json, "peers.captions_cpu", rows)


if __name__ == "__main__":
    main()
