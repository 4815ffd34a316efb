"""How a conversion's memory grows with the size of a parquet or tar source: for each N, N
small JPEGs with a class and a caption each (``make_imagenet_like``'s pool) as one parquet
file (row groups of 100) and as tars of 10,000 samples, converted at 32 px into raw HDF5 in a
fresh process; its peak RSS (``VmHWM``) and the largest worker's (figures in
docs/performance.md, "Converting: from parquet, tars and Hugging Face datasets").

    python -W ignore -m benchmarks.convert.sources_growth /tmp/sources-growth \\
        --n 10000,100000,300000 --json benchmarks/results/RUN/sources_growth.json
"""
from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tarfile

from benchmarks.convert.sources import FASTDATA, ROOT
from benchmarks.harness import write_results
from benchmarks.inputs.make_imagenet_like import pool
from benchmarks.loading.fields_cpu import WORDS

PER_TAR = 10_000


def make(root: str, n: int) -> dict[str, str]:
    """N samples as ``root/N/data.parquet`` and ``root/N/tars/shard-*.tar`` (made once)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = os.path.join(root, str(n))
    out = {"parquet": os.path.join(folder, "data.parquet"),
           "tars": os.path.join(folder, "tars", f"shard-{{000000..{(n - 1) // PER_TAR:06d}}}"
                                ".tar")}
    if os.path.exists(os.path.join(folder, "done")):
        return out
    os.makedirs(os.path.join(folder, "tars"), exist_ok=True)
    jpegs = pool(512, 0)
    rng = np.random.default_rng(0)
    pick = rng.integers(0, len(jpegs), n)
    captions = [" ".join(rng.choice(WORDS, rng.integers(8, 21))) for _ in range(n)]
    schema = pa.schema([("image", pa.binary()), ("label", pa.int64()), ("caption", pa.string())])
    with pq.ParquetWriter(out["parquet"], schema) as w:
        for a in range(0, n, 100):
            b = min(n, a + 100)
            w.write_table(pa.table({"image": [jpegs[k] for k in pick[a:b]],
                                    "label": [k % 100 for k in range(a, b)],
                                    "caption": captions[a:b]}, schema=schema))
    for t in range(0, n, PER_TAR):
        with tarfile.open(os.path.join(folder, "tars", f"shard-{t // PER_TAR:06d}.tar"),
                          "w") as tf:
            for k in range(t, min(n, t + PER_TAR)):
                for ext, data in (("jpg", jpegs[pick[k]]), ("cls", str(k % 100).encode()),
                                  ("txt", captions[k].encode())):
                    info = tarfile.TarInfo(f"{k:09d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    open(os.path.join(folder, "done"), "w").close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root")
    p.add_argument("--n", default="10000,100000")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    rows = []
    for n in map(int, a.n.split(",")):
        for kind, src in make(a.root, n).items():
            out = os.path.join(a.root, f"set-{kind}-{n}")
            r = subprocess.run([sys.executable, "-W", "ignore", "-c",
                                FASTDATA.replace("sizes=[256]", "sizes=[32]"), src, out,
                                json.dumps({})], capture_output=True, text=True, check=True,
                               cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
            row = {"source": kind, "n": n, **json.loads(r.stdout.strip().splitlines()[-1])}
            print(json.dumps(row), flush=True)
            rows.append(row)
    for r in rows:
        print(f"{r['source']:8} {r['n']:8}  {r['img_s']:7.0f} img/s  peak {r['peak_mib']:.0f} "
              f"MiB, worker {r['child_peak_mib']:.0f} MiB")
    if a.json:
        write_results(a.json, "convert.sources_growth", rows)


if __name__ == "__main__":
    main()
