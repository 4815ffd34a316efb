"""The command line's options: names that match the Python API's."""
from __future__ import annotations

import pytest

from fastdata.cli import build_parser


@pytest.mark.parametrize("command", ["train", "bench"])
def test_the_worker_count_is_num_workers_as_in_the_loader(command):
    parse = build_parser(command).parse_args
    assert parse([command, "s", "--num-workers", "3"]).workers == 3
    assert parse([command, "s", "--workers", "3"]).workers == 3     # the older name still reads
    assert parse([command, "s"]).workers is None
    assert "--num-workers" in build_parser(command)._subparsers._group_actions[0] \
        .choices[command].format_help()
