"""A client slower than the engine: its stream carries the same reply in fewer chunks (glimmer/server/choice_stream.py
`coalesced`). The app is driven through ASGI with a `send` that waits, which is what a client that reads slowly is to
the server (its writes wait for the socket to drain); the network is scripted, everything above it is real."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from server_support import PINNED_DATE, agent_server

from glimmer.engine.sampler import TokenLogprobs
from glimmer.protocol.deltas import ToolCallDelta
from glimmer.server.choice_stream import Released, coalesced

_WORDS = " ".join(f"word{i}" for i in range(60))
SCRIPTS = {
    "[long-answer]": f" to=self<|message|>Thinking {_WORDS}.<|eom|><|start|>assistant to=user<|message|>"
                     f"Answer {_WORDS}.<|eot|>",
    "[long-call]": " to=self<|message|>I call it.<|eom|><|start|>assistant to=record<|message|>"
                   "<atem:function_calls>\n<atem:invoke name=\"record\">\n"
                   + "".join(f"<atem:parameter name=\"p{i}\">value {i}</atem:parameter>\n" for i in range(16))
                   + "</atem:invoke>\n</atem:function_calls><|eot|>",
}
RECORD_TOOL = {"type": "function", "function": {"name": "record", "parameters": {
    "type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(16)}}}}
DELAY_S = 0.05  # each chunk's write waits this long, as for a client reading slowly


@pytest.fixture(scope="module")
def server(make_tiny):
    with agent_server(make_tiny()) as live:
        for key, transcript in SCRIPTS.items():
            live.engine.engine.runner.add(key, transcript)
        yield live


async def _request(app: Any, path: str, body: dict[str, Any], delay_s: float) -> bytes:
    """POST `body` to the ASGI `app`; each body message's send waits `delay_s` before the next can be written."""
    received = False
    finished = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal received
        if not received:
            received = True
            return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}
        await finished.wait()
        return {"type": "http.disconnect"}

    parts: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            assert message["status"] == 200
        elif message["type"] == "http.response.body":
            parts.append(message.get("body", b""))
            if message.get("more_body"):
                await asyncio.sleep(delay_s)
            else:
                finished.set()

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"host", b"test")],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    await app(scope, receive, send)
    return b"".join(parts)


