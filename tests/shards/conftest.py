"""Fixtures of the shard tests that read a set from a store: a small set, and a real HTTP
server of it with faults on demand."""
from __future__ import annotations

import threading

import pytest

from fastdata.converters.convert import convert
from tests.helpers import FileServer, plain_folder


@pytest.fixture(scope="module")
def local_set(tmp_path_factory) -> str:
    """24 samples in 5 raw HDF5 shards at 16 px."""
    tmp = tmp_path_factory.mktemp("remote")
    out = str(tmp / "set")
    convert(plain_folder(tmp / "src", per_class=8), out, sizes=[16], shard_size=5, num_workers=1,
            progress=False)
    return out


@pytest.fixture
def http_set(local_set):
    server = FileServer(local_set)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, f"http://127.0.0.1:{server.server_address[1]}/set"
    finally:
        server.shutdown()
        server.server_close()


