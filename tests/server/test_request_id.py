"""A client's request id, as vLLM takes it: the `X-Request-Id` header, else the body's `request_id`, names the
response (`chatcmpl-ID`, `cmpl-ID`); requests in flight may share one; `--enable-request-id-headers` echoes it."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from server_support import PINNED_DATE, live_server

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "[long] go"}], "max_tokens": 300,
        "chat_template_kwargs": PINNED_DATE, "temperature": 0}
LONG_ANSWER = " ".join(["la"] * 30)
COMPLETION = {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 2, "temperature": 0}


@pytest.fixture(scope="module")
def server(make_tiny):
    with live_server(make_tiny(), scripted=True) as live:
        live.engine.engine.runner.add("[long]", " to=user<|message|>" + LONG_ANSWER + "<|eot|>")
        yield live


def _post(server, path: str, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, headers=headers, timeout=60)


def test_the_header_or_else_the_body_field_names_the_response(server):
    assert _post(server, "/chat/completions", CHAT, {"X-Request-Id": "trace-1"}).json()["id"] == "chatcmpl-trace-1"
    assert _post(server, "/chat/completions", {**CHAT, "request_id": "body-1"}).json()["id"] == "chatcmpl-body-1"
    both = _post(server, "/completions", {**COMPLETION, "request_id": "body-2"}, {"X-Request-Id": "trace-2"})
    assert both.json()["id"] == "cmpl-trace-2"  # vLLM's order: the header first
    assert _post(server, "/completions", {**COMPLETION, "prompt": [[1, 2], [3, 4]], "request_id": "b"}).json()[
        "id"] == "cmpl-b"
    with httpx.stream("POST", server.base_url + "/chat/completions", json={**CHAT, "stream": True},
                      headers={"X-Request-Id": "trace-3"}, timeout=60) as response:
        ids = {json.loads(line[6:])["id"] for line in response.iter_lines() if line.startswith("data: {")}
    assert ids == {"chatcmpl-trace-3"}
    plain = _post(server, "/chat/completions", CHAT).json()["id"]
    assert plain.startswith("chatcmpl-") and len(plain) > len("chatcmpl-")


def test_requests_in_flight_may_share_an_id(server):
    """Two requests with one id (a retry, a proxy's constant) are two requests to the engine: the second was not
    refused nor mixed with the first."""
    server.engine.engine.runner.step_delay_s = 0.02
    try:
        with httpx.stream("POST", server.base_url + "/chat/completions", json={**CHAT, "stream": True},
                          headers={"X-Request-Id": "same"}, timeout=60) as first:
            lines = first.iter_lines()
            assert next(line for line in lines if line.startswith("data: {"))
            second = _post(server, "/chat/completions", CHAT, {"X-Request-Id": "same"})
            rest = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    finally:
        server.engine.engine.runner.step_delay_s = 0.0
    assert second.status_code == 200, second.text
    assert second.json()["id"] == "chatcmpl-same"
    streamed = "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in rest if chunk["choices"])
    assert streamed == second.json()["choices"][0]["message"]["content"] == LONG_ANSWER
    assert {chunk["id"] for chunk in rest} == {"chatcmpl-same"}


@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
def test_an_empty_id_is_none_sent(server, path):
    """An empty X-Request-Id header or request_id (a proxy forwarding an unset variable) is answered as one left
    out, with an id made for it (vLLM answers it too; a 400 here before); an empty header leaves the body's id
    to name it."""
    body, prefix = (CHAT, "chatcmpl-") if path == "/chat/completions" else (COMPLETION, "cmpl-")
    made = [_post(server, path, {**body, **fields}, {"X-Request-Id": ""}) for fields in ({}, {"request_id": ""})]
    for response in made:
        assert response.status_code == 200, response.text
        assert response.json()["id"].startswith(prefix) and len(response.json()["id"]) > len(prefix) + 8
    assert made[0].json()["id"] != made[1].json()["id"]
    assert _post(server, path, {**body, "request_id": "b-5"}, {"X-Request-Id": ""}).json()["id"] == f"{prefix}b-5"


@pytest.mark.parametrize(("headers", "fields", "param"), [
    ({"X-Request-Id": "x" * 257}, {}, "X-Request-Id"),
    ({}, {"request_id": "a\nb"}, "request_id"),
    ({}, {"request_id": "caf\u00e9"}, "request_id"),
    ([("X-Request-Id", "a"), ("X-Request-Id", "b")], {}, "X-Request-Id"),
])
@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
def test_an_id_that_no_log_or_header_could_carry_is_refused_naming_it(server, path, headers, fields, param):
    body = {**(CHAT if path == "/chat/completions" else COMPLETION), **fields}
    response = _post(server, path, body, headers)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_a_header_id_outside_ascii_is_quoted_as_the_client_wrote_it(server):
    """A header's bytes reach the server as Latin-1 text: `X-Request-Id: café` sent as UTF-8 (curl, a proxy) was
    refused quoting 'cafÃ©', an id the client never sent."""
    response = httpx.post(server.base_url + "/completions", json=COMPLETION, timeout=60,
                          headers=[(b"X-Request-Id", "caf\u00e9".encode())])
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"].startswith("X-Request-Id: 'caf\u00e9' is not an id of visible ASCII")


@pytest.mark.parametrize(("headers", "fields", "name"), [
    ([(b"X-Request-Id", "\u00e9".encode() * 150)], {}, "X-Request-Id"),
    ([], {"request_id": "\u00e9" * 300}, "request_id"),
])
def test_a_long_id_outside_ascii_is_refused_for_its_characters(server, headers, fields, name):
    """An id of 150 é sent as UTF-8 in the header was refused as "300 characters; send at most 256", counting its
    bytes as Latin-1 reads them, and one of 300 é in the body for its length alone: sent again shorter, it was refused
    again, for what the first 400 never said."""
    response = httpx.post(server.base_url + "/completions", json={**COMPLETION, **fields}, timeout=60,
                          headers=headers)
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert message.startswith(f"{name}: '\u00e9\u00e9") and "is not an id of visible ASCII characters" in message


def test_request_id_headers_echo_the_id_or_make_one_the_response_is_named_by(make_tiny):
    """--enable-request-id-headers echoes an id the server takes; one it refuses (too long, not visible ASCII, sent
    twice) was reflected as sent, 5,000 characters or bytes outside ASCII, and the response now carries one made."""
    with live_server(make_tiny(), scripted=True, request_id_headers=True) as server:
        echoed = _post(server, "/completions", COMPLETION, {"X-Request-Id": "trace-4"})
        assert echoed.headers["x-request-id"] == "trace-4"
        made = _post(server, "/completions", COMPLETION)
        assert made.json()["id"] == f"cmpl-{made.headers['x-request-id']}"
        for path, body, prefix in (("/completions", COMPLETION, "cmpl"), ("/chat/completions", CHAT, "chatcmpl")):
            named = _post(server, path, {**body, "request_id": "body-3"})  # the body's id, not one made for it
            assert (named.json()["id"], named.headers["x-request-id"]) == (f"{prefix}-body-3", "body-3")
        assert _post(server, "/completions", {**COMPLETION, "request_id": "b"}, {"X-Request-Id": "h"}).json()[
            "id"] == "cmpl-h"
        assert httpx.get(server.url + "/health").headers["x-request-id"]
        empty = _post(server, "/completions", COMPLETION, {"X-Request-Id": ""})  # one made, as for none sent
        assert empty.status_code == 200, empty.text
        assert empty.json()["id"] == f"cmpl-{empty.headers['x-request-id']}" != "cmpl-"
        named = _post(server, "/completions", {**COMPLETION, "request_id": "body-6"}, {"X-Request-Id": ""})
        assert (named.json()["id"], named.headers["x-request-id"]) == ("cmpl-body-6", "body-6")
        # an id the server refuses is not reflected (5,000 characters, bytes outside ASCII, two ids): one is made
        for headers in ({"X-Request-Id": "x" * 5000}, [("X-Request-Id", b"caf\xc3\xa9")],
                        [("X-Request-Id", "a"), ("X-Request-Id", "b")]):
            refused = _post(server, "/completions", COMPLETION, headers)
            assert refused.status_code == 400 and refused.json()["error"]["param"] == "X-Request-Id", refused.text
            assert re.fullmatch("[0-9a-f]{32}", refused.headers["x-request-id"]), refused.headers["x-request-id"]
            health = httpx.get(server.url + "/health", headers=headers)
            assert re.fullmatch("[0-9a-f]{32}", health.headers["x-request-id"]), health.headers["x-request-id"]
        assert httpx.get(server.url + "/health", headers={"X-Request-Id": "t 1"}).headers["x-request-id"] == "t 1"
    with live_server(make_tiny(), scripted=True) as server:
        assert "x-request-id" not in _post(server, "/completions", COMPLETION, {"X-Request-Id": "t"}).headers


def test_request_id_headers_are_on_a_cors_preflights_answer_too_and_exposed_to_the_page(make_tiny):
    """--enable-request-id-headers puts X-Request-Id on every response: a browser's preflight, which the CORS layer
    answers itself, allowed (200) or refused (400), went without one, and a cross-origin page could not read it."""
    with live_server(make_tiny(), scripted=True, request_id_headers=True,
                     allowed_origins=("http://page.example",)) as server:
        for origin, status in (("http://page.example", 200), ("http://other.example", 400)):
            preflight = httpx.options(server.base_url + "/chat/completions", headers={
                "Origin": origin, "Access-Control-Request-Method": "POST", "X-Request-Id": "trace-9"})
            assert (preflight.status_code, preflight.headers.get("x-request-id")) == (status, "trace-9"), origin
        made = httpx.options(server.base_url + "/models", headers={"Origin": "http://page.example",
                                                                   "Access-Control-Request-Method": "GET"})
        assert made.status_code == 200 and made.headers["x-request-id"]
        # and a page's script may read it (the OpenAI SDKs' `_request_id`): a browser hides a header not exposed
        answer = httpx.get(server.base_url + "/models", headers={"Origin": "http://page.example"})
        assert "x-request-id" in answer.headers["access-control-expose-headers"].lower().split(", ")


RESPONSE = {"model": "tiny", "input": "[long] go", "max_output_tokens": 300, "temperature": 0,
            "chat_template_kwargs": PINNED_DATE}


def _engine_ids(server) -> set[str]:
    return {request_id for request_id, _ in server.engine.engine.runner._by_sequence}


def test_a_responses_request_id_is_the_response_id_as_vllm_takes_it(server):
    """/v1/responses takes vLLM's body `request_id` as its response's id, as sent (the store keeps it by that id),
    and the engine's request is named after it; the X-Request-Id header names no response, as in vLLM."""
    before = _engine_ids(server)
    named = _post(server, "/responses", {**RESPONSE, "request_id": "order-7"}, {"X-Request-Id": "trace-7"})
    assert named.status_code == 200, named.text
    assert named.json()["id"] == "order-7"
    assert httpx.get(server.base_url + "/responses/order-7", timeout=60).json()["output"] == named.json()["output"]
    assert {request_id.rsplit("-", 1)[0] for request_id in _engine_ids(server) - before} == {"order-7"}
    odd = _post(server, "/responses", {**RESPONSE, "request_id": "a?b#c%2F. d"})  # a client's URL encodes these
    assert httpx.get(server.base_url + "/responses/a%3Fb%23c%252F.%20d", timeout=60).json()["id"] == odd.json()["id"]
    continued = _post(server, "/responses", {**RESPONSE, "previous_response_id": "order-7", "request_id": "order-8"})
    assert continued.status_code == 200, continued.text
    with httpx.stream("POST", server.base_url + "/responses", json={**RESPONSE, "stream": True, "request_id": "s-9"},
                      timeout=60) as response:
        ids = {json.loads(line[6:]).get("response", {}).get("id") for line in response.iter_lines()
               if line.startswith("data: {")}
    assert ids - {None} == {"s-9"}
    header_only = _post(server, "/responses", RESPONSE, {"X-Request-Id": "trace-8"}).json()["id"]
    assert header_only.startswith("resp_") and "trace-8" not in header_only
    for sent in (None, ""):
        made = _post(server, "/responses", {**RESPONSE, "request_id": sent} if sent is not None else RESPONSE)
        assert made.json()["id"].startswith("resp_") and len(made.json()["id"]) > len("resp_") + 8


@pytest.mark.parametrize("sent", ["x" * 257, "a\nb", "caf\u00e9", 7, "order/7", "..", "7/input_items", "compact",
                                  "input_tokens"])
def test_a_responses_request_id_no_log_or_url_could_carry_is_refused_naming_it(server, sent):
    """As on chat, and one no `GET /v1/responses/{id}` could fetch the stored response by (its input items were
    what `7/input_items` fetched; `compact` and `input_tokens` are routes of their own, whose GET is a 405)."""
    response = _post(server, "/responses", {**RESPONSE, "request_id": sent})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "request_id"


def test_request_id_headers_name_a_responses_request_by_its_id(make_tiny):
    with live_server(make_tiny(), scripted=True, request_id_headers=True) as server:
        server.engine.engine.runner.add("[long]", " to=user<|message|>" + LONG_ANSWER + "<|eot|>")
        named = _post(server, "/responses", {**RESPONSE, "request_id": "order-9"})
        assert (named.json()["id"], named.headers["x-request-id"]) == ("order-9", "order-9")
        made = _post(server, "/responses", RESPONSE)
        assert made.json()["id"] == f"resp_{made.headers['x-request-id']}"
        echoed = _post(server, "/responses", RESPONSE, {"X-Request-Id": "trace-9"})
        assert echoed.headers["x-request-id"] == "trace-9" and echoed.json()["id"].startswith("resp_")
        # an id the server refuses is as none sent: the response was named by neither it nor the one made for it
        for headers in ({"X-Request-Id": "x" * 5000}, [("X-Request-Id", "a"), ("X-Request-Id", "b")]):
            refused = _post(server, "/responses", RESPONSE, headers)
            assert refused.status_code == 200, refused.text
            assert re.fullmatch("[0-9a-f]{32}", refused.headers["x-request-id"]), refused.headers["x-request-id"]
            assert refused.json()["id"] == f"resp_{refused.headers['x-request-id']}"
            named = _post(server, "/responses", {**RESPONSE, "request_id": "order-10"}, headers)
            assert (named.json()["id"], named.headers["x-request-id"]) == ("order-10", "order-10")
