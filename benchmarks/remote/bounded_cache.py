"""A set larger than its node cache, read from an S3 server (moto's, on the same host) through
the link limiter: img/s and downloads per epoch.

    python -m benchmarks.remote.bounded_cache SET --link 50:100 --cache-shards 6 --epochs 3

``SET``: a converted set's folder (for example ``remote_cpu.py``'s JPEG set); its shards are
uploaded with their whole-file SHA-256 in the manifest, as a conversion into a bucket writes
it. The loader: RandomResizedCrop 224 + flip + normalise to float32, batch 64, 2 threads,
``shuffle_window=2``, ``cache_limit`` of ``--cache-shards`` times the largest shard, one
process, epochs back to back. A download: one fetch of a shard into the cache (counted in the
loader's process).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
import time

from benchmarks.remote import limiter  # noqa: E402
from benchmarks.remote.remote_cpu import moto_server  # noqa: E402

BUCKET = "bounded"


def _upload(folder: str) -> dict:
    """The set into the bucket, its manifest with each shard's whole-file SHA-256."""
    import boto3

    client = boto3.client("s3")
    client.create_bucket(Bucket=BUCKET)
    with open(os.path.join(folder, "manifest.json")) as f:
        manifest = json.load(f)
    for e in manifest["shards"]:
        with open(os.path.join(folder, e["file"]), "rb") as f:
            e["file_sha256"] = hashlib.sha256(f.read()).hexdigest()
        client.upload_file(os.path.join(folder, e["file"]), BUCKET, f"set/{e['file']}")
    client.put_object(Bucket=BUCKET, Key="set/manifest.json", Body=json.dumps(manifest).encode())
    return manifest


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("set")
    p.add_argument("--link", default="50:100", help="RTT_MS:MB_PER_S, or none")
    p.add_argument("--cache-shards", type=int, default=6)
    p.add_argument("--epochs", type=int, default=3)
    a = p.parse_args()
    server, port = moto_server()
    procs = [server]
    cache = tempfile.mkdtemp(dir="/tmp")
    os.environ.update(AWS_ACCESS_KEY_ID="k", AWS_SECRET_ACCESS_KEY="s", AWS_REGION="us-east-1",
                      AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
    try:
        manifest = _upload(a.set)
        endpoint, lim = limiter.start(port, a.link)
        procs += [lim] if lim is not None else []
        os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{endpoint}"
        import torch

        import fastdata
        from fastdata.shards.stores import objectstore

        torch.set_num_threads(1)
        downloads = [0]
        download = objectstore.ObjectStore.download

        def counted(self, *args, **kwargs):
            downloads[0] += 1
            return download(self, *args, **kwargs)
        objectstore.ObjectStore.download = counted   # type: ignore[method-assign]
        limit = a.cache_shards * max(e["bytes"] for e in manifest["shards"])
        loader = fastdata.Loader(f"s3://{BUCKET}/set", batch_size=64, crop=224, device="cpu",
                                 num_workers=2, shuffle_window=2, cache_dir=cache,
                                 cache_limit=limit)
        for epoch in range(a.epochs):
            loader.set_epoch(epoch)
            downloads[0], n, start = 0, 0, time.perf_counter()
            for images, _ in loader:
                n += images.shape[0]
            print(f"epoch {epoch + 1}: {n / (time.perf_counter() - start):.0f} img/s, "
                  f"{downloads[0]} downloads of the {len(manifest['shards'])} shards", flush=True)
        loader.close()
    finally:
        for proc in procs:
            proc.kill()
        shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
