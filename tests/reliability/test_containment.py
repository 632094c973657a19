"""Containment: one request's failure or cancellation ends that request, never the engine (issue 8)."""

from __future__ import annotations

import contextlib
import json
import logging
import random
import re
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest
from reliability_support import assert_healthy, chat_body, open_connection, raw_request, send_and_hang_up
from server_support import live_server

from glimmer.engine.grammar import GrammarController, GrammarMasks


@pytest.fixture(scope="module")
def server(make_tiny):
    with live_server(make_tiny()) as live:
        yield live


@contextlib.contextmanager
def long_streams(server, count: int) -> Iterator[list[socket.socket]]:
    """`count` long streaming completions, running (their first event read) until the block ends and hangs up."""
    body = json.dumps({"prompt": "long", "max_tokens": 1500, "ignore_eos": True, "stream": True}).encode()
    connections = []
    try:
        for _ in range(count):
            connection = open_connection(server.url)
            connections.append(connection)
            connection.sendall(raw_request(server.base_url, "/completions", body))
            assert b"200 OK" in connection.recv(4096)
        yield connections
    finally:
        for connection in connections:
            connection.close()


def test_requests_closed_while_queued_never_stop_the_engine(server):
    """The reported race: 4 long completions running, requests closed 0-60 ms after sending. A caller that
    leaves while its request waits to be admitted cancels a future the engine thread then completes."""
    rng = random.Random(8)
    body = json.dumps(chat_body(max_tokens=32)).encode()
    with long_streams(server, 4):
        for _ in range(40):
            send_and_hang_up(server.url, raw_request(server.base_url, "/chat/completions", body),
                             after_s=rng.uniform(0, 0.06))
        assert server.engine.is_alive
    assert_healthy(server)


@pytest.mark.parametrize(("target", "method"), [(GrammarController, "observe"), (GrammarMasks, "fill")])
def test_a_failure_in_one_requests_grammar_ends_that_request_alone(server, monkeypatch, target, method):
    """The grammar engine failing for a constrained request (while filling its mask, or consuming its token)
    ends that request with a 500; a plain request in the same batches runs to the end."""
    def broken(*args, **kwargs):
        raise RuntimeError("grammar broke")

    monkeypatch.setattr(target, method, broken)
    results: dict[str, httpx.Response] = {}

    def plain() -> None:
        results["plain"] = httpx.post(server.base_url + "/completions", timeout=60, json={
            "prompt": "story", "max_tokens": 48, "ignore_eos": True})

    thread = threading.Thread(target=plain)
    thread.start()
    constrained = httpx.post(server.base_url + "/chat/completions", timeout=60, json=chat_body(
        max_tokens=16, response_format={"type": "json_object"}))
    thread.join(60)
    assert constrained.status_code == 500, constrained.text
    assert "internal error while generating" in constrained.json()["error"]["message"]
    assert "grammar broke" not in constrained.text  # the cause stays in the server log
    assert results["plain"].status_code == 200
    assert results["plain"].json()["usage"]["completion_tokens"] == 48
    monkeypatch.undo()
    assert_healthy(server)


def test_a_failing_step_is_logged_naming_the_requests_it_stopped(server, monkeypatch, caplog):
    """An operator finds the failed request's id (`chatcmpl-...`) in the log line, not only a count."""
    runner = server.engine.engine.runner
    real_execute = runner.execute
    failures = iter([True])

    def fail_once(step):
        if next(failures, False):
            raise RuntimeError("device hiccup")
        return real_execute(step)

    monkeypatch.setattr(runner, "execute", fail_once)
    with caplog.at_level(logging.ERROR, logger="glimmer.engine.async_engine"):
        response = httpx.post(server.base_url + "/chat/completions", json=chat_body(), timeout=60)
    assert response.status_code == 500
    [record] = [r for r in caplog.records if r.getMessage().startswith("a step failed")]
    assert re.fullmatch(r"a step failed; stopping its 1 request\(s\): chatcmpl-\S+", record.getMessage())


def test_a_failing_model_step_ends_its_batch_and_the_engine_serves_on(server, monkeypatch):
    runner = server.engine.engine.runner
    real_execute = runner.execute
    failures = iter([True])

    def fail_once(step):
        if next(failures, False):
            raise RuntimeError("device hiccup")
        return real_execute(step)

    monkeypatch.setattr(runner, "execute", fail_once)
    response = httpx.post(server.base_url + "/chat/completions", json=chat_body(), timeout=60)
    assert response.status_code == 500
    assert response.json()["error"]["type"] == "internal_error"
    streamed = httpx.post(server.base_url + "/chat/completions", json=chat_body(stream=True), timeout=60)
    assert streamed.status_code == 200
    assert_healthy(server)
