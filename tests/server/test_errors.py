"""Every error status, as an OpenAI-style body, through the real server; and bad requests never hurt good ones."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket

import httpx
import openai
import pytest
from server_support import PINNED_DATE, WEATHER_TOOL, live_server
from starlette.exceptions import HTTPException
from starlette.staticfiles import StaticFiles

import glimmer
from glimmer.multimodal.errors import MediaFetchBusyError
from glimmer.protocol import ChatTemplateError
from glimmer.server.errors import describe_error

KEY = "sk-test-key"
LIMIT = 64 * 1024
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(make_tiny):
    with live_server(make_tiny(), api_key=KEY, max_request_bytes=LIMIT, max_n=4) as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0)


def post(server, body, *, path="/chat/completions", key=KEY, **kwargs) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if not isinstance(body, dict):
        headers["Content-Type"] = "application/json"
        return httpx.post(server.base_url + path, content=body, headers=headers, timeout=30, **kwargs)
    return httpx.post(server.base_url + path, json=body, headers=headers, timeout=30, **kwargs)


def chat(**fields):
    return {"model": "tiny", "messages": MESSAGES, "max_tokens": 4, "chat_template_kwargs": PINNED_DATE, **fields}


def sdk_chat(**fields):
    return {"model": "tiny", "messages": MESSAGES, "max_tokens": 4, "extra_body": {"chat_template_kwargs": PINNED_DATE},
            **fields}


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_a_valid_request_with_the_key_succeeds(client):
    assert client.chat.completions.create(**sdk_chat()).choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("key", [None, "sk-wrong"])
def test_missing_or_wrong_api_key_is_401(server, key):
    response = post(server, chat(), key=key)
    assert error_of(response, 401)["code"] == "invalid_api_key"
    assert response.headers["WWW-Authenticate"] == "Bearer"
    if key is not None:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0).models.list()


def test_the_openapi_document_is_behind_the_api_key_and_the_docs_pages_are_not_served(server):
    """It lists every route of the guarded API; it was served to anyone (as vLLM serves it, a gap its security guide
    documents)."""
    assert error_of(httpx.get(server.url + "/openapi.json"), 401)["code"] == "invalid_api_key"
    document = httpx.get(server.url + "/openapi.json", headers={"Authorization": f"Bearer {KEY}"})
    assert document.status_code == 200 and "/v1/chat/completions" in document.json()["paths"]
    assert "/openapi.json" not in document.json()["paths"]
    operation_ids = [operation["operationId"] for path in document.json()["paths"].values()
                     for operation in path.values()]
    assert len(operation_ids) == len(set(operation_ids))  # OpenAPI requires them unique (GET and HEAD shared them)
    assert httpx.head(server.url + "/openapi.json").status_code == 401
    for page in ("/docs", "/redoc"):
        assert error_of(httpx.get(server.url + page, headers={"Authorization": f"Bearer {KEY}"}), 404)


def test_the_openapi_document_under_a_root_path_names_it_as_its_server(server):
    """Behind --root-path the document's paths (`/v1/chat/completions`) are reached under it (`/api/v1/...`): FastAPI's
    own /openapi.json, and so vLLM's, says so in `servers`, which Glimmer's route left out, so a client generated
    from the document, or one that reads it, called the paths without the prefix and got 404s."""
    async def get(path: str, root_path: str) -> httpx.Response:
        transport = httpx.ASGITransport(app=server.app, root_path=root_path)  # the scope uvicorn makes
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
            return await client.get(root_path + path, headers={"Authorization": f"Bearer {KEY}"})

    document = asyncio.run(get("/openapi.json", "/api")).json()
    assert document["servers"] == [{"url": "/api"}] and "/v1/chat/completions" in document["paths"]
    assert asyncio.run(get("/openapi.json", "/api/")).json()["servers"] == [{"url": "/api"}]
    assert "servers" not in asyncio.run(get("/openapi.json", "")).json()


def test_serve_api_key_help_names_exactly_the_routes_behind_the_key(server):
    """The help named /v1 and /openapi.json; /tokenize, /detokenize and /invocations need the key too. Every route
    (the OpenAPI document's, and those the app serves outside it) is asked without the key; those answering 401 are
    grouped by their first segment, as the help names them."""
    from fastapi.routing import APIRoute

    from glimmer.cli import build_parser

    document = httpx.get(server.url + "/openapi.json", headers={"Authorization": f"Bearer {KEY}"}).json()
    routes = {(method.upper(), path) for path, operations in document["paths"].items() for method in operations}
    routes |= {(method, route.path) for route in server.app.routes if isinstance(route, APIRoute)
               for method in route.methods}
    guarded, open_ = set(), set()
    for method, path in routes:
        status = httpx.request(method, server.url + re.sub(r"\{[^}]*\}", "x", path), timeout=30).status_code
        (guarded if status == 401 else open_).add("/" + path.split("/")[1])
    assert "/v1" in guarded and not guarded & open_  # every route under a guarded one is guarded
    api_key = next(action for action in build_parser().commands["serve"]._actions if action.dest == "api_key")
    named = set(re.findall(r"(?<![\w`])/[\w.]+", api_key.help))
    assert named - {"/metrics"} == guarded and "/metrics with --metrics-require-api-key" in api_key.help


@pytest.mark.parametrize("keys", [[KEY, "sk-wrong"], ["sk-wrong", KEY], [KEY, KEY]])
def test_more_than_one_authorization_header_is_401_naming_the_header(server, keys):
    """The first header decided (right then wrong passed, wrong then right did not); a proxy or a logger that reads
    another line disagrees with the server on who asked."""
    headers = [("Authorization", f"Bearer {key}") for key in keys]
    response = httpx.post(server.base_url + "/chat/completions", json=chat(), headers=headers, timeout=30)
    error = error_of(response, 401)
    assert error["code"] == "invalid_api_key" and error["message"].startswith("the request has 2 Authorization headers")
    assert KEY not in error["message"]


def test_health_and_metrics_need_no_key(server):
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/metrics").status_code == 200


def test_malformed_json_is_400(server):
    error = error_of(post(server, b'{"model": "tiny", "messages": ['), 400)
    assert "not valid JSON" in error["message"]
    error_of(post(server, b"[1, 2]"), 400)


@pytest.mark.parametrize("path", ["/chat/completions", "/responses", "/invocations", "/tokenize"])
def test_a_body_starting_with_a_utf8_byte_order_mark_is_read_without_it(server, path):
    """RFC 8259 §8.1 lets a parser ignore the mark (Python's json and run-batch do); it was "not valid JSON: expected
    value at line 1 column 1"."""
    body = chat() if path != "/responses" else {"model": "tiny", "input": "hi", "max_output_tokens": 2}
    if path == "/tokenize":
        body = {"model": "tiny", "prompt": "hi"}
    url = server.url + path if path in ("/invocations", "/tokenize") else server.base_url + path
    response = httpx.post(url, content=b"\xef\xbb\xbf" + json.dumps(body).encode(), timeout=30,
                          headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(("encoding", "named"), [("utf-16", "UTF-16"), ("utf-16-be", "UTF-16 or UTF-32"),
                                                 ("utf-32", "UTF-32"), ("utf-32-le", "UTF-16 or UTF-32")])
def test_a_body_in_utf16_or_utf32_is_400_saying_to_send_utf8(server, encoding, named):
    """It was "the request body is not valid JSON: Invalid JSON: expected value at line 1 column 1", which said nothing
    of the encoding (PowerShell writes UTF-16)."""
    error = error_of(post(server, json.dumps(chat()).encode(encoding)), 400)
    assert error["message"] == f"the request body is {named} text; send JSON encoded as UTF-8"


@pytest.mark.parametrize("path", ["/chat/completions", "/responses", "/tokenize", "/invocations"])
def test_a_body_in_latin1_is_400_saying_to_send_utf8(server, path):
    """A body in Latin-1 or Windows-1252 (an é as the one byte 0xe9) was "not valid JSON: Invalid JSON: invalid unicode
    code point at line 1 column N", which said nothing of the encoding, as UTF-16's once did; /invocations, which reads
    the body to choose its route, said "not valid JSON ('utf-8' codec can't decode byte 0xe9 in position N: ...)",
    counting the byte from 0."""
    body = chat(messages=[{"role": "user", "content": "café"}])
    if path == "/responses":
        body = {"model": "tiny", "input": "café"}
    elif path == "/tokenize":
        body = {"model": "tiny", "prompt": "café"}
    data = json.dumps(body, ensure_ascii=False).encode("latin-1")
    url = server.url + path if path in ("/tokenize", "/invocations") else server.base_url + path
    response = httpx.post(url, content=data, timeout=30,
                          headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    error = error_of(response, 400)
    # byte N counted from 1, as run-batch's message for a line that is not UTF-8 counts it
    assert error["message"] == (f"the request body is not UTF-8 text (byte {data.index(0xE9) + 1} is 0xe9); send "
                                "JSON encoded as UTF-8")


def test_the_byte_not_utf8_after_a_byte_order_mark_is_counted_as_sent(server):
    """A UTF-8 byte order mark is dropped before the body is decoded, and the byte named was counted without it:
    `{"a":"caf\\xe9"}` behind the mark was "byte 10", where byte 13 of the body sent is 0xe9."""
    data = b"\xef\xbb\xbf" + json.dumps(chat(messages=[{"role": "user", "content": "café"}]),
                                        ensure_ascii=False).encode("latin-1")
    response = httpx.post(server.base_url + "/chat/completions", content=data, timeout=30,
                          headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert error_of(response, 400)["message"] == (
        f"the request body is not UTF-8 text (byte {data.index(0xE9) + 1} is 0xe9); send JSON encoded as UTF-8")


def nested(depth: int) -> dict:
    value: dict = {"type": "string"}
    for _ in range(depth):
        value = {"type": "object", "properties": {"a": value}}
    return value


@pytest.mark.parametrize(("path", "body"), [
    ("/chat/completions", chat(response_format={"type": "json_schema", "json_schema": {"name": "deep",
                                                                                      "schema": nested(100)}})),
    ("/chat/completions", chat(tools=[{"type": "function", "function": {"name": "f", "parameters": nested(100)}}])),
    ("/responses", {"model": "tiny", "input": "hi", "tools": [{"type": "function", "name": "f",
                                                              "parameters": nested(100)}]}),
])
def test_a_body_nested_past_the_parser_s_limit_is_400_saying_so_not_invalid_json(server, path, body):
    """QA: a valid schema some 200 levels deep was "the request body is not valid JSON: Invalid JSON: recursion limit
    exceeded", with param null."""
    error = error_of(post(server, body, path=path), 400)
    field = next(key for key in ("response_format", "tools") if key in body)
    assert error["param"] == field and error["message"].startswith(f"{field}: objects and arrays nest more than 200 "
                                                                   "levels deep here")
    assert "not valid JSON" not in error["message"]


def test_a_body_nested_past_python_s_parser_too_is_400_naming_no_field(server):
    error = error_of(post(server, b"[" * 5000 + b"]" * 5000), 400)
    assert error["param"] is None and error["message"].startswith("the request body: objects and arrays nest")


@pytest.mark.parametrize("body", [b'{"metadata": ' + b"[" * 300 + b"]" * 300 + b",}", b"[" * 300 + b"]" * 299])
def test_a_body_nested_past_the_parser_s_limit_that_is_not_json_is_not_called_valid(server, body):
    """QA: a body nested past the limit with a syntax error further on was answered "the body is valid JSON, but
    flatten them"; Python's parser reads it to the error."""
    error = error_of(post(server, body), 400)
    assert error["param"] is None and error["message"].startswith("the request body is not valid JSON: ")


def test_a_body_nested_past_python_s_parser_too_is_not_called_valid_json(server):
    """`[` 5,000 times and nothing more: neither parser reads far enough to know whether it is JSON."""
    error = error_of(post(server, b"[" * 5000), 400)
    assert error["message"].startswith("the request body: objects and arrays nest")
    assert "valid JSON" not in error["message"]


USER = '{"role": "user", "content": "hi"}'


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/chat/completions", f'{{"model": "tiny", "model": "tiny", "messages": [{USER}]}}', "model"),
    ("/chat/completions", f'{{"model": "tiny", "messages": [{USER}], "max_tokens": 1, "max_tokens": 2}}',
     "max_tokens"),
    ("/chat/completions", '{"model": "tiny", "messages": [{"role": "user", "content": "a", "content": "b"}]}',
     "messages[0].content"),
    ("/chat/completions", f'{{"model": "tiny", "messages": [{USER}], "metadata": {{"k": "1", "k": "2"}}, '
                          '"metadata": {}}', "metadata"),  # the outer repeat first
    ("/completions", '{"model": "tiny", "prompt": "hi", "prompt": "bye"}', "prompt"),
    ("/responses", '{"model": "tiny", "input": [{"role": "user", "role": "system", "content": "hi"}]}',
     "input[0].role"),
])
def test_a_key_given_twice_in_one_object_is_400_naming_it(server, path, body, param):
    """The last value silently won: a client (or a proxy that reads the first) meant another request."""
    error = error_of(post(server, body.encode(), path=path), 400)
    assert error["param"] == param and error["message"].startswith(f"{param}: given more than once")


@pytest.mark.parametrize(("path", "body", "param", "endpoint"), [
    ("/completions", {"model": "tiny", "messages": MESSAGES}, "prompt", "/v1/chat/completions"),
    ("/chat/completions", {"model": "tiny", "prompt": "hi"}, "messages", "/v1/completions"),
    ("/chat/completions", {"model": "tiny", "input": "hi"}, "messages", "/v1/responses"),
    ("/responses", {"model": "tiny", "messages": MESSAGES}, "input", "/v1/chat/completions"),
])
def test_a_body_posted_to_another_endpoint_is_400_naming_the_endpoint_it_belongs_to(server, path, body, param,
                                                                                    endpoint):
    """A chat body posted to /v1/completions was told `prompt: must be a string, a list of strings, ...`, and a
    completion body posted to chat `messages: Field required`: neither said the body was sent to the wrong URL."""
    error = error_of(post(server, body, path=path), 400)
    assert error["param"] == param
    assert error["message"].startswith(f"{param}: missing, and `{next(iter(set(body) - {'model'}))}` is a {endpoint} "
                                       f"field: send this body to {endpoint}")


def test_a_key_repeated_across_sibling_objects_is_no_duplicate(server):
    body = f'{{"model": "tiny", "messages": [{USER}, {{"role": "assistant", "content": "yo"}}, {USER}], ' \
           '"max_tokens": 2, "chat_template_kwargs": {"current_date": "2026-01-01"}}'
    assert post(server, body.encode()).status_code == 200


@pytest.mark.parametrize(("fields", "param"), [
    ({"messages": None}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": ["hi"]}, "messages[0]"),
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": 1e39}, "temperature"),
    ({"repetition_penalty": 1e-39}, "repetition_penalty"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"top_p": 0}, "top_p"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"stop": [1]}, "stop"),
    ({"frobnicate": True}, "frobnicate"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"n": 5}, "n"),
    ({"seed": 2**70}, "seed"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"reasoning_effort": "extreme"}, "reasoning_effort"),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {
        "name": "f", "arguments": "[1]"}}]}]}, "messages[0].tool_calls[0].function.arguments"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "foo": 1, "function": {"name": "f", "bar": 2}}]}, "tools[0].foo"),
    ({"tools": [WEATHER_TOOL, {"type": "function", "function": {"name": "f", "bar": 2}}]}, "tools[1].function.bar"),
    ({"tools": [{"name": "f", "parameters": {}, "color": "red"}]}, "tools[0].color"),  # a bare function object
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": ""}}]}]},
     "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "file", "file": {}}]}]},
     "messages[0].content[1]"),
    ({"messages": [{"role": "critic", "content": "x"}]}, "messages[0].role"),
    ({"use_beam_search": True, "temperature": -0.5}, "temperature"),
])
def test_schema_and_value_errors_are_400_naming_the_field(server, fields, param):
    error = error_of(post(server, chat(**fields)), 400)
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize(("fields", "param", "words"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 3}}}},
     "response_format.json_schema.schema", "grammar engine refused"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "required"),
    ({"response_format": {"type": "yaml"}}, "response_format.type", "not one of"),
    ({"response_format": {"type": ["json_object"]}}, "response_format.type", "not one of"),  # was a 500
    ({"response_format": {"type": {"type": "text"}}}, "response_format.type", "not one of"),
    ({"functions": [{"name": "f"}]}, "functions", "tools"),
    ({"tool_choice": "required"}, "tool_choice", "needs `tools`"),
    # the SDK's custom tool: was "tools[0].custom: unknown field", a field the type it named does have
    ({"tools": [{"type": "custom", "custom": {"name": "grep"}}]}, "tools[0].type", "only 'function' tools"),
    ({"tools": [WEATHER_TOOL, {"type": "web_search", "filters": {}}]}, "tools[1].type", "only 'function' tools"),
    ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "not among the declared tools"),
])
def test_fields_that_would_change_the_output_are_refused_not_ignored(server, fields, param, words):
    error = error_of(post(server, chat(**fields)), 400)
    assert error["param"] == param and words in error["message"]


