"""The README's quick-start round trip, run as written with the openai SDK against the real server and the
embedded model: a tool call from the user's words, then an answer that uses the tool's result."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from server_support import live_server

from glimmer.default_model import DEFAULT_MODEL_NAME, default_model_dir

README = Path(__file__).resolve().parents[2] / "README.md"
README_URL = "http://127.0.0.1:8000/v1"


def _round_trip_block() -> str:
    after_marker = README.read_text().split("<!-- round trip -->", 1)[1]
    return after_marker.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_readme_round_trip_prints_what_the_readme_shows():
    code = _round_trip_block()
    shown = [line[2:] for line in code.splitlines() if line.startswith("# ")]
    assert shown[0] == 'get_weather {"city": "Paris"}'
    assert "18" in shown[1] and "light rain" in shown[1]  # the answer uses the tool's result
    printed = io.StringIO()
    with live_server(default_model_dir(), served_model_names=(DEFAULT_MODEL_NAME,)) as server:
        assert README_URL in code
        with contextlib.redirect_stdout(printed):
            exec(compile(code.replace(README_URL, server.base_url), str(README), "exec"), {})
    assert printed.getvalue().splitlines() == shown
