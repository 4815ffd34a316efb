"""The package's name on the index, and the install hints that name it: "fastdata" there is
another project, so no text and no error message may tell a user to install it."""
from __future__ import annotations

import re
import subprocess
from importlib import metadata

import pytest

from fastdata import _optional
from tests.helpers import REPO

# an install command or an extra that names the other project's distribution
OTHER = re.compile(r"(?<![\w-])fastdata\[|pip install\s+['\"]?fastdata(?![\w-])")


def test_the_distribution_has_a_name_of_its_own_and_is_the_one_installed():
    with open(f"{REPO}/pyproject.toml") as f:      # tomllib is Python 3.11's
        name = re.search(r'^name = "(.+)"$', f.read(), re.MULTILINE).group(1)
    assert name == _optional.DISTRIBUTION != "fastdata"
    assert metadata.distribution(name).read_text("entry_points.txt")


def test_no_text_in_the_repository_tells_users_to_install_the_other_project():
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    found = []
    # what earlier versions printed, kept as the record of a measurement, is left as it was
    recorded = re.compile(r"^benchmarks/results/")
    for name in files:
        if recorded.match(name):
            continue
        if not name.endswith((".py", ".md", ".toml", ".sh", ".yml", ".cfg", ".txt")) and \
                "/" in name and "." in name.rsplit("/", 1)[1]:
            continue
        try:
            with open(f"{REPO}/{name}", encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
            continue
        found += [f"{name}: {m.group(0)}" for m in OTHER.finditer(text)]
    assert not found, found


@pytest.mark.parametrize("extra", ["dali", "plot", "lightning", "ray"])
def test_a_missing_extra_names_this_distribution(monkeypatch, extra):
    monkeypatch.setitem(_optional.EXTRAS, "fastdata_no_such_module", (extra, "it"))
    with pytest.raises(ImportError) as e:
        _optional.require("fastdata_no_such_module", "a feature")
    assert f"pip install '{_optional.DISTRIBUTION}[{extra}]'" in str(e.value)
    assert not OTHER.search(str(e.value))
