"""If the engine thread dies anyway, `glimmer serve` exits non-zero instead of lingering (issue 8)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx
from reliability_support import chat_body

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


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_serving(process: subprocess.Popen, url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert process.poll() is None, process.communicate()[0]
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.2)


def test_serve_exits_non_zero_when_the_engine_thread_dies(make_tiny):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen([sys.executable, "-c", _BROKEN_SERVE, "serve", str(make_tiny()), "--port", str(port),
                                "--max-model-len", "512", "--kv-cache-memory", "16MiB", "--served-model-name", "tiny"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until_serving(process, url)
        statuses = [httpx.post(url + "/v1/chat/completions", json=chat_body(), timeout=30).status_code
                    for _ in range(3)]  # each failing step ends its request; the third in a row is fatal
        assert statuses == [500, 500, 500]
        output = process.communicate(timeout=30)[0]
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 1, output
    assert "exiting so that a supervisor can restart the server" in output
