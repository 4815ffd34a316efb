"""Mapped shard I/O's process-wide settings."""
from __future__ import annotations

import subprocess
import sys

import pytest

resource = pytest.importorskip("resource")

RAISE = """
import logging, resource, sys
logging.basicConfig(level=logging.INFO, format="%(message)s")
soft, hard = map(int, sys.argv[1:3])
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
from fastdata.shards.mapped import make_room_for_files
make_room_for_files(2000)
print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
"""


@pytest.mark.parametrize("soft,hard", [(256, 256), (256, 4096)])
def test_the_open_file_limit_is_raised_only_where_it_can_be(soft, hard):
    """At the hard limit already, the log said "raised from 256 to 256"."""
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] not in (resource.RLIM_INFINITY,) and \
            resource.getrlimit(resource.RLIMIT_NOFILE)[1] < hard:
        pytest.skip("this process may not hold that many open files")
    r = subprocess.run([sys.executable, "-c", RAISE, str(soft), str(hard)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) == hard
    if soft == hard:
        assert "raised" not in r.stderr
    else:
        assert f"from {soft} to {hard}" in r.stderr
