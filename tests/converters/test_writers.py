"""Shard writers: what a write that the OS refuses says."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import plain_folder

resource = pytest.importorskip("resource")


def _small_files():
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, 256 << 10))


@pytest.mark.parametrize("container", ["hdf5", "lmdb"])
def test_a_file_size_limit_is_one_line_naming_the_shard_and_the_fix(tmp_path, container):
    """h5py's error ran over several lines, with its buffer's address and the time."""
    src = plain_folder(tmp_path / "src", per_class=4)
    r = subprocess.run([sys.executable, "-m", "fastdata.cli", "-q", "convert", src,
                        str(tmp_path / "o"), "--size", "256", "--container", container],
                       capture_output=True, text=True, timeout=120, preexec_fn=_small_files)
    assert r.returncode == 2, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, r.stderr
    assert "would be larger than this process may write" in lines[0] and "ulimit -f" in lines[0]
    assert "shard-00000" in lines[0]