@pytest.mark.parametrize("value", [0, 0.0, 1, "none"])
@pytest.mark.parametrize("name", ["functions", "function_call", "audio", "prediction", "web_search_options"])
def test_an_unsupported_field_given_a_falsy_number_is_refused_too(server, name, value):
    """Only null and false leave these fields unset: 0 and 0.0 equal False in Python, and were taken silently
    (`audio: 0` answered 200) where 1 was refused."""
    error = error_of(post(server, chat(**{name: value})), 400)
    assert error["param"] == name and "not supported" in error["message"]


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/chat/completions", chat(logprobs=True, top_logprobs=-1), "top_logprobs"),
    ("/chat/completions", chat(prompt_logprobs=-1), "prompt_logprobs"),
    ("/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 1, "logprobs": -1}, "logprobs"),
    ("/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 1, "prompt_logprobs": -1}, "prompt_logprobs"),
    ("/responses", {"model": "tiny", "input": "hi", "top_logprobs": -1}, "top_logprobs"),
])
def test_vllms_every_token_logprobs_is_refused_saying_so(server, path, body, param):
    """vLLM's server takes -1 for the whole vocabulary; the 400 says that is what is unsupported, as
    SamplingParams does (was 'Input should be greater than or equal to 0')."""
    error = error_of(post(server, body, path=path), 400)
    assert error["param"] == param
    assert error["message"] == (f"{param}: -1 (vLLM's every token of the vocabulary) is not supported; give the "
                                "number of most likely tokens wanted, at most 20")


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 1, "logprobs": True}, "logprobs"),
    ("/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 1, "logprobs": False}, "logprobs"),
    ("/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 1, "prompt_logprobs": True}, "prompt_logprobs"),
    ("/chat/completions", chat(logprobs=True, top_logprobs=True), "top_logprobs"),
    ("/responses", {"model": "tiny", "input": "hi", "top_logprobs": True}, "top_logprobs"),
])
def test_a_boolean_logprob_count_is_refused_saying_it_takes_a_number(server, path, body, param):
    """Legacy completions' `logprobs` is a count (OpenAI's API types it an integer, 0 to 5); chat's is the boolean.
    vLLM's server reads true as 1 silently; the 400 says what to send (was 'Input should be a valid integer')."""
    error = error_of(post(server, body, path=path), 400)
    assert error["param"] == param
    assert error["message"] == (f"{param}: {str(body[param]).lower()} is not a number; give the number of most likely "
                                "tokens wanted, 0 to 20 (chat completions' logprobs is the boolean)")


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 1, "logprobs": 21}, "logprobs"),
    ("/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 1, "prompt_logprobs": 10**30}, "prompt_logprobs"),
    ("/chat/completions", chat(logprobs=True, top_logprobs=21), "top_logprobs"),
    ("/responses", {"model": "tiny", "input": "hi", "top_logprobs": 21}, "top_logprobs"),
])
def test_a_logprob_count_over_the_limit_is_refused_naming_the_limit_and_that_no_flag_raises_it(server, path, body,
                                                                                                 param):
    """The 400 was pydantic's "Input should be less than or equal to 20": vLLM's server raises its limit with
    --max-logprobs, which Glimmer takes only at 20, so the message says so."""
    error = error_of(post(server, body, path=path), 400)
    assert error["param"] == param
    assert error["message"] == (f"{param}: more than the server's limit of 20 most likely tokens; ask for 20 or fewer "
                                "(vLLM's --max-logprobs does not raise it here)")


