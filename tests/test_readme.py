"""The README runs as written: its test command is what CI runs, and every ```python block executes.

Blocks are found generically, so new ones are covered as they are added. They run in README order in one
shared namespace (a later example may use an earlier one's `llm` or `tools`), with two stand-ins:
`/path/to/Muse-Glimmer-30B` is a tiny random checkpoint (the embedded default's recipe, with a vision tower
so the image and video examples run), `/path/to/Muse-Glimmer-30B-assistant` a tiny random DFlash drafter for it
(block 16, as the release's), and `http://127.0.0.1:8000` is a live server of it, serving the
README's model name `muse-glimmer` with the API key in `GLIMMER_API_KEY`. A block that truly cannot run here
(it needs a GPU or a real model) is marked by an HTML comment on the line before its fence:
`<!-- readme-test: skip REASON -->`; the test reports it as skipped with that reason.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MODEL_PATH = "/path/to/Muse-Glimmer-30B"
DRAFTER_PATH = "/path/to/Muse-Glimmer-30B-assistant"
SERVER_URL = "http://127.0.0.1:8000"
API_KEY = "readme-key"
_BLOCK = re.compile(r"(?:<!--\s*readme-test:\s*skip\s*(?P<reason>[^>]*?)\s*-->\s*\n)?```python\n(?P<code>.*?)^```",
                    re.S | re.M)


def _readme_test_command() -> str:
    lines = README.read_text().splitlines()
    marker = lines.index("# the test suite")
    return lines[marker + 1].strip()


def test_ci_runs_the_readme_test_command():
    command = _readme_test_command()
    assert "pytest" in command
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert command in ci_lines


def python_blocks() -> list[tuple[int, str, str | None]]:
    """(line of the fence, code, skip reason or None) for each ```python block, in order."""
    text = README.read_text()
    return [(text.count("\n", 0, match.start("code")), match.group("code"), match.group("reason"))
            for match in _BLOCK.finditer(text)]


def test_python_blocks_are_found():
    blocks = python_blocks()
    assert len(blocks) >= 6 and all(code.strip() for _, code, _ in blocks)


@pytest.fixture(scope="module")
def namespace(make_tiny, monkeypatch_module, tmp_path_factory):
    from glimmer.engine.async_engine import AsyncEngine
    from glimmer.engine.llm_engine import EngineConfig
    from glimmer.server.app import create_app
    from glimmer.server.background import BackgroundServer
    from glimmer.server.settings import ServerSettings
    from glimmer.tiny import TinyDrafterSpec, write_tiny_drafter

    checkpoint = make_tiny(vision=True)
    drafter = write_tiny_drafter(tmp_path_factory.mktemp("readme-drafter"), checkpoint,
                                 spec=TinyDrafterSpec(block_size=16))
    monkeypatch_module.setenv("GLIMMER_API_KEY", API_KEY)
    engine = AsyncEngine(EngineConfig(model=str(checkpoint), progress=False, kv_cache_memory=32 << 20))
    app = create_app(engine, ServerSettings(served_model_names=("muse-glimmer",), api_key=API_KEY))
    try:
        with BackgroundServer(app) as server:
            yield {"__name__": "readme", "_checkpoint": str(checkpoint), "_drafter": str(drafter),
                   "_url": server.url}
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.mark.parametrize(("line", "code", "skip_reason"), python_blocks(), ids=lambda v: f"line{v}"
                         if isinstance(v, int) else "")
def test_readme_python_block_runs(namespace, line, code, skip_reason):
    if skip_reason is not None:
        pytest.skip(f"README.md:{line}: {skip_reason}")
    code = code.replace(DRAFTER_PATH, namespace["_drafter"]).replace(MODEL_PATH, namespace["_checkpoint"])
    code = code.replace(SERVER_URL, namespace["_url"])
    exec(compile(code, f"README.md:{line}", "exec"), namespace)  # noqa: S102 - the README's own examples
