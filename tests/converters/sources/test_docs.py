"""The "Bringing your data" page's commands and Python, run as written on the inputs it names
(made here from a few photos), its bucket a real S3 server (moto's)."""
from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile

import numpy as np
import pytest

from tests.helpers import REPO, s3_server, source_forms

PAGE = os.path.join(REPO, "docs", "sources.md")


def blocks(lang: str) -> list[str]:
    with open(PAGE, encoding="utf-8") as f:
        return re.findall(rf"```{lang}\n(.*?)```", f.read(), re.S)


def commands() -> list[str]:
    """The page's ``fastdata`` command lines, their comments cut."""
    return [line.split("  #")[0].strip() for block in blocks("bash")
            for line in block.splitlines() if line.startswith("fastdata ")]


def _inputs(root: str) -> None:
    """The files the page's examples name, in ``root``."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    forms = source_forms(os.path.join(root, "made"), per_class=3)
    shutil.copytree(forms["hf"][0], os.path.join(root, "hf_dataset"))
    shutil.copytree(forms["hf-dict"][0], os.path.join(root, "hf_dict"))
    shutil.copytree(forms["hub"][0], os.path.join(root, "hub"))
    shutil.copy(forms["parquet"][0], os.path.join(root, "data.parquet"))
    table = pq.read_table(forms["parquet"][0])
    pq.write_table(pa.table({"photo": table.column("image"), "tags": [
        "a|b" if k % 2 else "b" for k in range(table.num_rows)]}),
        os.path.join(root, "table.parquet"))
    os.makedirs(os.path.join(root, "shards"))
    images = table.column("image").to_pylist()
    for t in range(4):
        with tarfile.open(os.path.join(root, "shards", f"shard-{t:06d}.tar"), "w") as tf:
            for k in range(t * 6, t * 6 + 6):
                npy = io.BytesIO()
                np.save(npy, np.full(4, k, np.float32))
                for ext, data in (("jpg", images[k % 9]), ("cls", str(k % 3).encode()),
                                  ("txt", f"photo {k}".encode()), ("npy", npy.getvalue())):
                    info = tarfile.TarInfo(f"{k:06d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))


def test_the_page_has_its_examples():
    assert len(commands()) >= 10 and blocks("python")
    assert any("s3://" in c for c in commands())


def test_the_pages_commands_and_python_run_as_written(tmp_path):
    pytest.importorskip("obstore", reason="obstore not installed")
    _inputs(str(tmp_path))
    env = {**os.environ, "FASTDATA_CACHE": str(tmp_path / "cache")}
    with s3_server("my-bucket") as s3:
        env.update({k: v for k, v in os.environ.items() if k.startswith("AWS_")})
        for name in sorted(os.listdir(tmp_path / "shards")):
            s3.upload_file(str(tmp_path / "shards" / name), "my-bucket", f"shards/{name}")
        s3.upload_file(str(tmp_path / "data.parquet"), "my-bucket", "tables/data.parquet")
        for line in commands():
            r = subprocess.run([sys.executable, "-m", "fastdata.cli", "-q",
                                *shlex.split(line)[1:]], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=240)
            assert r.returncode == 0, (line, r.stderr)
        for code in blocks("python"):
            r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=240)
            assert r.returncode == 0, (code, r.stderr)
        up = json.loads(s3.get_object(Bucket="my-bucket", Key="sets/wds/manifest.json")[
            "Body"].read())
        assert up["num_samples"] == 24
    counts = {name: json.loads((tmp_path / name / "manifest.json").read_text())["num_samples"]
              for name in ("out-hf", "out-train", "out-test", "out-hub", "out-pq", "out-named",
                           "out-wds", "out-all", "out-from-s3", "out-py", "out-py-wds")}
    assert counts == {"out-hf": 9, "out-train": 9, "out-test": 3, "out-hub": 9, "out-pq": 9,
                      "out-named": 9, "out-wds": 24, "out-all": 24, "out-from-s3": 9,
                      "out-py": 9, "out-py-wds": 24}
    fields = json.loads((tmp_path / "out-all" / "manifest.json").read_text())["fields"]
    assert {f["name"]: f["kind"] for f in fields} == {"txt": "text", "npy": "array"}
