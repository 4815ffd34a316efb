"""A/B: a CPU training step fed by the torch loader, with glibc's default malloc thresholds vs
``fastdata.env.keep_freed_memory()`` (what ``fastdata train``/``bench`` do on a CPU). Each side
runs in its own process (the setting is process-wide and cannot be undone), the sides
alternate over rounds; figures in benchmarks/RESULTS.md.

    .venv/bin/python -W ignore benchmarks/ab_malloc.py /tmp/fd-compare/raw-hdf5

The child runs ``Bench`` with resnet8 at crop 112, batch 32 and prints its JSON: the ceiling
(one fixed batch) and the loader-fed step, img/s.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys


def child(shards: str, keep: bool) -> None:
    from fastdata.bench import Bench
    from fastdata.env import keep_freed_memory

    if keep:
        assert keep_freed_memory()
    r = Bench(shards, backends=["torch"], model="resnet8", batch_size=32, crop=112, warmup=3,
              batches=10, repeat=3, device="cpu", num_workers=2).run(progress=False)
    m = r["results"][0]["model"]
    print(json.dumps({"ceiling": m["ceiling"]["median"], "fed": m["img_per_s"]["median"]}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shards")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", choices=["default", "keep"])
    a = ap.parse_args()
    if a.child:
        return child(a.shards, a.child == "keep")
    res = {side: {"ceiling": [], "fed": []} for side in ("default", "keep")}
    for _ in range(a.rounds):
        for side in res:
            out = subprocess.run([sys.executable, __file__, a.shards, "--child", side],
                                 capture_output=True, text=True, check=True).stdout
            for k, v in json.loads(out.strip().splitlines()[-1]).items():
                res[side][k].append(v)
    for side, r in res.items():
        print(f"{side}: " + "; ".join(f"{k} median {statistics.median(v):.0f} img/s (runs "
                                      f"{', '.join(f'{x:.0f}' for x in v)})" for k, v in r.items()))


if __name__ == "__main__":
    main()
