"""`cache_salt` through the real server: only requests with the same salt share cached prompt blocks, and
`require_cache_salt` refuses requests without one."""

from __future__ import annotations

import httpx
import pytest
from server_support import PINNED_DATE, live_server

MESSAGES = [{"role": "system", "content": "You answer in one word. " * 8}, {"role": "user", "content": "Hi."}]
PROMPT_IDS = list(range(300, 381))  # 5 full blocks and one token to compute


@pytest.fixture(scope="module")
def server(make_tiny):
    with live_server(make_tiny(), require_cache_salt=True) as live:
        yield live


def _chat(server, **fields) -> httpx.Response:
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 3, "temperature": 0,
            "chat_template_kwargs": PINNED_DATE, **fields}
    return httpx.post(server.base_url + "/chat/completions", json=body, timeout=30)


def _completion(server, **fields) -> httpx.Response:
    body = {"model": "tiny", "prompt": PROMPT_IDS, "max_tokens": 3, "temperature": 0, **fields}
    return httpx.post(server.base_url + "/completions", json=body, timeout=30)


@pytest.mark.parametrize("send", [_chat, _completion])
def test_only_requests_with_the_same_salt_share_cached_prompt_blocks(server, send):
    def cached_tokens(salt: str) -> tuple[int, list]:
        response = send(server, cache_salt=salt)
        assert response.status_code == 200, response.text
        body = response.json()
        return body["usage"]["prompt_tokens_details"]["cached_tokens"], body["choices"]

    name = send.__name__
    first, choices = cached_tokens(f"alice-{name}")
    other, _ = cached_tokens(f"bob-{name}")
    again, same_choices = cached_tokens(f"alice-{name}")
    assert (first, other) == (0, 0)
    assert again > 0 and same_choices == choices
    assert server.metrics()["glimmer_prefix_cache_hit_rate"] > 0


@pytest.mark.parametrize("send", [_chat, _completion])
@pytest.mark.parametrize(("fields", "words"), [
    ({}, "requires a cache_salt"),
    ({"cache_salt": ""}, "non-empty string"),
    ({"cache_salt": 5}, "valid string"),
])
def test_a_missing_or_invalid_cache_salt_is_400_naming_the_field(server, send, fields, words):
    response = send(server, **fields)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "cache_salt" and words in error["message"]
    assert "None" not in error["message"]  # an HTTP client is told to leave the field out, not Python's word


def _response(server, **fields) -> httpx.Response:
    body = {"model": "tiny", "instructions": MESSAGES[0]["content"], "input": "Hi.", "max_output_tokens": 3,
            "temperature": 0, "chat_template_kwargs": PINNED_DATE, **fields}
    return httpx.post(server.base_url + "/responses", json=body, timeout=30)


def test_responses_take_a_cache_salt_that_partitions_the_prefix_cache(server):
    def cached_tokens(salt: str) -> int:
        response = _response(server, cache_salt=salt)
        assert response.status_code == 200, response.text
        return response.json()["usage"]["input_tokens_details"]["cached_tokens"]

    assert (cached_tokens("alice-responses"), cached_tokens("bob-responses")) == (0, 0)
    assert cached_tokens("alice-responses") > 0


def test_a_response_without_a_cache_salt_is_400_naming_the_field(server):
    response = _response(server)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "cache_salt" and "requires a cache_salt" in error["message"]
