"""If the engine thread dies anyway, `glimmer serve` exits non-zero instead of lingering (issue 8)."""

from __future__ import annotations

import signal

import httpx
from reliability_support import chat_body
from serve_process import ServeProcess

# `glimmer serve` whose model fails on every step (as a device stuck after a CUDA error would)
_BROKEN_SERVE = """
import sys
from glimmer.cli import main
from glimmer.engine.model_runner import ModelRunner

def fail(self, step):
    raise RuntimeError("the device is gone")

ModelRunner.execute = fail
sys.exit(main(sys.argv[1:]))
"""


def test_serve_exits_non_zero_when_the_engine_thread_dies(make_tiny):
    server = ServeProcess(["-c", _BROKEN_SERVE, "serve", str(make_tiny()), "--max-model-len", "512",
                           "--kv-cache-memory", "16MiB", "--served-model-name", "tiny"])
    try:
        url = server.wait_until_serving()
        statuses = [httpx.post(url + "/v1/chat/completions", json=chat_body(), timeout=30).status_code
                    for _ in range(3)]  # each failing step ends its request; the third in a row is fatal
        assert statuses == [500, 500, 500]
        server.process.wait(timeout=30)
    finally:
        output = server.stop(signal.SIGKILL)
    assert server.process.returncode == 1, output
    assert "exiting so that a supervisor can restart the server" in output
