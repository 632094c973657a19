"""Requests an attacker or a broken client sends get clean 4xx answers and leave the server unharmed (issue 8).

Each case is a regression test of a failure seen through the real server: a 500, a dead engine, or work done
before a limit applied.
"""

from __future__ import annotations

import gzip
import json
import logging
import time

import httpx
import pytest
from reliability_support import assert_healthy, chat_body, open_connection, raw_request, send_and_hang_up
from server_support import live_server

from glimmer.protocol.request_normalization import lone_surrogate_error

KEY = "sk-reliability"


@pytest.fixture(scope="module")
def server(make_tiny):
    with live_server(make_tiny()) as live:
        yield live


def post(server, body: dict | bytes, path: str = "/chat/completions", **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **headers}
    return httpx.post(server.base_url + path, content=content, headers=headers, timeout=60)


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert "Traceback" not in response.text
    return error


HUGE = 2**63


@pytest.mark.parametrize(("path", "fields", "param"), [
    ("/chat/completions", {"top_k": HUGE}, "top_k"),
    ("/chat/completions", {"top_k": -2}, "top_k"),
    ("/chat/completions", {"seed": 2**64}, "seed"),
    ("/chat/completions", {"n": HUGE}, "n"),
    ("/chat/completions", {"min_tokens": HUGE}, "min_tokens"),
    ("/chat/completions", {"max_tokens": HUGE}, "max_tokens"),
    ("/chat/completions", {"max_completion_tokens": -1}, "max_completion_tokens"),
    ("/chat/completions", {"logprobs": True, "top_logprobs": HUGE}, "top_logprobs"),
    ("/completions", {"prompt": "x", "logprobs": HUGE}, "logprobs"),
    ("/completions", {"prompt": "x", "best_of": HUGE}, "best_of"),
    ("/completions", {"prompt": "x", "max_tokens": HUGE}, "max_tokens"),
    ("/completions", {"prompt": "x", "top_k": HUGE}, "top_k"),
])
def test_every_integer_field_is_range_checked_before_any_work(server, path, fields, param):
    body = chat_body(**fields) if path == "/chat/completions" else {"model": "tiny", **fields}
    error = error_of(post(server, body, path), 400)
    assert error["param"] == param
    assert server.engine.is_alive


@pytest.mark.parametrize(("prompt", "param", "token_id"), [
    ([HUGE], "prompt[0]", HUGE), ([[1, 2], [HUGE]], "prompt[1][0]", HUGE), ([-1], "prompt[0]", -1),
    ([5, 7, -1], "prompt[2]", -1), ([[1, 2], [3, -1]], "prompt[1][1]", -1)])
def test_prompt_token_ids_out_of_range_are_400_naming_the_id(server, prompt, param, token_id):
    """As `LLM.generate([-1])` says, the id is outside the vocabulary; -1 got the generic "must be a string, ..."."""
    error = error_of(post(server, {"model": "tiny", "prompt": prompt, "max_tokens": 2}, "/completions"), 400)
    vocabulary_size = server.engine.engine.token_count
    assert error["param"] == param
    assert error["message"] == f"{param}: token id {token_id} is outside the vocabulary [0, {vocabulary_size})"


MILLION = 1_000_000


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {"messages": [1] * MILLION}, "messages[0]"),
    ("/v1/completions", {"prompt": ["a"] + [1] * MILLION}, "prompt"),
    ("/v1/responses", {"input": [1] * MILLION}, "input"),
    ("/detokenize", {"tokens": [[]] * MILLION}, "tokens[0]"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], **{f"k{i}": 1 for i in range(300_000)}},
     "k0"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "logit_bias": {str(i): "x" for i in range(280_000)}}, "logit_bias.0"),
    ("/v1/responses", {"input": "hi", "metadata": {str(i): 1 for i in range(300_000)}}, "metadata.0"),
])
def test_countless_wrong_entries_are_refused_at_the_first_without_holding_the_server(server, path, body, param):
    """Validation collected an error for every wrong list item, unknown field or dict value, on the event loop: a
    3 MB body of them held every other request, stream and /health for 3 to 55 s (a few such bodies kept the server
    from answering at all)."""
    started = time.process_time()  # the server is this process's threads: CPU time, which a busy machine keeps
    response = httpx.post(server.url + path, content=json.dumps({"model": "tiny", **body}, separators=(",", ":")),
                          headers={"Content-Type": "application/json"}, timeout=120)
    assert error_of(response, 400)["param"] == param
    assert time.process_time() - started < 5  # 0.2 to 1.5 s; 3 to 55 s when every entry was checked
    assert_healthy(server)