def test_the_completions_limits_the_readme_states_are_400s_naming_the_field(server):
    """The README's `/v1/completions` limits: at most 64 prompts, no `suffix` (an empty one too, as vLLM refuses
    it), `best_of` only unset or equal to n."""
    completion = {"model": "tiny", "max_tokens": 1}
    assert post(server, {**completion, "prompt": ["x"] * 64}, path="/completions").status_code == 200
    for fields, param, words in (({"prompt": ["x"] * 65}, "prompt", "at most 64 prompts"),
                                 ({"prompt": "x", "suffix": ""}, "suffix", "not supported"),
                                 ({"prompt": "x", "best_of": 2}, "best_of", "equal to n (1)")):
        error = error_of(post(server, {**completion, **fields}, path="/completions"), 400)
        assert error["param"] == param and words in error["message"], error


@pytest.mark.parametrize("n", [0, -1, 5, 10**9, 2**70])
@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
def test_every_n_out_of_range_gets_one_message_naming_the_range(server, n, path):
    body = chat(n=n) if path == "/chat/completions" else {"model": "tiny", "prompt": "hi", "max_tokens": 1, "n": n}
    error = error_of(post(server, body, path=path), 400)
    assert (error["param"], error["message"]) == ("n", "n: must be between 1 and 4")  # the server's max_n


