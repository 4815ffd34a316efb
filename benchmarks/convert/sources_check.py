"""The same photos from every source give the same set, from a bucket and on Ray too: the
inputs ``benchmarks.convert.sources`` made (parquet, tars, a Hugging Face dataset, and the
folder with its labels file) converted from a local S3 server (moto's, through the real
client) and on a local Ray cluster, each compared sample by sample with the folder's set (the
pixels, the class, the caption) and, on Ray, byte for byte with the local engine's shards.

    python -W ignore -m benchmarks.convert.sources /tmp/photos --work /tmp/fd-sources-photos
    python -W ignore -m benchmarks.convert.sources_check --work /tmp/fd-sources-photos \\
        --json benchmarks/results/RUN/sources_check.json
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time

from benchmarks.convert.sources import same_samples
from benchmarks.harness import write_results


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def moto(bucket: str):
    """moto's S3 server on a free port, the ``AWS_*`` settings pointing at it; returns the
    server process and a boto3 client with ``bucket`` made."""
    import boto3

    port = _port()
    os.environ.update({"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
                       "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s",
                       "AWS_REGION": "us-east-1"})
    server = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "moto_server"),
                               "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(150):
        try:
            client = boto3.client("s3")
            client.create_bucket(Bucket=bucket)
            return server, client
        except Exception:       # noqa: BLE001 - not up yet
            time.sleep(0.2)
    server.kill()
    raise RuntimeError("moto's server did not start")


def main() -> None:
    from fastdata.converters.convert import convert

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", default="/tmp/fd-sources-photos")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    work = os.path.abspath(a.work)
    reference = os.path.join(work, "set-folder")
    parquet = os.path.join(work, "hub", "data", "train-00000-of-00001.parquet")
    tars = os.path.join(work, "tars", "shard-{000000..000005}.tar")
    rows = []
    server, s3 = moto("photos")
    try:
        s3.upload_file(parquet, "photos", "pq/train.parquet")
        for name in sorted(os.listdir(os.path.join(work, "tars"))):
            s3.upload_file(os.path.join(work, "tars", name), "photos", f"tars/{name}")
        with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
            for name, url, caption in (
                    ("parquet from S3", "s3://photos/pq/train.parquet", "caption"),
                    ("tars from S3", "s3://photos/tars/shard-{000000..000005}.tar", "txt")):
                out = os.path.join(tmp, name.replace(" ", "-"))
                t = time.perf_counter()
                convert(url, out, sizes=[256], progress=False)
                secs = time.perf_counter() - t
                same_samples(reference, out, caption)
                rows.append({"check": name, "same_as_folder": True, "secs": secs})
                print(rows[-1], flush=True)
            for name, src, local in (("parquet on Ray", parquet, "set-parquet"),
                                     ("tars on Ray", tars, "set-tars"),
                                     ("hf on Ray", os.path.join(work, "hf"), "set-hf")):
                out = os.path.join(tmp, name.replace(" ", "-"))
                t = time.perf_counter()
                m = convert(src, out, sizes=[256], progress=False, engine="ray")
                secs = time.perf_counter() - t
                same = all(open(os.path.join(out, e["file"]), "rb").read() ==
                           open(os.path.join(work, local, e["file"]), "rb").read()
                           for e in m["shards"])
                same_samples(reference, out, "txt" if "tars" in name else "caption")
                rows.append({"check": name, "same_as_folder": True,
                             "bytes_as_local_engine": same, "secs": secs})
                print(rows[-1], flush=True)
    finally:
        server.kill()
    if a.json:
        write_results(a.json, "convert.sources_check", rows)


if __name__ == "__main__":
    main()
