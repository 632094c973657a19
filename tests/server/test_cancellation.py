"""A handler's task cancelled (uvicorn's graceful-shutdown timeout, an ASGI caller such as `glimmer run-batch`) at a
point of its request's life: the cancellation goes on up (never turned into a response), nothing is logged as an
internal error, and the engine's requests are aborted (no KV block, running or waiting request left)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable

import pytest
from server_support import PINNED_DATE, WEATHER_TOOL, live_server

from glimmer.server.streaming import until_disconnect

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "[long] go"}], "max_tokens": 100,
        "chat_template_kwargs": PINNED_DATE, "temperature": 0}
COMPLETION = {"model": "tiny", "prompt": "[long] go", "max_tokens": 100, "temperature": 0}
RESPONSE = {"model": "tiny", "input": "[long] go", "max_output_tokens": 100}
BUSY = ("glimmer_kv_blocks_used", "glimmer_num_requests_running", "glimmer_num_requests_waiting")


@pytest.fixture(scope="module")
def server(make_tiny):
    with live_server(make_tiny(), scripted=True) as live:
        live.engine.engine.runner.add("[long]", " to=user<|message|>" + " ".join(["la"] * 60) + "<|eot|>")
        yield live


async def _call(app, path: str, body: dict, sent: list[dict]) -> None:
    """One POST to the ASGI `app`, from a client that never leaves."""
    data = json.dumps(body).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    messages = [{"type": "http.request", "body": data, "more_body": False}]

    async def receive() -> dict:
        if messages:
            return messages.pop()
        await asyncio.Event().wait()

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)


async def _cancel_once(call, ready, settle_s: float = 0.0, cancelled: Callable[[], object] = lambda: None) -> None:
    """Run `call` as a handler task, cancel it once `ready()` holds (and `settle_s` more seconds passed), call
    `cancelled()`, and check that the cancellation came out of it."""
    handler = asyncio.ensure_future(call)
    while not ready():
        await asyncio.sleep(0.005)
    if settle_s:
        await asyncio.sleep(settle_s)
    handler.cancel()
    cancelled()
    with pytest.raises(asyncio.CancelledError):
        await handler


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/completions", COMPLETION),
    ("/v1/completions", {**COMPLETION, "stream": True}),
    ("/v1/completions", {**COMPLETION, "prompt": ["[long] a", "[long] b"], "n": 2}),
    ("/v1/chat/completions", CHAT),
    ("/v1/chat/completions", {**CHAT, "n": 2, "stream": True}),
    ("/v1/responses", RESPONSE),
    ("/v1/responses", {**RESPONSE, "stream": True}),
    ("/v1/chat/completions", {**CHAT, "tools": [WEATHER_TOOL], "tool_choice": "required"}),
    ("/v1/completions", {**COMPLETION, "response_format": {"type": "json_object"}, "stream": True}),
    ("/v1/completions", {**COMPLETION, "use_beam_search": True, "n": 2, "max_tokens": 4}),
], ids=["completion", "completion-stream", "completion-batch-n2", "chat", "chat-stream-n2", "responses",
        "responses-stream", "chat-tool-choice-required", "completion-json-stream", "completion-beam-search"])
def test_a_handler_cancelled_while_its_first_tokens_are_awaited(server, path, body, caplog, monkeypatch):
    runner = server.engine.engine.runner
    scheduler = server.engine.engine.scheduler
    sent: list[dict] = []
    # its first step ends only once the handler is cancelled (a step of a fixed time, however long, could end
    # first where the machine is slow to run the test's event loop)
    cancelled = threading.Event()
    execute = runner.execute

    def execute_once_cancelled(step):
        cancelled.wait(timeout=60)
        return execute(step)

    monkeypatch.setattr(runner, "execute", execute_once_cancelled)
    try:
        with caplog.at_level(logging.WARNING):
            # admitted; its first step is awaited
            asyncio.run(_cancel_once(_call(server.app, path, body, sent),
                                     lambda: scheduler.running or scheduler.waiting, settle_s=0.05,
                                     cancelled=cancelled.set))
    finally:
        cancelled.set()
    samples = server.wait_for_idle()
    assert {name: value for name, value in samples.items() if value and name.startswith(BUSY)} == {}
    assert server.engine.num_waiting_requests == 0  # the queue-limit slot is free again
    assert [message for message in sent if message["type"] == "http.response.start"] == []
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR] == []


class _LeavingClient:
    """A request whose client leaves once the work has started."""

    def __init__(self, started: asyncio.Event):
        self.started = started

    async def receive(self) -> dict:
        await self.started.wait()
        return {"type": "http.disconnect"}


def test_a_handler_cancelled_while_the_work_of_a_leaving_client_stops_is_cancelled():
    """The client left and its work is stopping (closing its engine streams awaits their cleanup) when the handler is
    cancelled: the cancellation goes on, not the ClientDisconnected meant for the client."""

    ended = []

    async def work(started: asyncio.Event) -> None:
        started.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(0.2)  # its cleanup
            ended.append(True)
            raise

    async def cancel_while_the_work_stops():
        started = asyncio.Event()
        handler = asyncio.ensure_future(until_disconnect(_LeavingClient(started), work(started)))
        await asyncio.sleep(0.1)
        assert started.is_set() and not handler.done()
        handler.cancel()
        with pytest.raises(asyncio.CancelledError):
            await handler
        assert ended  # the work had stopped: its caller may close what it used

    asyncio.run(cancel_while_the_work_stops())


@pytest.mark.parametrize("path,body", [("/v1/completions", {**COMPLETION, "stream": True}),
                                       ("/v1/chat/completions", {**CHAT, "stream": True})],
                         ids=["completion", "chat"])
def test_a_stream_cancelled_after_its_status_line_is_no_success_in_the_metrics(server, path, body):
    """Its `200` went out, but the stream was cut short: /metrics counts it as the 500 it is to its client."""
    runner = server.engine.engine.runner
    sent: list[dict] = []
    key = f'glimmer_requests_total{{endpoint="{path}",status="%s"}}'
    before = server.metrics()

    runner.step_delay_s = 0.05
    try:
        asyncio.run(_cancel_once(_call(server.app, path, body, sent),
                                 lambda: any(message["type"] == "http.response.body" for message in sent)))
    finally:
        runner.step_delay_s = 0.0
    after = server.wait_for_idle()
    assert sent[0]["status"] == 200
    assert after.get(key % 200, 0) == before.get(key % 200, 0)
    assert after[key % 500] == before.get(key % 500, 0) + 1
