"""Fields against images alone: converting and loading the same photos with a caption (and
with an 8-float embedding) beside each, interleaved round by round (the fields figures of
docs/performance.md).

    OPENBLAS_NUM_THREADS=1 python -W ignore -m benchmarks.loading.fields_cpu /tmp/photos \\
        --rounds 5 --json benchmarks/results/RUN/fields.json

Each photo gets a caption of 8-20 words drawn from a fixed vocabulary (COCO-like lengths) and
an embedding. Conversion: the photos through a labels file (``path,label`` for images alone,
``path,label,caption``, ``path,label,emb`` and ``path,label,tokens`` with fields), raw HDF5 at
256 px, the default decode workers. Loading, every variant from one set holding all of them:
RandomResizedCrop(224) + flip + normalise to float32, batch 64, 2 reader threads, 8 epochs
(``--epochs``) after an untimed one, each run in a fresh interpreter; images alone, or with the
captions as lists of str, or tokenised in the reader threads by a BPE tokenizer (``tokenizers``,
trained on the captions, to 32 ids: ``fastdata.transforms.Tokenize``, or the tokenizer's own
padding and truncation with ``encode_batch_fast`` and the ids made a tensor; its own threads
off: ``TOKENIZERS_PARALLELISM=false``; the thread time spent in that function is reported a
caption, ``tok_us``, and each way of tokenising timed alone, in one thread), or handed to a
batch function that returns them as they are (what a field's batch function costs fastdata
itself); or tokenised once, before the conversion, into
a ``tokens`` field (the labels file's ``tokens`` column of JSON lists of ids); or with 1-5
labelled boxes (or the same boxes with an 8-point outline each, their instance masks drawn),
1-2 people's 17 keypoints, or a class map (a PNG at half the photo's resolution, 1-5
rectangles of classes), each moved with each crop and flip (given over the picture, placed on
the square by the conversion's default centre crop). img/s and CPU ms an image (every thread
and process). For that set the photos are linked into a scratch folder beside their class
maps.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import tempfile
import time

from benchmarks.harness import (
    fresh_run,
    interleaved,
    medians,
    tree_cpu_seconds,
    write_results,
)

#: COCO's person keypoints
POINTS = ("nose left_eye right_eye left_ear right_ear left_shoulder right_shoulder left_elbow "
          "right_elbow left_wrist right_wrist left_hip right_hip left_knee right_knee left_ankle "
          "right_ankle").split()
WORDS = ("a man woman child dog cat sits stands on the in with near next to large small red "
         "blue green white black wooden table street park field beach kitchen room bus train "
         "plate of food holding looking at two three people playing ball frisbee surfboard "
         "water grass snow mountain building window open sky cloudy").split()

RUN = """
import json, sys, time
import torch, fastdata
from benchmarks.harness import tree_cpu_seconds
torch.set_num_threads(1)
path, mode, tok_file, epochs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
kw = {}
spent = [0.0, 0]      # the tokenizer's thread time, and the captions it tokenised
if mode != "image":
    kw["fields"] = ["image", "label", mode.split("+")[0]]
if mode in ("caption+tokens", "caption+padded"):
    from benchmarks.loading.fields_cpu import tokenizing
    ids = tokenizing(tok_file)["Tokenize" if mode == "caption+tokens" else "own padding"]

    def tokenize(texts):
        t = time.thread_time()
        out = ids(texts)
        spent[0], spent[1] = spent[0] + time.thread_time() - t, spent[1] + len(texts)
        return out
    kw["field_transforms"] = {"caption": tokenize}
if mode == "caption+same":
    kw["field_transforms"] = {"caption": lambda texts: texts}
loader = fastdata.Loader(path, batch_size=64, crop=224, device="cpu", num_workers=2, **kw)
for _ in loader:
    pass
spent[:] = [0.0, 0]
t, c, n = time.perf_counter(), tree_cpu_seconds(), 0
for epoch in range(1, epochs + 1):
    loader.set_epoch(epoch)
    for batch in loader:
        n += (batch["image"] if isinstance(batch, dict) else batch[0]).shape[0]
print(json.dumps({"img_s": n / (time.perf_counter() - t),
                  "cpu_ms": (tree_cpu_seconds() - c) / n * 1e3,
                  "tok_us": spent[0] / max(spent[1], 1) * 1e6}))