def test_the_top_k_that_killed_the_engine_is_refused_and_the_engine_lives(server):
    """Issue 8: top_k = 2**63 overflowed inside the sampler and stopped the engine for good."""
    assert error_of(post(server, chat_body(top_k=2**63)), 400)["param"] == "top_k"
    assert_healthy(server)


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                          None, "application/jsonp"])
def test_a_json_endpoint_refuses_other_media_types_with_415(server, content_type):
    """A browser sends text/plain POSTs cross-site without a preflight; they must not run."""
    headers = {} if content_type is None else {"Content-Type": content_type}
    response = httpx.post(server.base_url + "/chat/completions", content=json.dumps(chat_body(top_k=2**63)),
                          headers=headers, timeout=30)
    assert error_of(response, 415)["code"] == "unsupported_media_type"
    response = httpx.post(server.base_url + "/completions", content=b'{"prompt": "x"}', headers=headers, timeout=30)
    assert response.status_code == 415


def test_a_media_type_or_coding_outside_ascii_is_quoted_as_the_client_wrote_it(server):
    """A header's UTF-8 bytes (curl's, a proxy's) were quoted as Latin-1 reads them, `text/café` as 'text/cafÃ©'."""
    body = json.dumps(chat_body()).encode()
    for headers, status, quoted in (
            ([("Content-Type", "text/caf\u00e9".encode())], 415, "(got 'text/caf\u00e9')"),
            ([("Content-Type", b"application/json"), ("Content-Encoding", "z\u00e9".encode())], 415,
             "`Content-Encoding: z\u00e9`"),
            ([("Content-Type", b"application/json"), ("Content-Type", "caf\u00e9".encode())], 400,
             "('application/json', 'caf\u00e9')")):
        response = httpx.post(server.base_url + "/chat/completions", content=body, headers=headers, timeout=30)
        message = error_of(response, status)["message"]
        assert quoted in message and "\u00c3" not in message, message


@pytest.mark.parametrize("coding", ["gzip", "br", "deflate, gzip"])
def test_a_compressed_body_is_refused_with_415_not_read_as_json(server, coding):
    """A gzip body was answered "not valid JSON", and a plain body declared gzip was served as if undeclared."""
    plain = json.dumps(chat_body()).encode()
    for body in (gzip.compress(plain), plain):
        error = error_of(post(server, body, **{"Content-Encoding": coding}), 415)
        assert error["code"] == "unsupported_media_type" and "Content-Encoding" in error["message"]
    assert post(server, plain, **{"Content-Encoding": "identity"}).status_code == 200


@pytest.mark.parametrize("second", ["text/plain", "application/json"])
def test_a_request_with_two_content_type_headers_is_400_naming_the_header(server, second):
    """Only the first Content-Type header was checked: `application/json` then `text/plain` was served."""
    headers = [("Content-Type", "application/json"), ("Content-Type", second)]
    response = httpx.post(server.base_url + "/chat/completions", content=json.dumps(chat_body()), headers=headers,
                          timeout=30)
    assert "2 Content-Type headers" in error_of(response, 400)["message"]


def test_a_coding_on_a_second_content_encoding_header_is_refused(server):
    """Only the first Content-Encoding header was checked: `identity` then `gzip` read the gzip body as JSON."""
    headers = [("Content-Type", "application/json"), ("Content-Encoding", "identity"), ("Content-Encoding", "gzip")]
    body = gzip.compress(json.dumps(chat_body()).encode())
    response = httpx.post(server.base_url + "/chat/completions", content=body, headers=headers, timeout=30)
    assert error_of(response, 415)["code"] == "unsupported_media_type"


def test_json_with_a_charset_parameter_is_accepted(server):
    response = post(server, chat_body(), **{"Content-Type": "Application/JSON; charset=utf-8"})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("part_type", [["text"], {"a": 1}, 5, None])
def test_a_content_part_whose_type_is_not_a_string_is_400(server, part_type):
    messages = [{"role": "user", "content": [{"type": part_type, "text": "x"}]}]
    error = error_of(post(server, chat_body(messages=messages)), 400)
    assert error["param"] == "messages[0].content[0]"