def test_a_tool_declaration_with_every_field_it_may_have_is_accepted(client):
    function = {**WEATHER_TOOL["function"], "strict": False, "description": None}  # null is unset
    response = client.chat.completions.create(**sdk_chat(tools=[{"type": "function", "function": function}]))
    assert response.choices


def test_harmless_fields_and_neutral_values_are_accepted(client):
    response = client.chat.completions.create(**sdk_chat(extra_body={"skip_special_tokens": True}), user="u1",
                                              metadata={"k": "v"}, store=False, response_format={"type": "text"},
                                              logit_bias={})
    assert response.choices


def test_prompt_plus_max_tokens_over_max_model_len_is_400(server):
    error = error_of(post(server, chat(max_tokens=5000)), 400)
    assert error["param"] == "max_tokens" and "max_model_len" in error["message"]
    streamed = post(server, chat(max_tokens=5000, stream=True))
    assert streamed.status_code == 400  # refused before the stream starts, so still a status


def test_a_completions_prompt_too_long_names_the_prompt(server):
    """The engine names `messages` (the chat field) for a prompt that cannot fit; /v1/completions has `prompt`."""
    for words in (1500, 5500):  # over max_model_len in tokens, and far over (under the body size limit)
        response = post(server, {"model": "tiny", "prompt": "lighthouse " * words, "max_tokens": 1},
                        path="/completions")
        error = error_of(response, 400)
        assert error["param"] == "prompt" and "messages" not in error["message"], error


@pytest.mark.parametrize(("prompt", "param"), [([], "prompt"), ([[]], "prompt[0]"), ([[50], []], "prompt[1]")])
def test_an_empty_completions_prompt_is_named(server, prompt, param):
    error = error_of(post(server, {"model": "tiny", "prompt": prompt, "max_tokens": 1}, path="/completions"), 400)
    assert (error["param"], error["message"]) == (param, f"{param}: must not be empty")


@pytest.mark.parametrize(("prompt", "param"), [("", "prompt"), (["lighthouse " * 8, ""], "prompt[1]")])
def test_an_empty_text_prompt_without_the_bos_is_named_and_admits_none_of_its_batch(server, prompt, param):
    """Under vLLM's add_special_tokens false an empty text has no token: the engine refused it as "the prompt is empty"
    (no field, no fix), and only after the batch's earlier prompts were admitted and prefilled for the 400."""
    admitted = server.wait_for_idle()["glimmer_prompt_tokens_total"]
    body = {"model": "tiny", "prompt": prompt, "add_special_tokens": False, "max_tokens": 3}
    error = error_of(post(server, body, path="/completions"), 400)
    assert error["param"] == param and error["message"].startswith(f"{param}: must not be empty"), error
    assert "add_special_tokens" in error["message"]
    assert server.wait_for_idle()["glimmer_prompt_tokens_total"] == admitted


def test_a_prompt_over_max_model_len_is_said_to_exceed_it(server):
    """A prompt longer than the context exceeds it (it said "leaves no room to generate", as for one that fills it)."""
    limit = server.engine.engine.max_model_len
    opening = f"This model's maximum context length is {limit} tokens (max_model_len), but the prompt has"
    for length, words in ((limit + 1, "; shorten the prompt"), (limit, ", which leaves no room to generate; shorten "
                                                                       "the prompt")):
        error = error_of(post(server, {"model": "tiny", "prompt": [50] * length, "max_tokens": 1},
                              path="/completions"), 400)
        assert (error["param"], error["message"]) == ("prompt", f"{opening} {length} tokens{words}")


@pytest.mark.parametrize("too_long", ["ids", "text", "characters"])
def test_the_prompt_of_a_batch_the_context_cannot_hold_is_named_by_its_index(server, too_long):
    """A batch of many prompts was answered "the prompt has ... tokens", `param: prompt`: which one, it did not say."""
    limit = server.engine.engine.max_model_len
    prompt = {"ids": [[50], [50] * (limit + 1)], "text": ["hi", "lighthouse " * limit],
              "characters": ["hi", "x" * (server.engine.engine.max_prompt_chars + 1)]}[too_long]
    error = error_of(post(server, {"model": "tiny", "prompt": prompt, "max_tokens": 1}, path="/completions"), 400)
    assert error["param"] == "prompt[1]" and error["message"].startswith("prompt[1]: ") and "the prompt has " in error[
        "message"]
    assert error["message"].endswith("shorten the prompt")


@pytest.mark.parametrize("field", ["max_tokens", "min_tokens"])
def test_a_generation_length_a_prompt_of_the_batch_leaves_no_room_for_names_that_prompt(server, field):
    """It was "prompt (N tokens) + max_tokens ... exceeds max_model_len" for a batch whose first prompt fits: which
    prompt, it did not say. The field to lower stays the param."""
    limit = server.engine.engine.max_model_len
    room = 4
    length = {"max_tokens": {"max_tokens": room + 1}, "min_tokens": {"min_tokens": room + 1, "max_tokens": None}}
    body = {"model": "tiny", "prompt": [[50], [50] * (limit - room)], **length[field]}
    error = error_of(post(server, body, path="/completions"), 400)
    assert error["param"] == field and error["message"].startswith("prompt[1]: ")
    assert f"{limit - room}" in error["message"], error


