"""Memory of many ranks on one node reading one shard set: N processes, each reading its share
of an epoch at random (as N DDP ranks do), against one process reading the whole epoch. Each
process reports the PSS of its maps of the shard files (what it holds of the set: a page
mapped by k processes counts 1/k in each) and its whole PSS, once every process has read.

    .venv/bin/python -m benchmarks.disk.page_cache_ranks /tmp/bench-raw --ranks 4

A set's pages are held once, in the page cache, however many ranks map them: the summed
shard PSS of N ranks stays at the set's size (FFCV's per-process copies grow with N).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os


def _pss(shards: set[str]) -> tuple[int, int]:
    """(PSS of the maps of ``shards``, PSS of the whole process), in kB."""
    total = of_shards = 0
    current = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and ":" not in head[0]:
                current = head[5] if len(head) > 5 else None
            elif head[0] == "Pss:":
                total += int(head[1])
                of_shards += int(head[1]) if current in shards else 0
    return of_shards, total


def _rank(path: str, rank: int, world: int, conn) -> None:
    import fastdata

    loader = fastdata.Loader(path, batch_size=64, crop=224, device="cpu", num_workers=0,
                             rank=rank, world_size=world, seed=0)
    n = sum(len(y) for _, y in loader)
    conn.send(n)
    conn.recv()                 # every rank has read its share: measure together
    conn.send(_pss({os.path.realpath(s.path) for s in loader.dataset.shards}))
    conn.recv()


def run(path: str, world: int) -> list[tuple[int, int, int]]:
    """(images read, shard PSS kB, process PSS kB) per rank of ``world``."""
    ctx = mp.get_context("fork")
    pipes = [ctx.Pipe() for _ in range(world)]
    procs = [ctx.Process(target=_rank, args=(path, r, world, there))
             for r, (_, there) in enumerate(pipes)]
    for p in procs:
        p.start()
    read = [here.recv() for here, _ in pipes]
    for here, _ in pipes:
        here.send("measure")
    pss = [here.recv() for here, _ in pipes]
    for here, _ in pipes:
        here.send("done")
    for p in procs:
        p.join()
    return [(n, s, t) for n, (s, t) in zip(read, pss)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("set", help="a raw shard set")
    ap.add_argument("--ranks", type=int, default=4, help="processes on the node (default 4)")
    a = ap.parse_args()
    import fastdata

    size = sum(s["bytes"] for s in fastdata.open(a.set).manifest["shards"]) >> 20
    print(f"{a.set}: {size} MiB of shards")
    for world in (1, a.ranks):
        rows = run(a.set, world)
        shards = sum(r[1] for r in rows) >> 10
        total = sum(r[2] for r in rows) >> 10
        print(f"{world} process{'es' if world > 1 else ''}: read {sum(r[0] for r in rows)} "
              f"images; PSS of the shard maps {shards} MiB in all "
              f"({', '.join(str(r[1] >> 10) for r in rows)}), of the processes {total} MiB")


if __name__ == "__main__":
    main()
