"""Warm epochs from a bucket against the same set on the local disk, interleaved (the warm
figures of docs/performance.md, "Reading from an object store"):

    OPENBLAS_NUM_THREADS=1 python -W ignore -m benchmarks.remote.remote_warm /tmp/photos --rounds 5

The sets of ``benchmarks/remote/remote_cpu.py`` (the photos at 256 px, shuffled, 250 a shard,
raw and JPEG HDF5) on moto's S3 server on the same host; each run a fresh interpreter that reads one
untimed epoch (from the bucket: the cold one, which fills the cache) and then times 3:
RandomResizedCrop 224 + flip + normalise to float32, batch 64, 2 threads,
``shuffle_window=2`` on both sides. The disk and the bucket alternate round by round.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from benchmarks.remote.remote_cpu import BUCKET, SHARD_SIZE, moto_server  # noqa: E402

RUN = r"""
import sys, time, torch, fastdata
torch.set_num_threads(1)
url, cache = sys.argv[1], sys.argv[2]
loader = fastdata.Loader(url, batch_size=64, crop=224, device="cpu", num_workers=2,
                         shuffle_window=2, cache_dir=cache if url.startswith("s3") else None)
loader.set_epoch(0)
for _ in loader:
    pass
t, n = time.perf_counter(), 0
for e in range(1, 4):
    loader.set_epoch(e)
    for x, _ in loader:
        n += len(x)
print(n / (time.perf_counter() - t))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("photos")
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    import boto3

    from fastdata.converters.convert import convert

    tmp = tempfile.mkdtemp(dir="/tmp")
    server, port = moto_server()
    env = {**os.environ, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
           "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1"}
    try:
        client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id="k",
                              aws_secret_access_key="s", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        for enc in ("raw", "jpeg"):
            local = os.path.join(tmp, enc)
            convert(a.photos, local, sizes=[256], encoding=enc, shuffle=True,
                    shard_size=SHARD_SIZE, progress=False)
            for f in os.listdir(local):
                client.upload_file(os.path.join(local, f), BUCKET, f"{enc}/{f}")
            got: dict[str, list[float]] = {"disk": [], "bucket": []}
            for r in range(a.rounds):
                for where in (("disk", "bucket") if r % 2 == 0 else ("bucket", "disk")):
                    cache = os.path.join(tmp, "cache")
                    shutil.rmtree(cache, ignore_errors=True)
                    url = local if where == "disk" else f"s3://{BUCKET}/{enc}"
                    out = subprocess.run([sys.executable, "-c", RUN, url, cache], env=env,
                                         check=True, capture_output=True, text=True).stdout
                    got[where].append(float(out))
                    print(f"{enc} round {r}: {where} {got[where][-1]:.0f} img/s", flush=True)
            ratio = [b / d for b, d in zip(got["bucket"], got["disk"])]
            print(f"{enc}: disk {statistics.median(got['disk']):.0f} img/s, bucket "
                  f"{statistics.median(got['bucket']):.0f} img/s, bucket/disk "
                  f"{statistics.median(ratio):.3f} (rounds {min(ratio):.2f}-{max(ratio):.2f})",
                  flush=True)
    finally:
        server.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