def test_a_batch_refused_for_a_later_prompt_admits_none_of_its_prompts(server):
    """prompt[0] was admitted and prefilled before prompt[1] was refused: the 400 waited for its first token, and
    /metrics counted its tokens for a request that was refused."""
    limit = server.engine.engine.max_model_len
    admitted = server.wait_for_idle()["glimmer_prompt_tokens_total"]
    body = {"model": "tiny", "prompt": [[50] * 8, [50] * (limit - 2)], "max_tokens": 3}
    assert error_of(post(server, body, path="/completions"), 400)["param"] == "max_tokens"
    assert server.wait_for_idle()["glimmer_prompt_tokens_total"] == admitted


def test_an_image_part_on_a_text_only_checkpoint_is_400_naming_the_part(server):
    content = [{"type": "text", "text": "what is this?"},
               {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    error = error_of(post(server, chat(messages=[{"role": "user", "content": content}])), 400)
    assert error["param"] == "messages[0].content[1]" and "vision" in error["message"]


def test_a_bos_typed_in_message_text_stays_text(server):
    # P-TMPL-5: the prompt keeps its one bos; with --allow-control-tokens-in-content this is a 400 (tests/reliability)
    response = post(server, chat(messages=[{"role": "user", "content": "<|begin_of_text|>hi"}]))
    assert response.status_code == 200, response.text


def test_unknown_model_is_404(server, client):
    error = error_of(post(server, chat(model="gpt-4o")), 404)
    assert error["code"] == "model_not_found" and error["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    assert error_of(httpx.get(server.url + "/v1/nothing-here", headers={"Authorization": f"Bearer {KEY}"}),
                    404)["code"] == "not_found"


def test_an_empty_model_is_the_served_model_as_vllm_takes_it(server):
    """vLLM reads an empty `model` as one left out (serving_engine._is_model_supported: `if not model_name`), and
    clients whose model setting is blank send it so: Glimmer answered 404 "the model '' does not exist here"."""
    for path, body in (("/chat/completions", chat(model="")), ("/completions", {"prompt": "hi", "max_tokens": 2}),
                       ("/responses", {"input": "hi", "max_output_tokens": 16})):
        answered = post(server, {**body, "model": ""}, path=path)
        assert answered.status_code == 200 and answered.json()["model"] == "tiny", answered.text
    tokenized = [httpx.post(server.url + "/tokenize", json={**model, "prompt": "hi"},
                            headers={"Authorization": f"Bearer {KEY}"}) for model in ({"model": ""}, {})]
    assert tokenized[0].status_code == 200, tokenized[0].text
    assert tokenized[0].json() == tokenized[1].json()


def test_a_client_whose_base_url_lacks_v1_is_told_where_the_route_is(server):
    """A base URL without its /v1 (`http://HOST:PORT`) is a common slip, and the 404 said only "Not Found". It names
    the URL, as OpenAI's 404 does, and the route this server serves it at."""
    no_v1 = openai.OpenAI(base_url=server.url, api_key=KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError, match=r"Invalid URL \(POST /chat/completions\); this server serves "
                                                   r"/v1/chat/completions: give the client a base URL ending in /v1"):
        no_v1.chat.completions.create(**sdk_chat())
    with pytest.raises(openai.NotFoundError, match="this server serves /v1/models"):
        no_v1.models.list()
    error = error_of(httpx.get(server.url + "/v1/nothing-here", headers={"Authorization": f"Bearer {KEY}"}), 404)
    assert (error["message"], error["code"]) == ("Invalid URL (GET /v1/nothing-here)", "not_found")


def test_a_client_whose_base_url_lacks_v1_is_told_where_a_route_with_a_parameter_is(server):
    """The hint was given for the fixed paths alone (`/models`, `/chat/completions`): `models.retrieve` and the
    stored-response routes, whose paths hold an id, got a bare 404, and so did such a path with /v1 twice."""
    no_v1 = openai.OpenAI(base_url=server.url, api_key=KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError) as raised:
        no_v1.models.retrieve("tiny")
    assert raised.value.body["message"] == ("Invalid URL (GET /models/tiny); this server serves /v1/models/tiny: give "
                                            "the client a base URL ending in /v1 (http://HOST:PORT/v1)")
    with pytest.raises(openai.NotFoundError, match="this server serves /v1/responses/resp_x/input_items: give"):
        no_v1.responses.input_items.list("resp_x")
    twice = error_of(httpx.get(server.base_url + "/v1/models/tiny", headers={"Authorization": f"Bearer {KEY}"}), 404)
    assert twice["message"] == ("Invalid URL (GET /v1/v1/models/tiny); this server serves /v1/models/tiny: give the "
                                "client a base URL ending in one /v1 (http://HOST:PORT/v1)")


def test_the_sdks_stored_chat_completion_calls_are_told_glimmer_keeps_none(client):
    """`chat.completions.retrieve`, `update`, `delete`, `messages.list` and `list` (OpenAI's stored chat completions,
    made with `store: true`, which Glimmer takes and ignores) answered "Invalid URL (GET /v1/chat/completions/ID)" and
    "Method not allowed (GET /v1/chat/completions); this route takes POST", as if the client were misconfigured."""
    kept_none = ("Glimmer keeps no chat completions (`store` is accepted and changes nothing): send the messages again "
                 "to continue a conversation, or use /v1/responses, which stores responses")
    # the list is GET on the route that takes POST (405); the others name a route of their own, none served (404)
    calls = [(lambda: client.chat.completions.retrieve("chatcmpl-x"), 404),
             (lambda: client.chat.completions.delete("chatcmpl-x"), 404),
             (lambda: client.chat.completions.update("chatcmpl-x", metadata={"a": "b"}), 404),
             (lambda: client.chat.completions.messages.list("chatcmpl-x"), 404),
             (lambda: client.chat.completions.list(), 405)]
    for call, status in calls:
        with pytest.raises(openai.APIStatusError) as raised:
            call()
        assert raised.value.status_code == status, raised.value.body["message"]
        assert raised.value.body["message"].endswith("; " + kept_none), raised.value.body["message"]


def test_a_client_whose_base_url_has_v1_twice_is_told_to_give_it_once(server):
    """A base URL ending in /v1 given to a client that adds /v1 itself (`/v1/v1/chat/completions`) was told the route
    is served "at the root, beside /v1, as vLLM does", which is said of /tokenize and /health, not of a /v1 route."""
    twice = openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError) as raised:
        twice.chat.completions.create(**sdk_chat())
    assert raised.value.body["message"] == (
        "Invalid URL (POST /v1/v1/chat/completions); this server serves /v1/chat/completions: give the client a base "
        "URL ending in one /v1 (http://HOST:PORT/v1)")
    assert "ending in one /v1" in error_of(httpx.get(server.base_url + "/v1/models"), 404)["message"]


def test_a_route_served_beside_v1_asked_for_under_it_is_told_where_the_route_is(server):
    """A client joining its base URL (`http://HOST:PORT/v1`) to vLLM's /tokenize, /health, ... got a bare 404."""
    error = error_of(post(server, {"prompt": "hi"}, path="/tokenize"), 404)
    assert error["message"] == ("Invalid URL (POST /v1/tokenize); this server serves /tokenize at the root, beside "
                                "/v1, as vLLM does (http://HOST:PORT/tokenize)")
    assert "serves /health at the root" in error_of(httpx.get(server.base_url + "/health"), 404)["message"]
    assert error_of(httpx.get(server.base_url + "/"), 404)["message"] == "Invalid URL (GET /v1/)"


@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/v1/chat/completions/"), ("POST", "/v1/completions/"), ("POST", "/v1/responses/"),
    ("GET", "/v1/models/"), ("GET", "/v1/models/tiny/"), ("GET", "/v1/responses/resp_x/"), ("POST", "/tokenize/"),
    ("GET", "/health/"), ("GET", "/metrics/"), ("POST", "/invocations/"),
])
def test_a_path_with_a_trailing_slash_is_an_openai_404_naming_the_route(server, method, path):
    """Such a path was a 307 redirect to the route without the slash: a POST client that follows no redirect (curl
    without -L, many an HTTP library's default) got no answer, and behind a proxy the redirect could name a URL the
    client cannot reach. It is a 404 in OpenAI's shape, as OpenAI answers an unknown URL, naming the route; a served
    model's path with the slash too, which read as a model 'tiny/' that does not exist."""
    response = httpx.request(method, server.url + path, json={}, headers={"Authorization": f"Bearer {KEY}"})
    error = error_of(response, 404)
    assert "location" not in response.headers
    assert error["message"] == (f"Invalid URL ({method} {path}); this server serves {path.rstrip('/')}: drop the "
                                "trailing slash")
    assert error["code"] == "not_found"


