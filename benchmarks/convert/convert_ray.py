"""The Ray engine against the local converter on one machine: what a task per shard costs.

    python -m benchmarks.inputs.make_photos /tmp/photos
    python -W ignore -m benchmarks.convert.convert_ray /tmp/photos --work /tmp/fd-ray \\
        --shard-size 250

Starts a local Ray cluster of the usable cores (``ray start --head``, with a token), then runs
``fastdata convert`` (raw HDF5 at ``--size``) in a fresh process per run, the local engine and
``--engine ray --address`` alternating for ``--rounds`` rounds; prints the seconds of each, the
median of each engine, and the difference per shard. The cluster (only it) is stopped at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

from fastdata.env import usable_cpus


def run(cmd: list[str], env: dict) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("photos")
    ap.add_argument("--work", default="/tmp/fd-ray")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--shard-size", type=int, default=250)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--port", type=int, default=6389)
    a = ap.parse_args()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    cores = usable_cpus()
    t0 = time.perf_counter()
    cluster = subprocess.Popen([ray, "start", "--head", "--block", f"--port={a.port}",
                                f"--num-cpus={cores}", "--include-dashboard=false",
                                "--disable-usage-stats"], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    while True:     # up once its port answers
        try:
            socket.create_connection(("127.0.0.1", a.port), timeout=1).close()
            break
        except OSError:
            if cluster.poll() is not None:
                sys.exit(f"ray start failed (exit status {cluster.poll()})")
            time.sleep(0.2)
    started = time.perf_counter() - t0
    convert = [sys.executable, "-m", "fastdata.cli", "-q", "convert", a.photos]
    common = ["--size", str(a.size), "--shard-size", str(a.shard_size), "--overwrite"]
    times: dict[str, list[float]] = {"local": [], "ray": []}
    try:
        for r in range(a.rounds):
            for engine in ("local", "ray"):
                out = os.path.join(a.work, engine)
                extra = ["--engine", "ray", "--address", f"127.0.0.1:{a.port}"] \
                    if engine == "ray" else []
                times[engine].append(run(convert + [out] + common + extra, env))
                print(json.dumps({"round": r, "engine": engine,
                                  "seconds": round(times[engine][-1], 2)}), flush=True)
    finally:       # this cluster only, not others of this user; at once (nothing to keep)
        os.killpg(cluster.pid, signal.SIGKILL)
        cluster.wait(timeout=120)
    with open(os.path.join(a.work, "ray", "manifest.json")) as f:
        m = json.load(f)
    shards, n = len(m["shards"]), m["num_samples"]
    local, on_ray = (statistics.median(times[k]) for k in ("local", "ray"))
    print(f"{n} images, {shards} shards, {cores} cores; ray start {started:.1f} s")
    print(f"local {local:.2f} s ({n / local:.0f} img/s), ray {on_ray:.2f} s "
          f"({n / on_ray:.0f} img/s): {on_ray / local:.2f}x the time, "
          f"{1000 * (on_ray - local) / shards:+.0f} ms per shard")
    shutil.rmtree(a.work, ignore_errors=True)


if __name__ == "__main__":
    main()
