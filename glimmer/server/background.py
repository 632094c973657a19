"""Running the server on a background thread: for `glimmer chat` in-process, the tests and the benchmark."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import uvicorn
from fastapi import FastAPI

from glimmer.errors import GlimmerError
from glimmer.server.connection import read_timeout_protocol, server_url, tcp_listener
from glimmer.server.settings import DEFAULT_REQUEST_READ_TIMEOUT_S

logger = logging.getLogger(__name__)


class BackgroundServer:
    """uvicorn serving `app` on `host` from a daemon thread. Port 0 picks a free port; `url` tells which.

    Use as a context manager, or call `start()` and `stop()`. A client that keeps the server waiting for its
    request's bytes longer than `request_read_timeout_s` is disconnected (glimmer/server/connection.py).
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, *, log_level: str = "warning",
                 request_read_timeout_s: float = DEFAULT_REQUEST_READ_TIMEOUT_S):
        self._socket = tcp_listener(host, port)
        self.host = host
        self.port = self._socket.getsockname()[1]
        config = uvicorn.Config(app, log_level=log_level, lifespan="off", timeout_graceful_shutdown=5,
                                http=read_timeout_protocol(request_read_timeout_s))
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._serve, name="glimmer-http", daemon=True)

    @property
    def url(self) -> str:
        return server_url("http", self.host, self.port)

    def _serve(self) -> None:
        asyncio.run(self._server.serve(sockets=[self._socket]))

    def start(self, timeout_s: float = 30.0) -> BackgroundServer:
        """Raises GlimmerError if the server is not accepting requests within `timeout_s`."""
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise GlimmerError(f"the HTTP server did not start on {self.url}")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout_s)
        self._socket.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