def _with_call_arguments(arguments: str) -> dict:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return chat_body(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [call]}])


def test_a_lone_surrogate_inside_tool_call_arguments_is_400(server):
    error = error_of(post(server, _with_call_arguments('{"a": "x\\ud800y"}')), 400)
    assert error["param"] == "messages[1].tool_calls[0].function.arguments"
    # in the words of a body field's (the check of the arguments' decoded values had a wording of its own)
    assert error["message"] == str(lone_surrogate_error("messages[1].tool_calls[0].function.arguments"))


USER = b'{"role": "user", "content": "hi"}'


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/chat/completions", b'{"model": "tiny", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
     "messages[0].content"),
    ("/chat/completions", b'{"model": "tiny", "messages": [' + USER + b'], "stop": ["x", "\\udc00"]}', "stop[1]"),
    ("/chat/completions", b'{"model": "tiny", "messages": [' + USER + b'], "metadata": {"k\\ud800": "v"}}',
     "metadata"),  # a key holding one is named by its object
    ("/completions", b'{"model": "tiny", "prompt": ["ok", "a\\ud800"]}', "prompt[1]"),
    ("/responses", b'{"model": "tiny", "input": [{"role": "user", "content": "a\\ud800"}]}', "input[0].content"),
])
def test_a_lone_surrogate_escape_in_a_body_field_is_400_naming_the_field(server, path, body, param):
    """pydantic-core's parser refuses a `\\ud800` escape without its pair before any field is read: the answer was
    "the request body is not valid JSON: ... unexpected end of hex escape", naming no field."""
    error = error_of(post(server, body, path), 400)
    assert error["param"] == param
    assert error["message"].startswith(("a key of " if param == "metadata" else "") + f"{param} holds a lone UTF-16 "
                                       "surrogate")


def test_a_surrogate_pair_escape_is_one_character_not_a_lone_surrogate(server):
    body = b'{"model": "tiny", "messages": [{"role": "user", "content": "\\ud83d\\ude00"}], "max_tokens": 1}'
    assert post(server, body).status_code == 200


def test_tool_call_arguments_nested_500_deep_are_400(server):
    error = error_of(post(server, _with_call_arguments('{"a": ' + "[" * 500 + "]" * 500 + "}")), 400)
    assert "levels deep" in error["message"]
    deep_object = {"a": 1}
    for _ in range(150):
        deep_object = {"a": deep_object}
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": deep_object}}
    body = chat_body(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [call]}])
    assert "levels deep" in error_of(post(server, body), 400)["message"]
    assert_healthy(server)


def test_a_client_that_leaves_during_the_upload_is_no_internal_error(server, caplog):
    before = server.metrics()
    body = json.dumps(chat_body()).encode()
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            send_and_hang_up(server.url, raw_request(server.base_url, "/chat/completions", body[:20],
                                                     declared_length=len(body)), after_s=0.05)
        time.sleep(0.5)
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR], caplog.text
    after = server.metrics()
    key = 'glimmer_requests_total{endpoint="/v1/chat/completions",status="%s"}'
    assert after.get(key % 499, 0) - before.get(key % 499, 0) == 3
    assert after.get(key % 500, 0) == before.get(key % 500, 0)
    assert_healthy(server)


@pytest.mark.parametrize("framing", [b"zz\r\n{}\r\n0\r\n\r\n", b"2\r\n{}}}\r\n0\r\n\r\n"])
def test_a_broken_chunked_upload_is_answered_400_by_uvicorn_and_counted_as_the_client_gone(server, caplog, framing):
    """uvicorn (h11, and httptools alike) answers broken chunk framing itself, a plain-text 400, and closes the
    connection: the app then sees only a disconnect, as from a client that left (test above), and counts a 499.
    No 500, no error logged, and the server serves on."""
    before = server.metrics()
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: glimmer\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
    with caplog.at_level(logging.WARNING), open_connection(server.url) as connection:
        connection.sendall(head + framing)
        reply = b"".join(iter(lambda: connection.recv(4096), b""))
    assert reply.startswith(b"HTTP/1.1 400 "), reply[:200]
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR], caplog.text
    key = 'glimmer_requests_total{endpoint="/v1/chat/completions",status="%s"}'
    after = assert_healthy(server)
    assert after.get(key % 499, 0) - before.get(key % 499, 0) == 1
    assert after.get(key % 500, 0) == before.get(key % 500, 0)


