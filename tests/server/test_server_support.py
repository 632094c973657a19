"""The test helpers' own behaviour: `ServeProcess`, the `glimmer serve` subprocess of the server tests and benches."""

from __future__ import annotations

import signal
import subprocess

import pytest
from serve_process import ServeProcess, ServerDidNotStart

# a process that reports ready, then ignores SIGINT and SIGTERM: a server that hangs on shutdown
_HANGS_ON_SHUTDOWN = """
import signal, sys, threading
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ignoring", flush=True)
threading.Event().wait()
"""


def test_stop_kills_and_reaps_a_process_that_does_not_exit_in_time():
    server = ServeProcess(["-c", _HANGS_ON_SHUTDOWN])
    try:
        while "ignoring" not in server.output:
            assert server.process.poll() is None, server.output
            server._reader.join(0.05)
        with pytest.raises(subprocess.TimeoutExpired):
            server.stop(signal.SIGTERM, timeout_s=0.5)
        assert server.process.returncode == -signal.SIGKILL  # killed and reaped before the error came
    finally:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()



@pytest.mark.parametrize(("printed", "reason"), [
    ("no model here", "reported no URL"),
    ("OpenAI-compatible API at http://127.0.0.1:9/v1 (a report); then gone", "exited with status 0"),
])
def test_a_process_that_exits_before_serving_did_not_start_with_its_output(printed, reason):
    server = ServeProcess(["-c", f"print({printed!r})"])
    with pytest.raises(ServerDidNotStart, match=reason) as raised:
        server.wait_until_serving(timeout_s=60)
    assert printed in raised.value.output
    server.stop()
