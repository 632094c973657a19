"""Clients hang up at each moment of the requests that run several sequences or extra machinery: n completions,
beam search, several prompts, a JSON schema's grammar, a required tool call, a Responses stream; and with
speculative decoding. The server comes through unharmed (issue 8): no request fails with a 5xx, nothing runs,
waits or holds a KV block (the drafter's included), and a new request is served.

Each kind is first served whole, then sent again and left: at once, a few milliseconds in (queued, compiling its
grammar, prefilling), during generation, and after reading part of its stream.
"""

from __future__ import annotations

import json

import httpx
import pytest
from reliability_support import assert_healthy, chat_body, open_connection, raw_request, send_and_hang_up
from server_support import WEATHER_TOOL, live_server

from glimmer.tiny import TinyDrafterSpec, write_tiny_drafter

SCHEMA = {"type": "object", "required": ["items"], "properties": {"items": {"type": "array", "items": {
    "type": "object", "properties": {"name": {"type": "string", "pattern": "[a-z]{3,12}"}, "n": {"type": "integer"}}}}}}
KINDS = {
    "chat n=3 streamed": ("/chat/completions", chat_body(n=3, stream=True, max_tokens=40, ignore_eos=True)),
    "chat n=3": ("/chat/completions", chat_body(n=3, max_tokens=40, ignore_eos=True)),
    "beam search": ("/completions", {"prompt": ["a b", "c d"], "use_beam_search": True, "n": 3, "max_tokens": 16}),
    "chat beam search": ("/chat/completions", chat_body(use_beam_search=True, n=2, max_tokens=12)),
    "json schema streamed": ("/chat/completions", chat_body(stream=True, max_tokens=40, response_format={
        "type": "json_schema", "json_schema": {"name": "list", "schema": SCHEMA}})),
    "required tool call streamed": ("/chat/completions", chat_body(stream=True, max_tokens=40, tools=[WEATHER_TOOL],
                                                                    tool_choice="required")),
    "prompts x n streamed": ("/completions", {"prompt": ["a", "b", "c"], "n": 2, "max_tokens": 30,
                                              "ignore_eos": True, "stream": True}),
    "long prompt with prompt logprobs": ("/completions", {"prompt": " ".join(f"w{i}" for i in range(200)),
                                                          "max_tokens": 5, "prompt_logprobs": 2, "echo": True}),
    "responses streamed": ("/responses", {"input": "hi", "max_output_tokens": 40, "stream": True}),
}
MOMENTS_S = (0.0, 0.002, 0.01, 0.05, 0.2)
READ_FIRST_BYTES = (1, 300, 2000)


@pytest.fixture(scope="module")
def drafter(make_tiny, tmp_path_factory):
    return write_tiny_drafter(tmp_path_factory.mktemp("drafter"), make_tiny(), spec=TinyDrafterSpec())


@pytest.fixture(scope="module", params=["plain", "speculative"])
def server(request, make_tiny, drafter):
    options = {"max_model_len": 1024}
    if request.param == "speculative":
        options["speculative_config"] = {"method": "dflash", "model": str(drafter), "num_speculative_tokens": 4,
                                         "draft_policy": "always"}
    with live_server(make_tiny(), engine_options=options) as live:
        yield live


def _server_errors(samples: dict[str, float]) -> dict[str, float]:
    return {key: value for key, value in samples.items()
            if key.startswith("glimmer_requests_total") and 'status="5' in key}


@pytest.mark.parametrize("kind", KINDS)
def test_a_client_hanging_up_at_any_moment_leaves_the_server_unharmed(server, kind):
    path, fields = KINDS[kind]
    body = json.dumps({"model": "tiny", **fields}).encode()
    before = _server_errors(server.metrics())
    served = httpx.post(server.base_url + path, content=body, headers={"Content-Type": "application/json"},
                        timeout=120)
    assert served.status_code == 200, served.text
    request = raw_request(server.base_url, path, body)
    for after_s in MOMENTS_S:
        send_and_hang_up(server.url, request, after_s=after_s)
    for read_first in READ_FIRST_BYTES:
        send_and_hang_up(server.url, request, after_s=0, read_first=read_first)
    with open_connection(server.url) as connection:  # and one that closes while the answer is being written
        connection.sendall(request)
        connection.recv(1)
    samples = assert_healthy(server)
    assert samples.get('glimmer_kv_blocks_used{group="draft"}', 0) == 0
    assert _server_errors(server.metrics()) == before