def test_a_missing_page_file_with_a_trailing_slash_is_not_said_to_be_served_without_it(server):
    """The 404 of `/static/nothing.js/` said "this server serves /static/nothing.js: drop the trailing slash", and that
    path is a 404 too: the mount's 404 carries the mount as its endpoint, which was taken for a page file at any path
    (a page file that is there is served with the slash as without it)."""
    error = error_of(httpx.get(server.url + "/static/nothing.js/"), 404)
    assert error["message"] == "Invalid URL (GET /static/nothing.js/)"
    assert httpx.get(server.url + "/static/chat.js/").status_code == 200


@pytest.mark.parametrize("path", ["/static/models", "/static/tokenize/", "/static/v1/models/tiny/"])
@pytest.mark.parametrize("root_path", ["", "/api"])
def test_a_page_file_not_there_is_told_of_no_route_the_mount_names_for_itself(server, path, root_path):
    """Inside the page files' mount a request's root path is the mount's (`/static`), and the 404 of a page file not
    there read its hints against it: `/static/models` was told "this server serves /static/v1/models", and
    `/static/tokenize/` "this server serves /static/tokenize: drop the trailing slash", paths that are 404s too."""
    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=server.app, root_path=root_path)  # the scope uvicorn makes
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
            return await client.get(root_path + path)

    assert error_of(asyncio.run(get()), 404)["message"] == f"Invalid URL (GET {root_path}{path})"


def test_a_wrong_method_is_405_with_an_error_body(server):
    response = httpx.get(server.base_url + "/chat/completions", headers={"Authorization": f"Bearer {KEY}"})
    assert error_of(response, 405)["type"] == "invalid_request_error"


@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("DELETE", "/ping", "GET, HEAD, POST"),
    ("PUT", "/v1/responses/resp_x", "GET, HEAD, DELETE"),
    ("POST", "/v1/models", "GET, HEAD"),
    ("GET", "/tokenize", "POST"),
])
def test_a_405_allows_every_method_the_path_takes_and_names_them(server, method, path, allowed):
    """Allow named only the first route's methods (`GET` for /ping, which takes HEAD and POST too), where RFC 9110
    §15.5.6 has a 405 list all of them; the body said only "Method Not Allowed"."""
    response = httpx.request(method, server.url + path, headers={"Authorization": f"Bearer {KEY}"})
    assert response.headers["allow"] == allowed
    assert error_of(response, 405)["message"] == f"Method not allowed ({method} {path}); this route takes {allowed}"


@pytest.mark.parametrize("method", ["GET", "HEAD", "DELETE", "PUT"])
@pytest.mark.parametrize("path", ["/v1/responses/compact", "/v1/responses/input_tokens"])
def test_a_wrong_method_on_a_responses_route_of_its_own_is_a_405_naming_post(server, method, path):
    """GET, HEAD or DELETE of /v1/responses/compact or /input_tokens was routed as a stored response's and answered
    404 "no stored response 'compact'", and PUT's 405 allowed the stored response's GET, HEAD and DELETE: these paths
    are routes of their own, which take POST alone."""
    response = httpx.request(method, server.url + path, headers={"Authorization": f"Bearer {KEY}"})
    assert response.status_code == 405 and response.headers["allow"] == "POST"
    if method != "HEAD":
        assert error_of(response, 405)["message"] == f"Method not allowed ({method} {path}); this route takes POST"


def test_a_wrong_method_on_a_page_file_is_a_405_naming_the_methods_it_takes_too(server):
    """The page files' 405 said only "Method Not Allowed", where every other route's names the methods it takes."""
    response = httpx.post(server.url + "/static/chat.js")
    assert response.headers["allow"] == "GET, HEAD"
    assert error_of(response, 405)["message"] == "Method not allowed (POST /static/chat.js); this route takes GET, HEAD"


def test_a_page_file_s_405_names_get_and_head_where_starlette_s_has_no_allow(server, monkeypatch):
    """The page files' 405 took its methods from the Allow header of Starlette's StaticFiles 405, which not every
    Starlette version sets: without it the message was "Method Not Allowed" alone, and the response had no Allow."""
    async def refused_without_allow(self, path, scope):
        raise HTTPException(status_code=405)

    monkeypatch.setattr(StaticFiles, "get_response", refused_without_allow)
    response = httpx.post(server.url + "/static/chat.js")
    assert response.headers["allow"] == "GET, HEAD"
    assert error_of(response, 405)["message"] == "Method not allowed (POST /static/chat.js); this route takes GET, HEAD"


@pytest.mark.parametrize("asked", ["bytes=abc", "items=0-1", "bytes=5-1", "bytes=999999999-", "bytes=0-9"])
def test_the_page_s_files_are_sent_whole_whatever_range_is_asked(server, asked):
    """A Range Starlette could not read was a plain-text 400, one past the file an empty 416 (RFC 9110 §14.2 lets a
    server ignore Range; it has one ignore a unit it does not know, as `items`)."""
    for path in ("/", "/static/chat.js"):
        whole = httpx.get(server.url + path)
        response = httpx.get(server.url + path, headers={"Range": asked})
        assert response.status_code == 200 and response.content == whole.content, (path, response.text[:200])
        assert response.headers["accept-ranges"] == "none" and "content-range" not in response.headers, path