def test_cors_is_off_by_default(server):
    preflight = httpx.options(server.base_url + "/chat/completions", headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in preflight.headers
    response = post(server, chat_body(), Origin="https://evil.example")
    assert "access-control-allow-origin" not in response.headers


@pytest.fixture(scope="module")
def cors_server(make_tiny):
    with live_server(make_tiny(), allowed_origins=("https://app.example",)) as live:
        yield live


def test_cors_allows_only_the_configured_origins(cors_server):
    allowed = httpx.options(cors_server.base_url + "/chat/completions", headers={
        "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type,authorization"})
    assert allowed.headers["access-control-allow-origin"] == "https://app.example"
    other = httpx.options(cors_server.base_url + "/chat/completions", headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in other.headers


def test_cors_preflight_allows_the_headers_openai_sdks_send(cors_server):
    # the OpenAI JS SDK (any Stainless-generated SDK) sends X-Stainless-* on every request, OpenAI-Organization and
    # OpenAI-Project when configured: a preflight refusing them keeps every browser client built on it out
    sdk_headers = "authorization,content-type,x-stainless-os,x-stainless-retry-count,openai-organization"
    preflight = httpx.options(cors_server.base_url + "/chat/completions", headers={
        "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": sdk_headers})
    assert preflight.status_code == 200, preflight.text
    allowed = {name.strip() for name in preflight.headers["access-control-allow-headers"].lower().split(",")}
    assert set(sdk_headers.split(",")) <= allowed


def test_cors_preflight_allows_deleting_a_stored_response(cors_server):
    """Audit: the preflight allowed GET and POST only, so a page's `responses.delete` got "Disallowed CORS method"."""
    preflight = httpx.options(cors_server.base_url + "/responses/resp_123", headers={
        "Origin": "https://app.example", "Access-Control-Request-Method": "DELETE",
        "Access-Control-Request-Headers": "authorization"})
    assert preflight.status_code == 200, preflight.text
    assert "DELETE" in preflight.headers["access-control-allow-methods"]
    deleted = httpx.delete(cors_server.base_url + "/responses/resp_123", headers={"Origin": "https://app.example"})
    assert error_of(deleted, 404)
    assert deleted.headers.get("access-control-allow-origin") == "https://app.example"


def test_cors_preflights_are_not_counted_as_the_endpoints_requests(cors_server):
    """Audit: each preflight counted as a `/v1/chat/completions` 200 (and a refused one as a 400) in /metrics, so a
    browser client's requests were counted twice."""
    key = 'glimmer_requests_total{endpoint="%s",status="%s"}'
    before = cors_server.metrics()
    for origin in ("https://app.example", "https://evil.example"):
        httpx.options(cors_server.base_url + "/chat/completions", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST"})
    after = cors_server.metrics()
    for status in (200, 400):
        assert after.get(key % ("/v1/chat/completions", status), 0) == before.get(
            key % ("/v1/chat/completions", status), 0)
        assert after[key % ("preflight", status)] - before.get(key % ("preflight", status), 0) == 1


def test_every_error_carries_the_cors_headers_internal_ones_included(cors_server, monkeypatch):
    """A 500 was made outside CORSMiddleware and carried no CORS headers: a browser page could not read it."""
    def broken(*args, **kwargs):
        raise RuntimeError("the secret internals")

    monkeypatch.setattr(cors_server.app.state.context.template, "render_prompt", broken)
    for status, body in ((404, chat_body(model="nope")), (400, b"{nope"), (500, chat_body())):
        response = post(cors_server, body, Origin="https://app.example")
        assert error_of(response, status)["type"] != "internal_error" or "secret" not in response.text
        assert response.headers.get("access-control-allow-origin") == "https://app.example", status


def test_metrics_can_require_the_api_key(make_tiny):
    with live_server(make_tiny(), api_key=KEY, metrics_require_api_key=True) as live:
        assert error_of(httpx.get(live.url + "/metrics"), 401)["code"] == "invalid_api_key"
        assert httpx.get(live.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        assert httpx.get(live.url + "/health").status_code == 200  # probes stay open
