"""The CPU the node cache's download path spends per MB (the store's client streaming a shard,
its SHA-256, the write into the cache's file), by the size of the pieces it works in:

    python -m benchmarks.remote.fetch_cpu /tmp/photos --rounds 9

The photos are converted at 256 px to raw HDF5, 250 a shard, and uploaded to an S3 server
(moto's, on the same host); each round downloads the first 6 shards one after another with
``Remote.download`` at each ``--chunk`` size in turn (interleaved), every one checksummed as the
cache checks a shard. CPU: this process's (the client's own threads included, the server's
not), per MB downloaded; medians over the rounds.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import resource
import shutil
import statistics
import tempfile

from benchmarks.remote.remote_cpu import moto_server  # noqa: E402

BUCKET = "fetch"


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("photos")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--chunk", type=int, action="append", default=None, metavar="KIB",
                   help="piece size in KiB (default: 256, 1024, 8192)")
    a = p.parse_args()
    chunks = [k << 10 for k in (a.chunk or [256, 1024, 8192])]
    work = tempfile.mkdtemp(dir="/tmp")
    from fastdata.converters.convert import convert
    from fastdata.shards.stores import objectstore

    local = os.path.join(work, "set")
    convert(a.photos, local, sizes=[256], shard_size=250, progress=False)
    names = sorted(f for f in os.listdir(local) if f.startswith("shard-"))[:6]
    mb = sum(os.path.getsize(os.path.join(local, n)) for n in names) / 1e6
    server, port = moto_server()
    os.environ.update(AWS_ACCESS_KEY_ID="k", AWS_SECRET_ACCESS_KEY="s", AWS_REGION="us-east-1",
                      AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
    try:
        import boto3

        client = boto3.client("s3")
        client.create_bucket(Bucket=BUCKET)
        for n in names:
            client.upload_file(os.path.join(local, n), BUCKET, f"set/{n}")
        store = objectstore.ObjectStore(f"s3://{BUCKET}/set")
        out = os.path.join(work, "download")
        per_mb: dict[int, list[float]] = {c: [] for c in chunks}
        for _ in range(a.rounds):
            for c in chunks:
                objectstore.CHUNK = c
                start = _cpu()
                for n in names:
                    with open(out, "wb") as f:
                        store.download(n, f.fileno(), hashlib.sha256().update)
                    os.unlink(out)
                per_mb[c].append(1000 * (_cpu() - start) / mb)
        print(f"{len(names)} shards, {mb:.0f} MB a round, {a.rounds} rounds")
        for c, v in per_mb.items():
            print(f"pieces of {c >> 10} KiB: {statistics.median(v):.3f} CPU ms per MB "
                  f"({min(v):.3f}-{max(v):.3f})")
    finally:
        server.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
