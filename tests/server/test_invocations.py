"""vLLM's SageMaker entry point, `POST /invocations` (`glimmer/server/invocations.py`)."""

from __future__ import annotations

import json

import httpx
from server_support import live_server


def test_invocations_runs_a_chat_completion_or_a_completion_by_the_bodys_fields(tiny_checkpoint):
    """SageMaker sends every request to /invocations, which vLLM serves: it was a 404."""
    with live_server(tiny_checkpoint) as server:
        chat = httpx.post(server.url + "/invocations", timeout=60, json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert chat.status_code == 200, chat.text
        assert chat.json()["object"] == "chat.completion"
        text = httpx.post(server.url + "/invocations", timeout=60,
                          json={"model": "tiny", "prompt": "hi", "max_tokens": 2, "temperature": 0})
        assert text.status_code == 200, text.text
        same = httpx.post(server.base_url + "/completions", timeout=60,
                          json={"model": "tiny", "prompt": "hi", "max_tokens": 2, "temperature": 0})
        assert text.json()["object"] == "text_completion"
        assert text.json()["choices"][0]["text"] == same.json()["choices"][0]["text"]
        with httpx.stream("POST", server.url + "/invocations", timeout=60, json={
                "model": "tiny", "prompt": "hi", "max_tokens": 2, "stream": True}) as stream:
            lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and json.loads(lines[0][6:])["object"] == "text_completion"


def test_an_invocations_body_with_neither_messages_nor_prompt_is_a_400_naming_both(tiny_checkpoint):
    with live_server(tiny_checkpoint) as server:
        deep = b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"  # past Python's parser (was a 500)
        for body in (b'{"model": "tiny", "input": "hi"}', b"[1]", b"{not json", deep):
            reply = httpx.post(server.url + "/invocations", content=body,
                               headers={"Content-Type": "application/json"}, timeout=30)
            assert reply.status_code == 400, reply.text
            message = reply.json()["error"]["message"]
            assert "`messages`" in message and "`prompt`" in message


def test_invocations_needs_the_api_key_as_v1_does(tiny_checkpoint):
    with live_server(tiny_checkpoint, api_key="secret") as server:
        body = {"model": "tiny", "prompt": "hi", "max_tokens": 1}
        assert httpx.post(server.url + "/invocations", json=body, timeout=30).status_code == 401
        allowed = httpx.post(server.url + "/invocations", json=body, timeout=30,
                             headers={"Authorization": "Bearer secret"})
        assert allowed.status_code == 200, allowed.text


def test_a_null_messages_or_prompt_is_unset_when_invocations_picks_the_route(tiny_checkpoint):
    """null is an unset field on every route (a client may send its unset fields as null, as a SageMaker client typing
    its body as the union of both requests does): a body with `"messages": null` beside its prompt was run as a chat
    completion and refused as one without messages "(this endpoint is /v1/chat/completions)", and one with
    `"prompt": null` beside its messages was refused for an unknown field `prompt`."""
    with live_server(tiny_checkpoint) as server:
        text = httpx.post(server.url + "/invocations", timeout=60,
                          json={"model": "tiny", "messages": None, "prompt": "hi", "max_tokens": 2})
        assert text.status_code == 200, text.text
        assert text.json()["object"] == "text_completion"
        chat = httpx.post(server.url + "/invocations", timeout=60, json={
            "model": "tiny", "prompt": None, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert chat.status_code == 200, chat.text
        assert chat.json()["object"] == "chat.completion"
        neither = httpx.post(server.url + "/invocations", timeout=60, json={"messages": None, "prompt": None})
        assert neither.status_code == 400
        assert neither.json()["error"]["message"] == (
            "an /invocations body is a JSON object: a chat completion request (with `messages`) or a completion "
            "request (with `prompt`)")
        twice = httpx.post(server.url + "/invocations", timeout=60, headers={"Content-Type": "application/json"},
                           content=b'{"messages": null, "prompt": "hi", "prompt": "ho"}')
        assert twice.status_code == 400 and twice.json()["error"]["param"] == "prompt"


def test_a_body_under_the_size_limit_is_taken_whole_when_a_null_field_is_dropped(tiny_checkpoint):
    """Dropping a null `messages` wrote the body again as JSON with its é escaped (2 bytes to 6) and read it again
    under the size limit: a body of 1,700 bytes was refused 413 "larger than the server's limit of 2048 bytes"."""
    body = json.dumps({"model": "tiny", "messages": None, "prompt": "é" * 800, "max_tokens": 1},
                      ensure_ascii=False).encode()
    assert len(body) < 2048 < len(json.dumps(json.loads(body)).encode())
    with live_server(tiny_checkpoint, max_request_bytes=2048) as server:
        reply = httpx.post(server.url + "/invocations", content=body, timeout=60,
                           headers={"Content-Type": "application/json"})
    assert reply.status_code == 200, reply.text
    assert reply.json()["object"] == "text_completion"
    assert reply.json()["usage"]["prompt_tokens"] > 800


def test_a_null_field_of_the_other_request_is_unset_when_invocations_picks_the_route(tiny_checkpoint):
    """A client typing its body as the union of both requests sends each field of the other request as null too:
    `"tools": null` beside a prompt was refused as an unknown field of a completion, `"best_of": null` beside messages
    as one of a chat completion. Such a field sent with a value is still refused, naming it."""
    with live_server(tiny_checkpoint) as server:
        text = httpx.post(server.url + "/invocations", timeout=60, json={
            "model": "tiny", "messages": None, "tools": None, "tool_choice": None, "max_completion_tokens": None,
            "prompt": "hi", "max_tokens": 2})
        assert text.status_code == 200, text.text
        assert text.json()["object"] == "text_completion"
        chat = httpx.post(server.url + "/invocations", timeout=60, json={
            "model": "tiny", "prompt": None, "best_of": None, "suffix": None,
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert chat.status_code == 200, chat.text
        assert chat.json()["object"] == "chat.completion"
        valued = httpx.post(server.url + "/invocations", timeout=60,
                            json={"model": "tiny", "prompt": "hi", "tools": [], "max_tokens": 2})
        assert valued.status_code == 400 and valued.json()["error"]["param"] == "tools", valued.text


def test_a_null_field_neither_request_declares_is_refused_naming_it(tiny_checkpoint):
    """Only the other request's fields sent as null are none sent: a null typo (`max_tokenz`) was dropped too and the
    body run, where /v1/completions refuses it as an unknown field and suggests the one meant."""
    with live_server(tiny_checkpoint) as server:
        for body in ({"model": "tiny", "prompt": "hi", "max_tokenz": None, "max_tokens": 1},
                     {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokenz": None,
                      "max_tokens": 1}):
            reply = httpx.post(server.url + "/invocations", timeout=60, json=body)
            assert reply.status_code == 400, reply.text
            error = reply.json()["error"]
            assert error["param"] == "max_tokenz" and "did you mean max_tokens?" in error["message"], error