@pytest.mark.parametrize(("asked", "refused"), [
    ({"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}, "origin"),
    ({"Origin": "https://app.example", "Access-Control-Request-Method": "PATCH"}, "method"),
])
def test_a_refused_cors_preflight_is_an_openai_style_400_with_the_cors_headers(make_tiny, asked, refused):
    """Starlette's refusal was plain text ("Disallowed CORS origin")."""
    with live_server(make_tiny(), scripted=True, allowed_origins=("https://app.example",)) as live:
        response = httpx.options(live.base_url + "/chat/completions", headers=asked)
    error = error_of(response, 400)
    assert error["code"] == "cors_preflight_refused" and f"the {refused} it asks for" in error["message"]
    assert response.headers["access-control-allow-methods"] == "GET, POST, DELETE"
    assert "origin" in response.headers["vary"].lower()


def test_the_retry_headers_of_an_error_are_exposed_to_a_cross_origin_page(make_tiny):
    """A 500's `x-should-retry: false` (which the openai SDKs obey instead of retrying twice) and a 429's or 503's
    `Retry-After` were hidden from a page of an --allowed-origins site: a browser hides a response header CORS does
    not expose, so the OpenAI JS SDK in the page saw no such header and retried a 500 the server said not to."""
    with live_server(make_tiny(), scripted=True, allowed_origins=("https://app.example",)) as live:
        response = httpx.get(live.base_url + "/models", headers={"Origin": "https://app.example"})
    exposed = response.headers["access-control-expose-headers"].lower().split(", ")
    assert {"x-should-retry", "retry-after"} <= set(exposed), exposed


def test_a_431_for_too_many_headers_carries_the_cors_and_request_id_headers(make_tiny):
    """The header count limit answered outside the CORS and request id middlewares: its 431 had no
    Access-Control-Allow-Origin (a page could not read why it was refused) and no X-Request-Id, where every other
    response, errors included, carries both."""
    with live_server(make_tiny(), scripted=True, allowed_origins=("https://app.example",), request_id_headers=True,
                     max_header_count=8) as live:
        # httpx sends 5 of its own: 8 in all is within the limit, the id the server adds for the request not counted
        at_the_limit = httpx.get(live.url + "/health", headers={"Origin": "https://app.example", "x-a": "1",
                                                                "x-b": "1"})
        assert at_the_limit.status_code == 200 and len(at_the_limit.request.headers) == 8, at_the_limit.text
        headers = {"Origin": "https://app.example", **{f"x-extra-{i}": "1" for i in range(8)}}
        response = httpx.get(live.url + "/health", headers=headers)
        assert error_of(response, 431)["code"] == "request_header_fields_too_large"
        assert response.headers["access-control-allow-origin"] == "https://app.example"
        assert response.headers["x-request-id"]
        assert live.metrics()['glimmer_requests_total{endpoint="/health",status="431"}'] == 1


def test_an_empty_request_id_header_counts_toward_the_header_limit(make_tiny):
    """--enable-request-id-headers replaces an empty X-Request-Id with one it makes, leaving the count unchanged, but
    the limit took one off as for a header the server added: a client one header over the limit got through."""
    with live_server(make_tiny(), scripted=True, request_id_headers=True, max_header_count=8) as live:
        # httpx sends 5 of its own: with the client's empty X-Request-Id, 9 in all
        headers = {"x-a": "1", "x-b": "1", "x-c": "1", "X-Request-Id": ""}
        response = httpx.get(live.url + "/health", headers=headers)
        assert len(response.request.headers) == 9, response.request.headers
        assert error_of(response, 431)["code"] == "request_header_fields_too_large"
        assert "has 9 header fields" in error_of(response, 431)["message"]
        del headers["x-b"]
        assert httpx.get(live.url + "/health", headers=headers).status_code == 200


@pytest.mark.parametrize("path", ["/v1/realtime?model=tiny", "/v1/chat/completions"])
def test_a_websocket_handshake_is_an_openai_style_400(server, path):
    """No route takes a WebSocket: Starlette closed the handshake, which uvicorn sent as a bodiless 403."""
    url = httpx.URL(server.url)
    with socket.create_connection((url.host, url.port), timeout=30) as connection:
        connection.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                           "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
        received = b"".join(iter(lambda: connection.recv(65536), b""))
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), received
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "websocket_not_supported"
    assert f"asked at {path.split('?')[0]}" in error["message"]


def test_head_answers_where_get_does_as_health_probes_send_it(server):
    auth = {"Authorization": f"Bearer {KEY}"}
    for path, headers in (("/health", {}), ("/", {}), ("/v1/models", auth), ("/v1/models/tiny", auth),
                          ("/metrics", {})):
        head, get = httpx.head(server.url + path, headers=headers), httpx.get(server.url + path, headers=headers)
        assert head.status_code == get.status_code == 200 and head.content == b"", path
        assert head.headers["content-type"] == get.headers["content-type"], path
    # a model or a stored response that is not there: 404 for HEAD as for GET (HEAD was 405 on these routes)
    for path in ("/v1/models/gpt-4o", "/v1/responses/resp_missing"):
        head, get = httpx.head(server.url + path, headers=auth), httpx.get(server.url + path, headers=auth)
        assert head.status_code == get.status_code == 404 and head.content == b"", path
    assert httpx.head(server.url + "/v1/models").status_code == 401  # the key is checked on HEAD too


def test_version_and_sagemakers_ping_answer_without_the_key_as_vllms_do(server):
    assert httpx.get(server.url + "/version").json() == {"version": glimmer.__version__}
    for method in ("GET", "POST"):
        assert httpx.request(method, server.url + "/ping").json() == {"status": "ok"}, method
    for path in ("/version", "/ping"):
        head = httpx.head(server.url + path)
        assert head.status_code == 200 and head.content == b"", path
    samples = server.metrics()
    assert samples['glimmer_requests_total{endpoint="/ping",status="200"}'] >= 3
    assert samples['glimmer_requests_total{endpoint="/version",status="200"}'] >= 2


def test_a_body_over_the_size_limit_is_413(server):
    big = chat(messages=[{"role": "user", "content": "x" * (LIMIT + 10)}])
    assert error_of(post(server, big), 413)["code"] == "request_too_large"

    def chunks():  # chunked transfer: no Content-Length, the limit applies while reading
        yield b'{"model": "tiny", "messages": [{"role": "user", "content": "'
        for _ in range(LIMIT // 1024 + 2):
            yield b"y" * 1024
        yield b'"}]}'

    assert error_of(post(server, chunks()), 413)["code"] == "request_too_large"


def test_overload_is_429(server, client):
    engine = server.engine
    engine.max_waiting_requests = 0
    try:
        response = post(server, chat())
        assert error_of(response, 429)["code"] == "engine_overloaded"
        assert response.headers["Retry-After"] == "1"
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(**sdk_chat(), stream=True)
    finally:
        engine.max_waiting_requests = 1024
    assert client.chat.completions.create(**sdk_chat()).choices


def test_an_internal_failure_is_500_without_a_stack_trace_and_is_logged(server, monkeypatch, caplog):
    context = server.app.state.context

    def broken(*args, **kwargs):
        raise RuntimeError("the secret internals")

    monkeypatch.setattr(context.template, "render_prompt", broken)
    with caplog.at_level(logging.ERROR):
        response = post(server, chat())
    error = error_of(response, 500)
    assert error["type"] == "internal_error"
    assert "secret" not in response.text and "Traceback" not in response.text
    assert any("the secret internals" in (record.exc_text or "") or record.exc_info for record in caplog.records)
    assert response.headers["x-should-retry"] == "false"


@pytest.mark.parametrize("raised", [RuntimeError("a bug"), glimmer.errors.ConfigError("a config read mid-request")])
def test_an_internal_error_is_a_500_the_sdk_does_not_retry(server, monkeypatch, raised):
    """Only a failed step, a dead engine and a missed forced call said `x-should-retry: false`: the SDK sent a request
    meeting any other internal error twice more (rendering its prompt each time), though the same request meets the
    same code. Every 500 says so; the retried statuses are 429 and 503."""
    context, calls = server.app.state.context, []

    def broken(*args, **kwargs):
        calls.append(args)
        raise raised

    monkeypatch.setattr(context.template, "render_prompt", broken)
    client = openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=2)
    with pytest.raises(openai.InternalServerError) as refused:
        client.chat.completions.create(**sdk_chat())
    assert refused.value.response.headers["x-should-retry"] == "false" and len(calls) == 1


def test_template_errors_map_to_400_with_the_template_message():
    status, body = describe_error(ChatTemplateError("tool call arguments must be an object"))
    assert status == 400
    assert "tool call arguments must be an object" in body["error"]["message"]


def test_a_media_fetch_refused_for_now_is_a_503_naming_the_part():
    busy = MediaFetchBusyError("image", 0, "http://a.example/b.png cannot be fetched now").at("messages[0].content[1]")
    status, body = describe_error(busy)
    assert status == 503
    assert body["error"]["param"] == "messages[0].content[1]" and body["error"]["code"] == "service_busy"
    assert body["error"]["type"] == "service_unavailable"


def test_bad_requests_never_affect_good_ones(server):
    async def run():
        headers = {"Authorization": f"Bearer {KEY}"}
        async with httpx.AsyncClient(base_url=server.base_url, headers=headers, timeout=60) as http:
            good = [http.post("/chat/completions", json=chat(max_tokens=8, seed=i)) for i in range(4)]
            bad = [http.post("/chat/completions", content=b"{nope", headers={"Content-Type": "application/json"}),
                   http.post("/chat/completions", json=chat(max_tokens=5000)),
                   http.post("/chat/completions", json=chat(model="other")),
                   http.post("/chat/completions", json=chat(logit_bias={"x": 5}))]
            return await asyncio.gather(*good, *bad)

    responses = asyncio.run(run())
    assert [r.status_code for r in responses] == [200] * 4 + [400, 400, 404, 400]
    assert server.engine.is_alive
    assert server.wait_for_idle()['glimmer_kv_blocks_used{group="full"}'] == 0


def test_error_statuses_are_counted_in_metrics(server):
    post(server, chat(model="missing"))
    samples = server.metrics()
    assert samples['glimmer_requests_total{endpoint="/v1/chat/completions",status="404"}'] >= 1
    assert samples['glimmer_requests_total{endpoint="/v1/chat/completions",status="401"}'] >= 1


@pytest.mark.parametrize(("path", "field", "body"), [
    ("/chat/completions", "model", chat(model="m" * 50_000)),
    ("/chat/completions", "messages[0].role", chat(messages=[{"role": "r" * 50_000, "content": "hi"}])),
    ("/chat/completions", "reasoning_effort", chat(reasoning_effort="e" * 50_000)),
    ("/chat/completions", "u" * 50_000, chat(**{"u" * 50_000: 1})),
    ("/completions", "model", {"model": "m" * 50_000, "prompt": "a"}),
    ("/responses", "input[0].type", {"model": "tiny", "input": [{"type": "t" * 50_000}]}),
])
def test_an_error_quotes_a_huge_value_by_its_start_and_length(server, path, field, body):
    """A value of 50,000 characters (a megabyte, under a larger request limit) came back whole in the error, and
    an unknown field's name twice (message and param): the error body grew with whatever the client sent."""
    response = post(server, body, path=path)
    assert response.status_code in (400, 404), response.text
    error = response.json()["error"]
    assert len(response.content) < 2_000, error
    assert "(50,000 characters)" in error["message"] + (error["param"] or ""), error
    assert error["param"] is None or error["param"].startswith(field[:100]), error


@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
@pytest.mark.parametrize(("metadata", "param"), [
    ({"run": 1}, "metadata.run"),  # OpenAI's metadata values are strings
    ({"run": {"nested": "v"}}, "metadata.run"),
    ({f"k{i}": "v" for i in range(17)}, "metadata"),  # at most 16 pairs
    ({"k" * 65: "v"}, "metadata"),  # keys at most 64 characters
    ({"note": "v" * 513}, "metadata.note"),  # values at most 512
])
def test_metadata_over_openais_limits_is_refused_on_chat_and_completions_as_on_responses(server, path, metadata,
                                                                                          param):
    """Chat and completions took any JSON as `metadata` (200,000 keys, numbers, objects) and ignored it, while
    /v1/responses held it to OpenAI's limits: a client moving to OpenAI met the 400 only there."""
    body = chat(metadata=metadata) if path == "/chat/completions" else {"model": "tiny", "prompt": "hi",
                                                                        "max_tokens": 2, "metadata": metadata}
    response = post(server, body, path=path)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.text
    within = {f"k{i}": "v" * 512 for i in range(16)}
    ok = post(server, {**body, "metadata": within}, path=path)
    assert ok.status_code == 200, ok.text


def test_a_failed_step_is_a_500_the_sdk_does_not_retry(make_tiny, monkeypatch):
    """The SDK retries a 500 twice: a request whose run fails its step each time (an activation too large for the
    device) failed three steps in a row, its batch-mates' requests with it each time, and three failed steps in a
    row is the count at which the engine takes itself for broken and the server exits."""
    with live_server(make_tiny(), scripted=True) as live:
        runner = live.engine.engine.runner
        steps = []

        def failing(step):
            steps.append(step)
            raise RuntimeError("out of device memory")

        monkeypatch.setattr(runner, "execute", failing)
        client = openai.OpenAI(base_url=live.base_url, api_key="none", max_retries=2)
        for stream in (False, True):  # a stream's first step fails before its status line is sent
            steps.clear()
            with pytest.raises(openai.InternalServerError) as raised:
                client.chat.completions.create(**sdk_chat(), stream=stream)
            assert raised.value.response.headers["x-should-retry"] == "false"
            assert len(steps) == 1
        monkeypatch.undo()
        assert live.engine.is_alive
        assert client.chat.completions.create(**sdk_chat()).choices
