"""Helpers of the reliability tests: raw HTTP over a socket (to hang up at a chosen moment) and the checks
that a server came through an attack unharmed."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit

import httpx
from server_support import PINNED_DATE, LiveServer

IDLE_GAUGES = ("glimmer_num_requests_running", "glimmer_num_requests_waiting", 'glimmer_kv_blocks_used{group="full"}',
               'glimmer_kv_blocks_used{group="sliding"}')


def chat_body(**fields) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "chat_template_kwargs": PINNED_DATE, **fields}


def raw_request(url: str, path: str, body: bytes, *, content_type: str = "application/json",
                declared_length: int | None = None, headers: dict[str, str] | None = None) -> bytes:
    """The bytes of an HTTP/1.1 POST (`declared_length` may claim more body than `body` holds)."""
    parts = urlsplit(url)
    lines = [f"POST {parts.path}{path} HTTP/1.1", f"Host: {parts.netloc}", f"Content-Type: {content_type}",
             f"Content-Length: {len(body) if declared_length is None else declared_length}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def open_connection(url: str) -> socket.socket:
    parts = urlsplit(url)
    return socket.create_connection((parts.hostname, parts.port), timeout=30)


def send_and_hang_up(url: str, request: bytes, *, after_s: float, read_first: int = 0) -> None:
    """Send `request`, wait `after_s` (reading up to `read_first` response bytes first), then close the socket."""
    with open_connection(url) as connection:
        connection.sendall(request)
        received = 0
        while received < read_first:
            chunk = connection.recv(4096)
            if not chunk:
                break
            received += len(chunk)
        time.sleep(after_s)


def assert_healthy(server: LiveServer, timeout_s: float = 30.0) -> dict[str, float]:
    """The engine lives, /health is 200, nothing runs, waits or holds a KV block, and a new request works."""
    assert server.engine.is_alive
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    samples = server.wait_for_idle(timeout_s)
    for gauge in IDLE_GAUGES:
        assert samples.get(gauge, 0) == 0, (gauge, samples.get(gauge))
    response = httpx.post(server.base_url + "/chat/completions", json=chat_body(), timeout=60)
    assert response.status_code == 200, response.text
    return samples


def sse_events(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
