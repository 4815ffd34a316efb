"""A TCP proxy that puts a round-trip time and a bandwidth cap between a client and a server,
as ``tc netem delay ... rate ...`` would on a kernel that has netem:

    python -m benchmarks.remote.limiter --listen 9001 --to 9000 --rtt-ms 50 --mbps 200

Each chunk is forwarded half the round trip after it arrived, in each direction; the bytes of
every connection in one direction share the rate (a token bucket), as one link's would. Runs
until killed; prints ``ready`` once it listens.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time

CHUNK = 256 << 10


class Link:
    """One direction of the link: its delay, and the time its next byte may leave."""

    def __init__(self, delay_s: float, rate: float | None):
        self.delay, self.rate, self.free_at = delay_s, rate, 0.0

    def slot(self, n: int) -> float:
        """When ``n`` bytes that may leave now do leave (their turn on the shared rate)."""
        now = time.monotonic()
        if self.rate is None:
            return now
        start = max(now, self.free_at)
        self.free_at = start + n / self.rate
        return self.free_at


async def _pipe(reader, writer, link: Link) -> None:
    queue: asyncio.Queue = asyncio.Queue()

    async def receive():
        while data := await reader.read(CHUNK):
            await queue.put((time.monotonic() + link.delay, data))
        await queue.put((time.monotonic() + link.delay, b""))

    async def send():
        while True:
            due, data = await queue.get()
            if not data:
                break
            due = max(due, link.slot(len(data)))
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            writer.write(data)
            await writer.drain()
        writer.close()

    await asyncio.gather(receive(), send(), return_exceptions=True)


async def serve(listen: int, to: int, rtt_ms: float, mbps: float | None) -> None:
    rate = None if mbps is None else mbps * 1e6
    up, down = Link(rtt_ms / 2000, rate), Link(rtt_ms / 2000, rate)

    async def handle(client_r, client_w):
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", to)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_pipe(client_r, server_w, up), _pipe(server_r, client_w, down))

    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


def start(to: int, link: str) -> tuple[int, subprocess.Popen | None]:
    """``link`` (``RTT_MS:MB_PER_S``, or ``none``) in front of the server at port ``to`` on
    127.0.0.1, in a process of its own: the port to connect to, and that process (None for
    ``none``: the server's own port)."""
    if link == "none":
        return to, None
    rtt, mbps = link.split(":")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--listen", str(port),
                             "--to", str(to), "--rtt-ms", rtt, "--mbps", mbps],
                            stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()      # type: ignore[union-attr] - "ready"
    return port, proc


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--listen", type=int, required=True)
    p.add_argument("--to", type=int, required=True, help="the server's port on 127.0.0.1")
    p.add_argument("--rtt-ms", type=float, default=0.0)
    p.add_argument("--mbps", type=float, default=None, help="MB/s each way (default: none)")
    a = p.parse_args()
    asyncio.run(serve(a.listen, a.to, a.rtt_ms, a.mbps))


if __name__ == "__main__":
    main()
