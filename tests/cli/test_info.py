"""``fastdata info --env``: what the environment lacks is named with its fix."""
from __future__ import annotations

import fastdata.env
from fastdata.cli import main


def test_env_names_what_is_missing_and_how_to_get_it(monkeypatch, capsys):
    real = fastdata.env.env_info()
    monkeypatch.setattr(fastdata.env, "env_info", lambda: {**real, "webp": False, "dali": None})
    assert main(["info", "--env"]) == 0
    out = capsys.readouterr().out
    assert "reads no WebP" in out and "libwebp" in out
    assert "DALI is not installed" in out and "pip install 'fastdata-shards[dali]'" in out
    monkeypatch.setattr(fastdata.env, "env_info", lambda: {**real, "webp": True,
                                                           "dali": "2.4.0"})
    assert main(["info", "--env"]) == 0
    out = capsys.readouterr().out
    assert "WebP" not in out and "DALI is not installed" not in out
