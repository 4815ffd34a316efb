"""The command line's options: names that match the Python API's."""
from __future__ import annotations

import subprocess
import sys

import pytest

from fastdata.cli import build_parser


@pytest.mark.parametrize("command", ["train", "bench"])
def test_the_worker_count_is_num_workers_as_in_the_loader(command):
    parse = build_parser(command).parse_args
    assert parse([command, "s", "--num-workers", "3"]).workers == 3
    assert parse([command, "s", "--workers", "3"]).workers == 3     # the older name still reads
    assert parse([command, "s"]).workers is None
    help_text = subprocess.run([sys.executable, "-m", "fastdata.cli", command, "--help"],
                               capture_output=True, text=True, timeout=120).stdout
    assert "--num-workers" in help_text


def test_convert_names_its_options_as_the_python_api_does():
    """``convert(num_workers=, container=)``: the command line's names are the same."""
    parse = build_parser("convert").parse_args
    a = parse(["convert", "s", "o", "--num-workers", "3", "--container", "lmdb"])
    assert (a.workers, a.container) == (3, "lmdb")
    b = parse(["convert", "s", "o", "--workers", "2", "--format", "lmdb"])  # the older names
    assert (b.workers, b.container) == (2, "lmdb")


def test_train_crops_by_default_to_what_the_model_is_made_for(tmp_path, caplog):
    """Without --crop a built-in model (full resolution in its first stage) trains at up to
    64 px and any other at up to 224: the stored size (here 128) made a CPU epoch crawl."""
    import logging

    from fastdata.cli import main
    from fastdata.converters.convert import convert
    from tests.helpers import plain_folder

    shards = str(tmp_path / "s")
    convert(plain_folder(tmp_path / "src", per_class=3), shards, sizes=[128], progress=False)
    common = ["--epochs", "1", "--batch-size", "3", "--device", "cpu", "--num-workers", "0",
              "--log-every", "0", "--schedule", "none"]
    with caplog.at_level(logging.INFO, logger="fastdata"):
        assert main(["-q", "train", shards, "--model", "tiny", *common]) == 0
        assert "crop 64: tiny's default from images stored at 128 px" in caplog.text
        caplog.clear()
        assert main(["-q", "train", shards, "--model", "fastdata.train.models:SmallResNet",
                     *common]) == 0
        assert "crop 128: fastdata.train.models:SmallResNet's default" in caplog.text
        caplog.clear()
        assert main(["-q", "train", shards, "--model", "tiny", "--crop", "32", *common]) == 0
        assert "default from images" not in caplog.text


def test_convert_offers_every_registered_source():
    from fastdata.cli.convert import SOURCE_KINDS
    from fastdata.converters.sources import SOURCES

    assert sorted(SOURCE_KINDS) == sorted(SOURCES)
