"""The object-store clients side by side, as the loader's cache uses one: every shard of a set
downloaded into local files, 4 at a time, from an S3 server (moto's, on the same host), straight or
through ``benchmarks/remote/limiter.py``: MB/s and CPU seconds per GB of the downloading process.

    python -m benchmarks.remote.clients_cpu /tmp/photos --python /tmp/peers/s3fs/bin/python \\
        --rounds 3 --link none --link 50:100

``--python``: an interpreter with obstore, s3fs (fsspec) and boto3 installed (each client in
a fresh process of it). The set: the photos as raw HDF5 at 256 px, 250 a shard.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile

CHILD = r"""
import concurrent.futures as cf, json, os, sys, time
client, bucket, prefix, out = sys.argv[1:5]
names = json.loads(sys.argv[5])
endpoint = os.environ["AWS_ENDPOINT_URL"]

if client == "obstore":
    import obstore
    from obstore.store import S3Store
    store = S3Store(bucket, prefix=prefix, endpoint=endpoint, virtual_hosted_style_request=False,
                    client_options={"allow_http": True})
    def fetch(name, path):
        with open(path, "wb") as f:
            for chunk in obstore.get(store, name).stream(min_chunk_size=8 << 20):
                f.write(chunk)
elif client == "s3fs":
    import s3fs
    fs = s3fs.S3FileSystem(endpoint_url=endpoint)
    def fetch(name, path):
        fs.get_file(f"{bucket}/{prefix}/{name}", path)
else:
    import boto3
    from boto3.s3.transfer import TransferConfig
    s3 = boto3.client("s3")
    def fetch(name, path):
        s3.download_file(bucket, f"{prefix}/{name}", path,
                         Config=TransferConfig(max_concurrency=1))

t, c = time.perf_counter(), os.times()
with cf.ThreadPoolExecutor(4) as pool:
    list(pool.map(lambda n: fetch(n, os.path.join(out, n)), names))
secs, c2 = time.perf_counter() - t, os.times()
nbytes = sum(os.path.getsize(os.path.join(out, n)) for n in names)
print(json.dumps({"mb_s": nbytes / secs / 1e6,
                  "cpu_s_per_gb": (c2.user + c2.system - c.user - c.system) / (nbytes / 1e9)}))
"""

CLIENTS = ("obstore", "s3fs", "boto3")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("photos")
    p.add_argument("--python", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--link", action="append", default=None)
    a = p.parse_args()
    import boto3

    from benchmarks.remote import limiter
    from benchmarks.remote.remote_cpu import moto_server
    from fastdata.converters.convert import convert

    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        local = os.path.join(tmp, "set")
        convert(a.photos, local, sizes=[256], shard_size=250, progress=False)
        names = sorted(f for f in os.listdir(local) if f.startswith("shard-"))
        server, port = moto_server()
        procs = [server]
        aws = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1"}
        try:
            s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}",
                              aws_access_key_id="k", aws_secret_access_key="s",
                              region_name="us-east-1")
            s3.create_bucket(Bucket="bench")
            for n in names:
                s3.upload_file(os.path.join(local, n), "bench", f"set/{n}")
            got: dict = {}
            for link in a.link or ["none"]:
                endpoint, lim = limiter.start(port, link)
                if lim is not None:
                    procs.append(lim)
                env = {**os.environ, **aws, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{endpoint}"}
                for r in range(a.rounds):
                    for client in CLIENTS:      # interleaved, round by round
                        out = os.path.join(tmp, "out")
                        os.makedirs(out, exist_ok=True)
                        done = subprocess.run([a.python, "-c", CHILD, client, "bench", "set",
                                               out, json.dumps(names)], env=env, check=True,
                                              capture_output=True, text=True)
                        for n in os.listdir(out):
                            os.remove(os.path.join(out, n))
                        row = json.loads(done.stdout)
                        got.setdefault((link, client), []).append(row)
                        print(json.dumps({"link": link, "round": r, "client": client, **row}),
                              flush=True)
        finally:
            for proc in procs:
                proc.kill()
    print("\n| link | client | MB/s | CPU s per GB |\n| --- | --- | --- | --- |")
    for (link, client), rows in got.items():
        print(f"| {link} | {client} | {statistics.median(r['mb_s'] for r in rows):.0f} | "
              f"{statistics.median(r['cpu_s_per_gb'] for r in rows):.2f} |")


if __name__ == "__main__":
    main()
