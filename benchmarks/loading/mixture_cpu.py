"""One shard set against a mixture of two holding the same photos (its classes split in two
halves), loader only, the two interleaved round by round (the mixture figure of
docs/performance.md).

    OPENBLAS_NUM_THREADS=1 python -W ignore -m benchmarks.loading.mixture_cpu /tmp/photos --rounds 5

Raw HDF5 shards at 256 px; RandomResizedCrop(224) + flip + normalise to float32, batch 64,
2 reader threads, 5 epochs after an untimed one, each run in a fresh interpreter. The mixture
is ``Loader([half_a, half_b])`` (weights by size: an epoch of the same 3000 samples).
Prints img/s and CPU ms an image (all threads) per round, then the medians and their ratio.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

RUN = """
import resource, sys, time
import torch, fastdata
torch.set_num_threads(1)
sets = sys.argv[1:]
loader = fastdata.Loader(sets if len(sets) > 1 else sets[0], batch_size=64, crop=224,
                         device="cpu", num_workers=2)
for _ in loader:
    pass
cpu = lambda: sum(getattr(resource.getrusage(resource.RUSAGE_SELF), f)
                  for f in ("ru_utime", "ru_stime"))
t, c, n = time.perf_counter(), cpu(), 0
for epoch in range(1, 6):
    loader.set_epoch(epoch)
    for images, _ in loader:
        n += images.shape[0]
print(n / (time.perf_counter() - t), (cpu() - c) / n * 1e3)
"""


def _halves(photos: str, tmp: str) -> list[str]:
    """Two folders of hard links, each with half the classes."""
    classes = sorted(d for d in os.listdir(photos) if os.path.isdir(os.path.join(photos, d)))
    out = []
    for k, part in enumerate((classes[::2], classes[1::2])):
        root = os.path.join(tmp, f"half{k}")
        for c in part:
            os.makedirs(os.path.join(root, c))
            for f in os.listdir(os.path.join(photos, c)):
                os.link(os.path.join(photos, c, f), os.path.join(root, c, f))
        out.append(root)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("photos")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--size", type=int, default=256)
    a = p.parse_args()
    from fastdata.converters.convert import convert

    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        sets = {}
        for name, src in [("one set", a.photos)] + list(zip(("half a", "half b"),
                                                            _halves(a.photos, tmp))):
            sets[name] = os.path.join(tmp, name.replace(" ", "-"))
            convert(src, sets[name], sizes=[a.size], progress=False)
        runs = {"one set": [sets["one set"]], "mixture of 2": [sets["half a"], sets["half b"]]}
        got: dict[str, list[tuple[float, float]]] = {k: [] for k in runs}
        for r in range(a.rounds):
            for name, paths in runs.items():
                out = subprocess.run([sys.executable, "-c", RUN, *paths], check=True,
                                     capture_output=True, text=True).stdout.split()
                got[name].append((float(out[0]), float(out[1])))
                print(f"round {r}: {name}: {got[name][-1][0]:.0f} img/s, "
                      f"{got[name][-1][1]:.3f} CPU ms an image", flush=True)
    med = {k: (statistics.median(x for x, _ in v), statistics.median(c for _, c in v))
           for k, v in got.items()}
    for k, (rate, ms) in med.items():
        print(f"{k}: median {rate:.0f} img/s, {ms:.3f} CPU ms an image")
    print(f"mixture / one set: {med['mixture of 2'][0] / med['one set'][0]:.3f}; per-round "
          f"ratios {[round(m[0] / o[0], 3) for m, o in zip(got['mixture of 2'], got['one set'])]}")


if __name__ == "__main__":
    main()
