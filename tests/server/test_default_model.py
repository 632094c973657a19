"""The embedded default model: written once into the user cache, atomically, then reused."""

from __future__ import annotations

from glimmer.checkpoint.resolve import resolve_checkpoint
from glimmer.default_model import DEFAULT_MODEL_NAME, cache_dir, default_model_dir


def test_the_cache_dir_follows_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "glimmer"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "glimmer"


def test_the_default_model_is_written_once_and_reused(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = default_model_dir()
    assert path.name == DEFAULT_MODEL_NAME and path.is_relative_to(tmp_path / "glimmer")
    assert {"config.json", "tokenizer.json", "chat_template.jinja", "generation_config.json"} <= {
        p.name for p in path.iterdir()}
    assert resolve_checkpoint(str(path)) == path
    stamp = (path / "config.json").stat().st_mtime_ns
    assert default_model_dir() == path
    assert (path / "config.json").stat().st_mtime_ns == stamp
    assert [p.name for p in path.parent.iterdir()] == [DEFAULT_MODEL_NAME]  # no temporary directory left behind