"""


def _files(photos: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), photos)
                  for d, _, fs in os.walk(photos) for f in fs)


def captioned_rows(photos: str) -> list[dict]:
    """Each photo's path, class, caption and embedding; and 1-5 labelled boxes and 1-2 people's
    17 keypoints (as fractions of the picture)."""
    import numpy as np

    rng = np.random.default_rng(0)

    def boxes():
        lo = np.round(rng.uniform(0, 0.6, (rng.integers(1, 6), 2)), 3)
        hi = np.round(lo + rng.uniform(0.05, 0.4, lo.shape), 3)
        return [{"box": [*a, *b], "label": str(rng.choice(WORDS[:8]))}
                for a, b in zip(lo.tolist(), hi.tolist())]

    def people():
        return [{n: [*np.round(rng.uniform(0, 1, 2), 3).tolist(), 2] for n in POINTS}
                for _ in range(rng.integers(1, 3))]

    def outlined(boxes):
        """Each box with an octagon inscribed in it."""
        t = np.arange(8) * np.pi / 4
        for b in boxes:
            (x0, y0, x1, y1), c = b["box"], (0.5 + 0.5 * np.cos(t), 0.5 + 0.5 * np.sin(t))
            xy = np.stack([x0 + c[0] * (x1 - x0), y0 + c[1] * (y1 - y0)], 1)
            b["polygons"] = [np.round(np.clip(xy, 0, 1), 4).ravel().tolist()]
        return boxes

    rows = []
    for k, path in enumerate(_files(photos)):
        drawn = boxes()
        rows.append({"path": path, "label": path.split(os.sep)[0],
                     "caption": " ".join(rng.choice(WORDS, rng.integers(8, 21))),
                     "emb": json.dumps(np.round(rng.standard_normal(8), 4).tolist()),
                     "boxes": json.dumps(drawn), "pose": json.dumps(people()),
                     "objects": json.dumps(outlined(drawn)), "seg": f"maps/{k:05d}.png"})
    return rows


def linked_with_maps(photos: str, src: str, rows: list[dict]) -> None:
    """The photos linked into ``src`` (copied where they cannot be), each with its class map
    (``seg``): 1-5 rectangles of classes 0-9 on 255 (no class), at half its resolution."""
    import shutil

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(1)
    os.makedirs(os.path.join(src, "maps"))
    for r in rows:
        there = os.path.join(src, r["path"])
        os.makedirs(os.path.dirname(there), exist_ok=True)
        try:
            os.link(os.path.join(photos, r["path"]), there)
        except OSError:
            shutil.copyfile(os.path.join(photos, r["path"]), there)
        with Image.open(there) as img:
            w, h = max(1, img.width // 2), max(1, img.height // 2)
        m = np.full((h, w), 255, np.uint8)
        for _ in range(rng.integers(1, 6)):
            x, y = rng.integers(0, w), rng.integers(0, h)
            m[y:y + rng.integers(1, h // 2 + 2), x:x + rng.integers(1, w // 2 + 2)] = \
                rng.integers(0, 10)
        Image.fromarray(m).save(os.path.join(src, r["seg"]))


def write_labels(path: str, rows: list[dict], columns: list[str]) -> str:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        w.writerows([r[c] for c in columns] for r in rows)
    return path


def labels_files(photos: str, tmp: str) -> dict[str, str]:
    """``{variant: labels file}``: the photos' classes alone, with a caption, with an
    embedding, with the caption tokenised once (``tokens``: JSON lists of ids), and with all
    of them, boxes and keypoints too (``all``, the set every loading variant reads);
    ``captions``: the captions as a text file, which the tokenizer is trained on
    (``tokenizer``: its file); ``src``: the photos with their class maps."""
    rows = captioned_rows(photos)
    out = {"captions": os.path.join(tmp, "captions.txt"),
           "tokenizer": os.path.join(tmp, "tokenizer.json"), "src": os.path.join(tmp, "src")}
    linked_with_maps(photos, out["src"], rows)
    with open(out["captions"], "w") as f:
        f.write("\n".join(r["caption"] for r in rows))
    tok = tokenizer(out["captions"], out["tokenizer"])
    for r, e in zip(rows, tok.encode_batch([r["caption"] for r in rows])):
        r["tokens"] = json.dumps(e.ids)
    for name, extra in (("image", []), ("caption", ["caption"]), ("emb", ["emb"]),
                        ("tokens", ["tokens"]),
                        ("all", ["caption", "emb", "tokens", "boxes", "pose", "objects",
                                 "seg"])):
        out[name] = write_labels(os.path.join(tmp, f"{name}.csv"), rows,
                                 ["path", "label", *extra])
    return out


def tokenizer(captions: str, path: str):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train([captions], trainers.BpeTrainer(vocab_size=500, special_tokens=["[UNK]",
                                                                              "[PAD]"]))
    tok.save(path)
    return tok


def tokenizing(tok_file: str) -> dict:
    """The ways of tokenising a batch of captions to 32 ids that the benchmark compares:
    ``Tokenize``; the tokenizer's own padding and truncation with ``encode_batch_fast``, the
    ids made a tensor; and (timed alone only) the tokenizer truncating, with no padding."""
    import numpy as np
    import torch
    from tokenizers import Tokenizer

    from fastdata.transforms import Tokenize

    bare = Tokenizer.from_file(tok_file)
    bare.enable_truncation(32)
    padded = Tokenizer.from_file(tok_file)
    padded.enable_padding(pad_id=1, pad_token="[PAD]", length=32)
    padded.enable_truncation(32)
    return {"Tokenize": Tokenize(bare, length=32, pad_id=1),
            "own padding": lambda b: torch.from_numpy(np.array(
                [e.ids for e in padded.encode_batch_fast(b)], np.int64)),
            "no padding": bare.encode_batch_fast}


def tokenizing_alone(captions: str, tok_file: str, repeats: int = 5) -> list[dict]:
    """The thread time a caption of each of the ways of ``tokenizing``, over the captions in
    batches of 64 in this thread alone: the best of ``repeats`` passes."""
    with open(captions) as f:
        texts = f.read().split("\n")
    batches = [texts[i:i + 64] for i in range(0, len(texts), 64)]
    rows = []
    for name, fn in tokenizing(tok_file).items():
        best = float("inf")
        for _ in range(repeats):
            t = time.thread_time()
            for b in batches:
                fn(b)
            best = min(best, time.thread_time() - t)
        rows.append({"stage": "tokenize", "variant": name, "us": best / len(texts) * 1e6})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("photos")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=8, help="timed epochs a loading run")
    p.add_argument("--json", default=None, help="write the results here")
    a = p.parse_args()
    from fastdata.converters.convert import convert

    rows = []
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        files = labels_files(a.photos, tmp)
        tok = files["tokenizer"]
        sets = {k: os.path.join(tmp, f"set-{k}") for k in ("image", "caption", "emb", "tokens")}

        def converting(name):
            def run():
                t, c = time.perf_counter(), tree_cpu_seconds()
                convert(a.photos, sets[name], sizes=[256], labels=files[name], progress=False,
                        overwrite=True)
                dt = time.perf_counter() - t
                n = len(_files(a.photos))
                return {"img_s": n / dt, "cpu_ms": (tree_cpu_seconds() - c) / n * 1e3}
            return run

        conv = interleaved({k: converting(k) for k in sets}, a.rounds)
        for name, runs in conv.items():
            rows.append({"stage": "convert", "variant": name, **medians(runs), "rounds": runs})
            print("convert", name, medians(runs), flush=True)

        def loading(path, mode):
            # the tokenizer's own threads off, as Hugging Face advises inside loaders
            return lambda: fresh_run(RUN, path, mode, tok, str(a.epochs),
                                     env={"TOKENIZERS_PARALLELISM": "false"})

        # every variant reads one set (its images the same bytes in the same files)
        both = os.path.join(tmp, "set-all")
        convert(files["src"], both, sizes=[256], labels=files["all"], progress=False,
                fields={"boxes": "boxes", "pose": "keypoints", "objects": "boxes",
                        "seg": "classmap"})
        load = interleaved({"image": loading(both, "image"),
                            "caption": loading(both, "caption"),
                            "caption+tokens": loading(both, "caption+tokens"),
                            "caption+padded": loading(both, "caption+padded"),
                            "caption+same": loading(both, "caption+same"),
                            "emb": loading(both, "emb"),
                            "stored tokens": loading(both, "tokens"),
                            "boxes": loading(both, "boxes"),
                            "boxes+masks": loading(both, "objects"),
                            "keypoints": loading(both, "pose"),
                            "classmap": loading(both, "seg")}, a.rounds)
        for name, runs in load.items():
            rows.append({"stage": "load", "variant": name, **medians(runs), "rounds": runs})
            print("load", name, medians(runs), flush=True)
        alone = fresh_run("import json, sys\n"
                          "from benchmarks.loading.fields_cpu import tokenizing_alone\n"
                          "print(json.dumps(tokenizing_alone(*sys.argv[1:])))",
                          files["captions"], tok, env={"TOKENIZERS_PARALLELISM": "false"})
    for r in alone:
        print(f"tokenize {r['variant']:15} {r['us']:.1f} us a caption, alone")
    base = {r["stage"]: r["img_s"] for r in rows if r["variant"] == "image"}
    for r in rows:
        r["of_image_only"] = r["img_s"] / base[r["stage"]]
        print(f"{r['stage']:8} {r['variant']:15} {r['img_s']:7.0f} img/s  "
              f"{r['cpu_ms']:.3f} CPU ms/img  {r['of_image_only']:.3f} of images alone"
              + (f"  (tokenizer {r['tok_us']:.1f} us a caption)" if r.get("tok_us") else ""))
    if a.json:
        write_results(a.json, "loading.fields_cpu", rows + alone)


if __name__ == "__main__":
    main()
