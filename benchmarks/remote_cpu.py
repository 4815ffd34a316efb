"""A shard set read from a local S3 server (moto's) against the same set on the local disk,
loader only: time to the first batch and img/s of a cold-cache epoch and of a warm one, and the
link's own bytes/s (the remote figures of docs/performance.md).

    OPENBLAS_NUM_THREADS=1 python -W ignore benchmarks/remote_cpu.py /tmp/photos --rounds 3

The photos converted to raw HDF5 at 256 px; RandomResizedCrop(224) + flip + normalise to
float32, batch 64, 2 reader threads; each run in a fresh interpreter, local and remote
interleaved round by round, each remote round with an empty cache. No bandwidth or latency
limit between the loader and the server (both on the same host). ``--window W`` adds the bucket
read with ``shuffle_window=W``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

RUN = """
import sys, time
t0 = time.perf_counter()
import torch, fastdata
torch.set_num_threads(1)
path, cache, window = sys.argv[1], sys.argv[2], int(sys.argv[3]) or None
loader = fastdata.Loader(path, batch_size=64, crop=224, device="cpu", num_workers=2,
                         cache_dir=cache if path.startswith("s3://") else None,
                         shuffle_window=window)
t = time.perf_counter()
out = []
for epoch in range(2):
    loader.set_epoch(epoch)
    n, first = 0, None
    for images, _ in loader:
        n += images.shape[0]
        first = first or time.perf_counter() - t
    out += [n / (time.perf_counter() - t), first]
    t = time.perf_counter()
print(*out)
"""


def _link(local: str, url: str, rounds: int) -> float:
    """Bytes/s of the server: every shard downloaded, 4 at a time, as the loader's prefetch
    does (median of ``rounds``)."""
    import concurrent.futures as cf

    from fastdata.shards.remote import Remote

    names = [f for f in os.listdir(local) if f.startswith("shard-")]
    total = sum(os.path.getsize(os.path.join(local, f)) for f in names)
    remote, rates = Remote(url), []
    for _ in range(rounds):
        def one(name):
            fd = os.open(os.devnull, os.O_WRONLY)
            try:
                remote.download(name, fd)
            finally:
                os.close(fd)
        t = time.perf_counter()
        with cf.ThreadPoolExecutor(4) as pool:
            list(pool.map(one, names))
        rates.append(total / (time.perf_counter() - t))
    return statistics.median(rates)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("photos")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--window", type=int, default=2,
                   help="also read the bucket with shuffle_window=W (0: not)")
    a = p.parse_args()
    import boto3

    from fastdata.converters.convert import convert

    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        local = os.path.join(tmp, "set")
        convert(a.photos, local, sizes=[256], progress=False)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "moto_server"),
                                   "-H", "127.0.0.1", "-p", str(port)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="k",
                          AWS_SECRET_ACCESS_KEY="s", AWS_REGION="us-east-1")
        try:
            time.sleep(2)
            client = boto3.client("s3")
            client.create_bucket(Bucket="bench")
            for f in os.listdir(local):
                client.upload_file(os.path.join(local, f), "bench", f"set/{f}")
            link = _link(local, "s3://bench/set", a.rounds)
            nbytes = sum(os.path.getsize(os.path.join(local, f)) for f in os.listdir(local)
                         if f.startswith("shard-"))
            with open(os.path.join(local, "manifest.json")) as f:
                per_image = nbytes / json.load(f)["num_samples"]
            print(f"the link: {link / 1e6:.0f} MB/s (the shards downloaded 4 at a time, "
                  f"median of {a.rounds}); {nbytes / 1e6:.0f} MB of shards", flush=True)
            runs = [("local", local, 0), ("s3", "s3://bench/set", 0)]
            if a.window:
                runs.append((f"s3, shuffle_window={a.window}", "s3://bench/set", a.window))
            got: dict[str, list[list[float]]] = {name: [] for name, _, _ in runs}
            for r in range(a.rounds):
                for name, path, window in runs:
                    cache = os.path.join(tmp, "cache")
                    shutil.rmtree(cache, ignore_errors=True)
                    out = subprocess.run([sys.executable, "-c", RUN, path, cache, str(window)],
                                         check=True,
                                         capture_output=True, text=True).stdout.split()
                    got[name].append([float(x) for x in out])
                    e1, f1, e2, _ = got[name][-1]
                    print(f"round {r}: {name}: epoch 1 {e1:.0f} img/s (first batch after "
                          f"{f1:.2f} s), epoch 2 {e2:.0f} img/s", flush=True)
        finally:
            server.kill()
    med = {k: [statistics.median(run[i] for run in v) for i in range(4)] for k, v in got.items()}
    for k, (e1, f1, e2, _) in med.items():
        print(f"{k}: median epoch 1 {e1:.0f} img/s, first batch {f1:.2f} s, epoch 2 {e2:.0f}")
    print(f"s3 / local: epoch 1 {med['s3'][0] / med['local'][0]:.3f}, epoch 2 "
          f"{med['s3'][2] / med['local'][2]:.3f}")
    allowed = min(med["local"][0], link / per_image)
    print(f"epoch 1 / min(local epoch 1, the link's bytes/s over an image's "
          f"{per_image / 1e3:.0f} kB = {link / per_image:.0f} img/s): "
          f"{med['s3'][0] / allowed:.3f}")


if __name__ == "__main__":
    main()
