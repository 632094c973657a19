"""The embedded default model: written once into the user cache, atomically, then reused."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import glimmer
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


def test_a_first_start_killed_while_writing_leaves_nothing_behind_after_the_next(monkeypatch, tmp_path):
    """Issue 8: the temporary directory of an interrupted first start used to stay in the cache forever."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    version_dir = tmp_path / "glimmer" / glimmer.__version__
    orphan = version_dir / f".{DEFAULT_MODEL_NAME}-k1lled"
    orphan.mkdir(parents=True)
    (orphan / "model.safetensors").write_bytes(b"half written")
    path = default_model_dir()
    assert [p.name for p in version_dir.iterdir()] == [DEFAULT_MODEL_NAME]
    assert resolve_checkpoint(str(path)) == path


def test_concurrent_first_starts_write_the_model_once(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with ThreadPoolExecutor(3) as pool:
        paths = list(pool.map(lambda _: default_model_dir(), range(3)))
    assert len(set(paths)) == 1
    assert [p.name for p in paths[0].parent.iterdir()] == [DEFAULT_MODEL_NAME]