def _events(raw: bytes) -> list[dict[str, Any]]:
    data = [line[len("data: "):] for line in raw.decode().splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]" or not data[-1].startswith("[")
    return [json.loads(item) for item in data if item != "[DONE]"]


def _chat(server, key: str, *, stream: bool, delay_s: float = 0.0, **fields: Any) -> Any:
    body = {"model": "tiny", "messages": [{"role": "user", "content": key}], "temperature": 0, "stream": stream,
            "chat_template_kwargs": PINNED_DATE, **fields}
    raw = asyncio.run(_request(server.app, "/v1/chat/completions", body, delay_s))
    return _events(raw) if stream else json.loads(raw)


def _joined_stream(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    reasoning, content, logprobs, calls = "", "", [], {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            reasoning += delta.get("reasoning_content") or ""
            content += delta.get("content") or ""
            logprobs += (choice.get("logprobs") or {}).get("content") or []
            for call in delta.get("tool_calls") or []:
                entry = calls.setdefault(call["index"], {"name": None, "arguments": ""})
                entry["name"] = entry["name"] or call["function"].get("name")
                entry["arguments"] += call["function"]["arguments"]
    return {"reasoning": reasoning, "content": content, "logprobs": logprobs, "calls": list(calls.values())}


def _chunks_with(chunks: list[dict[str, Any]], field: str) -> int:
    return sum(1 for chunk in chunks for choice in chunk["choices"] if choice["delta"].get(field))


def test_a_slow_readers_chat_stream_is_the_whole_reply_in_fewer_chunks(server):
    whole = _chat(server, "[long-answer]", stream=False, logprobs=True, top_logprobs=1)
    fast = _chat(server, "[long-answer]", stream=True, logprobs=True, top_logprobs=1)
    slow = _chat(server, "[long-answer]", stream=True, delay_s=DELAY_S, logprobs=True, top_logprobs=1)
    message = whole["choices"][0]["message"]
    assert message["content"] == f"Answer {_WORDS}." and message["reasoning_content"] == f"Thinking {_WORDS}."
    for chunks in (fast, slow):  # P-API-4: the same reply whatever the reader's pace
        joined = _joined_stream(chunks)
        assert (joined["reasoning"], joined["content"]) == (message["reasoning_content"], message["content"])
        assert joined["logprobs"] == whole["choices"][0]["logprobs"]["content"]
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    # a slow reader gets the tokens that queued up for it a run at a time, not a chunk a token (with 50 ms a write the
    # tokens come faster than that; a fast reader's count depends on the machine's load, so it is not compared)
    assert len(whole["choices"][0]["logprobs"]["content"]) > 120
    assert _chunks_with(slow, "content") < 20 and _chunks_with(slow, "reasoning_content") < 20
    for chunk in slow:  # each chunk's entries spell its own text
        for choice in chunk["choices"]:
            entries = (choice.get("logprobs") or {}).get("content") or []
            assert b"".join(bytes(entry["bytes"]) for entry in entries).decode() == (choice["delta"].get("content")
                                                                                   or "")


def test_a_slow_readers_tool_call_arguments_come_in_fewer_fragments(server):
    tools = [RECORD_TOOL]
    whole = _chat(server, "[long-call]", stream=False, tools=tools)
    slow = _chat(server, "[long-call]", stream=True, delay_s=DELAY_S, tools=tools)
    fast = _chat(server, "[long-call]", stream=True, tools=tools)
    (call,) = whole["choices"][0]["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {f"p{i}": f"value {i}" for i in range(16)}
    for chunks in (fast, slow):
        assert _joined_stream(chunks)["calls"] == [{"name": "record", "arguments": call["function"]["arguments"]}]
        assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert _chunks_with(slow, "tool_calls") < 18 / 3  # a start, 16 parameters and the close apart (P-ATEM-4)


def test_a_slow_readers_responses_stream_is_the_whole_response_in_fewer_deltas(server):
    body = {"model": "tiny", "input": "[long-answer]", "temperature": 0, "stream": True, **{
        "chat_template_kwargs": PINNED_DATE}, "include": ["message.output_text.logprobs"],
        "reasoning": {"summary": "auto"}}

    def deltas(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
        return [event for event in events if event["type"] == kind]

    fast = _events(asyncio.run(_request(server.app, "/v1/responses", body, 0.0)))
    slow = _events(asyncio.run(_request(server.app, "/v1/responses", body, DELAY_S)))
    assert fast[-1]["type"] == slow[-1]["type"] == "response.completed"
    assert slow[-1]["response"]["output"] == [
        {**item, "id": slow_item["id"]} for item, slow_item in zip(fast[-1]["response"]["output"],
                                                                   slow[-1]["response"]["output"], strict=True)]
    for kind in ("response.output_text.delta", "response.reasoning_text.delta",
                 "response.reasoning_summary_text.delta"):
        assert len(deltas(slow, kind)) < 20  # each of about 300 tokens a delta of its own before
    text = "".join(event["delta"] for event in deltas(slow, "response.output_text.delta"))
    assert text == f"Answer {_WORDS}."
    assert [entry for event in deltas(slow, "response.output_text.delta") for entry in event["logprobs"]] == \
        slow[-1]["response"]["output"][-1]["content"][0]["logprobs"]
    assert [event["sequence_number"] for event in slow] == list(range(len(slow)))


def _lp(token_id: int) -> TokenLogprobs:
    return TokenLogprobs(token_id, -0.5, {})


def test_coalesced_joins_runs_of_one_kind_and_keeps_each_entry_with_its_text():
    start = ToolCallDelta(0, "call_1", "f", '{"a"')
    released = [
        Released([("reasoning", "Let ")], []), Released([("reasoning", "me")], []),
        Released([("reasoning", "."), ("content", "Hi")], [_lp(1)]),
        Released([("content", " there")], [_lp(2)]),
        Released([], [_lp(3)]),  # decided, its text held back (a possible stop string)
        Released([("content", " S")], [_lp(4)]),
        Released([("tool_call", start)], []), Released([("tool_call", ToolCallDelta(0, None, None, ": 1}"))], []),
        Released([("tool_call", ToolCallDelta(1, "call_2", "g", "{"))], []),
        Released([("tool_call", ToolCallDelta(1, None, None, "}"))], []),
    ]
    assert coalesced(released) == [
        Released([("reasoning", "Let me.")], []),
        Released([("content", "Hi there")], [_lp(1), _lp(2)]),
        Released([("content", " S")], [_lp(3), _lp(4)]),
        Released([("tool_call", ToolCallDelta(0, "call_1", "f", '{"a": 1}'))], []),
        Released([("tool_call", ToolCallDelta(1, "call_2", "g", "{}"))], []),
    ]


def test_coalesced_keeps_held_entries_apart_when_no_answer_text_follows_and_one_token_as_it_was():
    held = Released([], [_lp(2)])
    assert coalesced([Released([("content", "Hi")], [_lp(1)]), held]) == [Released([("content", "Hi")], [_lp(1)]),
                                                                          held]
    assert coalesced([held, Released([("reasoning", "x")], [])]) == [held, Released([("reasoning", "x")], [])]
    one = [Released([("content", "Hi")], [_lp(1)])]
    assert coalesced(one) is one


@pytest.mark.parametrize("fields", [{}, {"n": 2}, {"prompt": ["[long-answer]", "[long-answer] again"]}],
                         ids=["one", "n=2", "two-prompts"])
def test_a_slow_readers_completions_stream_is_the_same_text_in_fewer_chunks(server, fields):
    body = {"model": "tiny", "prompt": "[long-answer]", "temperature": 0, "max_tokens": 200, "ignore_eos": True,
            "logprobs": 1, **fields}
    whole = json.loads(asyncio.run(_request(server.app, "/v1/completions", body, 0.0)))
    slow = _events(asyncio.run(_request(server.app, "/v1/completions", {**body, "stream": True}, DELAY_S)))
    for choice in whole["choices"]:
        pieces = [c for chunk in slow for c in chunk["choices"] if c["index"] == choice["index"]]
        assert "".join(piece["text"] for piece in pieces) == choice["text"]
        for field in ("tokens", "token_logprobs", "text_offset"):
            assert [value for piece in pieces for value in piece["logprobs"][field]] == choice["logprobs"][field]
        assert pieces[-1]["finish_reason"] == choice["finish_reason"] == "length"
        assert len(pieces) < 20  # of 200 tokens
