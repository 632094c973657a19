"""Shutting the server down while requests run: the first shutdown signal stops the engine's requests, so open
streams end with an error event and `[DONE]` and waiting non-streamed requests get a 503 body, instead of
generating on until the server stops waiting and cuts them (truncated chunked bodies, plain-text 500s)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from server_support import live_server

from glimmer.cancellation import Cancelled
from glimmer.engine.async_engine import _call_soon

LONG = {"model": "tiny", "messages": [{"role": "user", "content": "go"}], "max_tokens": 1900, "ignore_eos": True,
        "temperature": 0}


def _wait_until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_stopping_ends_open_streams_with_an_error_event_and_waiting_requests_with_503(make_tiny):
    with live_server(make_tiny()) as server, ThreadPoolExecutor(1) as pool:
        url = server.base_url + "/chat/completions"
        whole = pool.submit(httpx.post, url, json=LONG, timeout=60)
        with httpx.stream("POST", url, json={**LONG, "stream": True}, timeout=60) as stream:
            lines = stream.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert json.loads(first[6:])["choices"]
            _wait_until(lambda: len(server.engine.engine.scheduler.running) == 2)
            server.engine.stop_serving("shutting down for the test")
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        error = json.loads(rest[-2][6:])["error"]
        assert error["code"] == "shutting_down" and "shutting down for the test" in error["message"]
        response = whole.result()
        assert response.status_code == 503 and response.json()["error"]["code"] == "shutting_down"
        refused = httpx.post(url, json={**LONG, "max_tokens": 2}, timeout=30)
        assert refused.status_code == 503 and refused.json()["error"]["type"] == "service_unavailable"
        _wait_until(lambda: not server.engine.engine.has_unfinished_requests)
        assert server.engine.is_alive and server.engine.failure is None


def test_output_for_a_closed_event_loop_is_dropped_not_fatal():
    """A forced quit closes the server's event loop while the engine thread still delivers: that used to raise
    in the engine thread, which then reported an internal error and exited 1."""
    loop = asyncio.new_event_loop()
    loop.close()
    _call_soon(loop, print, "never delivered")


def test_a_responses_stream_stopped_by_shutdown_reports_the_code_and_keeps_its_output(make_tiny):
    """Audit: the `error` event said `service_unavailable` where chat and completions streams say `shutting_down`,
    and `response.failed` listed no output although items had been streamed."""
    body = {"model": "tiny", "input": "go", "max_output_tokens": 1900, "temperature": 0, "stream": True}
    with live_server(make_tiny()) as server:
        with httpx.stream("POST", server.base_url + "/responses", json=body, timeout=60) as stream:
            events = []
            for line in stream.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
                    if events[-1]["type"] == "response.output_item.added":
                        server.engine.stop_serving("shutting down for the test")
        kinds = [event["type"] for event in events]
        assert kinds[-2:] == ["error", "response.failed"]
        assert events[-2]["code"] == "shutting_down" and "shutting down for the test" in events[-2]["message"]
        added = [event["item"]["id"] for event in events if event["type"] == "response.output_item.added"]
        failed = events[-1]["response"]
        assert failed["status"] == "failed" and [item["id"] for item in failed["output"]] == added


def test_a_request_still_uploading_when_the_server_stops_gets_a_503_not_a_cut(make_tiny):
    """Soak: a client whose upload stalled when the server began shutting down had its request cut when uvicorn's
    grace period ended: a plain-text 500 and an 'Exception in ASGI application' traceback in the log."""
    body = json.dumps({**LONG, "stream": True}).encode()
    with live_server(make_tiny()) as server, socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])),
                                                                      timeout=10) as connection:
        connection.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n" % len(body) + body[:len(body) // 2])
        server.engine.stop_serving("shutting down for the test")
        response = b""
        while b"\r\n\r\n" not in response or not response.rstrip().endswith(b"}"):
            chunk = connection.recv(65536)
            assert chunk, response
            response += chunk
    status_line, _, rest = response.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 503 Service Unavailable"
    error = json.loads(rest.partition(b"\r\n\r\n")[2])["error"]
    assert error["code"] == "shutting_down" and "shutting down for the test" in error["message"]


def test_a_request_still_preparing_its_prompt_when_the_server_stops_gets_a_503_at_once(make_tiny, monkeypatch):
    """A prompt still being prepared (an image URL that answers slowly: fetches may take 10 s) when the server began
    shutting down went on until it was ready, past uvicorn's grace period (5 s), whose cancellation cut the request
    with a plain-text 500 and a logged traceback; its work is stopped and it gets the 503 of a waiting request."""
    import glimmer.server.chat as chat
    build = chat.build_chat_prompt
    started, stopped = [], threading.Event()

    def slow_build(request, context, cancel, turn=None):
        started.append(True)
        try:
            for _ in range(300):  # a slow download (15 s at the least), which checks `cancel` between its chunks
                cancel.check()
                time.sleep(0.05)
        except Cancelled:
            stopped.set()
            raise
        return build(request, context, cancel, turn)

    monkeypatch.setattr(chat, "build_chat_prompt", slow_build)
    with live_server(make_tiny()) as server, ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(httpx.post, server.base_url + "/chat/completions", json={**LONG, "max_tokens": 2},
                              timeout=60)
        _wait_until(lambda: started)
        stopped_at = time.monotonic()
        server.engine.stop_serving("shutting down for the test")
        response = waiting.result()
        assert time.monotonic() - stopped_at < 10  # at once (a tenth of a second), not after the download
        assert stopped.wait(timeout=10)  # its work was stopped, not left to run on
    assert response.status_code == 503 and response.json()["error"]["code"] == "shutting_down"
