"""`glimmer serve` in a subprocess (`ServeProcess`), the wait for its /health (`wait_for_health`) and a free loopback
port (`free_port`): the server tests' and the benches' way to run a server. Standard library and httpx only, so that
a pure HTTP client such as `bench/soak.py --url` imports neither torch nor the server stack; `server_support`
re-exports these names.
"""

from __future__ import annotations

import contextlib
import os
import pty
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import httpx


def free_port() -> int:
    """A loopback port free now, for a server that cannot report the one it bound (another process may take it
    before the server binds it: `ServeProcess`, which binds port 0, is the way where the server's output is read)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServerDidNotStart(RuntimeError):
    """The server exited, or was not serving in its time: `reason` says which, `output` holds what it wrote where
    that was read ("" if not)."""

    def __init__(self, reason: str, output: str = ""):
        super().__init__(f"{reason}:\n{output}" if output else reason)
        self.reason = reason
        self.output = output


def wait_for_health(process: subprocess.Popen, url: str, timeout_s: float = 120, *,
                    verify: ssl.SSLContext | bool = True) -> None:
    """Returns once `url`/health answers 200; ServerDidNotStart if `process` exits first or it does not by
    `timeout_s` (imports alone can take a minute on a loaded machine)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise ServerDidNotStart(f"the server exited with status {process.returncode}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url + "/health", timeout=1, verify=verify).status_code == 200:
                return
        if time.monotonic() >= deadline:
            raise ServerDidNotStart(f"{url}/health did not answer 200 within {timeout_s} s")
        time.sleep(0.2)


_REPORTED_URL = re.compile(rb"OpenAI-compatible API at (\S+)/v1 ")


class ServeProcess:
    """`python ARGV --port 0` (a `glimmer serve` command line, e.g. `["-m", "glimmer.cli", "serve", MODEL]`) in a
    subprocess: the system picks a free port as the server binds it, so no other process can take it between a
    pick and the bind, and `wait_until_serving` reads the URL the server reports. A thread collects the output (its
    stdout and stderr together) as it comes, so that a full pipe never stalls the server; `on_terminal` gives the
    process a pseudo-terminal to write to instead of a pipe."""

    def __init__(self, argv: list[str], *, env: dict[str, str] | None = None, on_terminal: bool = False,
                 preexec_fn: Callable[[], None] | None = None):
        reading, writing = pty.openpty() if on_terminal else os.pipe()
        try:
            self.process = subprocess.Popen([sys.executable, *argv, "--port", "0"], stdin=subprocess.DEVNULL,
                                            stdout=writing, stderr=writing, env=env, preexec_fn=preexec_fn)
        except BaseException:
            os.close(reading)
            raise
        finally:
            os.close(writing)
        self._output = bytearray()  # what the process wrote, as it comes
        self._url: str | None = None
        self._reported = threading.Event()  # the URL was read, or the output ended without it
        self._reader = threading.Thread(target=self._read, args=(reading,), daemon=True)
        self._reader.start()

    def _read(self, reading: int) -> None:
        try:
            with contextlib.suppress(OSError):  # a pseudo-terminal's EIO once the process has closed its end
                while chunk := os.read(reading, 65536):
                    self._output += chunk
                    if self._url is None and (reported := _REPORTED_URL.search(self._output)):
                        self._url = reported[1].decode()
                        self._reported.set()
        finally:
            os.close(reading)
            self._reported.set()

    @property
    def output(self) -> str:
        """What the process has written so far."""
        return self._output.decode(errors="replace")

    def wait_until_serving(self, timeout_s: float = 120, *, verify: ssl.SSLContext | bool = True) -> str:
        """The URL the server reports (`http://127.0.0.1:PORT`, https with --ssl-keyfile), once its /health answers
        200; ServerDidNotStart, with its output, if it exits first or is not serving by `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        reported = self._reported.wait(timeout_s)
        if not reported or self._url is None:
            raise ServerDidNotStart("the server reported no URL", self.output)
        try:
            wait_for_health(self.process, self._url, deadline - time.monotonic(), verify=verify)
        except ServerDidNotStart as error:
            raise ServerDidNotStart(error.reason, self.output) from None
        return self._url

    def stop(self, stop_signal: int = signal.SIGINT, timeout_s: float = 60) -> str:
        """Sends `stop_signal` unless the process has exited, waits for it to exit; returns all it wrote.
        subprocess.TimeoutExpired if it has not exited by `timeout_s`, once it is killed and reaped: a server that
        hangs on shutdown does not outlive its test."""
        if self.process.poll() is None:
            self.process.send_signal(stop_signal)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise
        self._reader.join(timeout_s)
        return self.output
