"""Fixtures shared by the tests, and the skip of GPU tests without CUDA (helpers:
``tests/helpers.py``)."""
from __future__ import annotations

import os

import pytest

from tests.helpers import plain_folder


def pytest_collection_modifyitems(config, items):
    """Tests marked ``@pytest.mark.gpu`` skip cleanly where CUDA is not available."""
    import torch

    if torch.cuda.is_available():
        return
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="needs CUDA"))


@pytest.fixture
def folder(tmp_path):
    return plain_folder(tmp_path / "src")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    from fastdata.converters.convert import convert

    tmp = tmp_path_factory.mktemp("loader")
    src = plain_folder(tmp / "src", per_class=8)
    os.remove(os.path.join(src, "c", "img_007.jpg"))        # 24 files → N = 23
    out = {}
    for c in ("hdf5", "lmdb"):
        out[c] = str(tmp / c)
        convert(src, out[c], container=c, sizes=[16, 32], shard_size=6, num_workers=1,
                progress=False)
    return out
