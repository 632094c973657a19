"""vLLM's `truncate_prompt_tokens` on /v1/completions and /v1/chat/completions: the prompt's last k tokens are the
request's prompt (its output, usage, echo), -1 is max_model_len, and what cannot be truncated is a 400 naming it."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import pytest
from PIL import Image
from server_support import live_server

MAX_MODEL_LEN = 256
PROMPT = [5, 77, 130, 42, 99, 310, 12, 8, 250, 61, 17, 23]
GREEDY = {"model": "tiny", "temperature": 0, "max_tokens": 5, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(make_tiny):
    with live_server(make_tiny("canonical", vision=True, seed=17),
                     engine_options={"max_model_len": MAX_MODEL_LEN}) as live:
        yield live


def post(server, path: str, **body) -> httpx.Response:
    return httpx.post(server.base_url + path, json={**GREEDY, **body}, timeout=60)


def ok(response: httpx.Response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()


def refused_param(response: httpx.Response) -> str:
    assert response.status_code == 400, response.text
    return response.json()["error"]["param"]


@pytest.mark.parametrize("keep", [1, 4, len(PROMPT) - 1])
def test_a_completion_of_the_last_k_tokens_is_that_prompts(server, keep):
    truncated = ok(post(server, "/completions", prompt=PROMPT, truncate_prompt_tokens=keep, echo=True, logprobs=0))
    direct = ok(post(server, "/completions", prompt=PROMPT[-keep:], echo=True, logprobs=0))
    assert truncated["choices"][0]["text"] == direct["choices"][0]["text"]
    assert truncated["choices"][0]["logprobs"] == direct["choices"][0]["logprobs"]
    assert len(truncated["choices"][0]["logprobs"]["tokens"]) == keep + GREEDY["max_tokens"]  # the echo: k tokens
    assert truncated["usage"]["prompt_tokens"] == keep == direct["usage"]["prompt_tokens"]


def test_a_text_prompt_past_max_model_len_fits_with_minus_one(server):
    text = "the quick brown fox " * 200
    assert refused_param(post(server, "/completions", prompt=text)) == "prompt"
    scored = ok(post(server, "/completions", prompt=text, truncate_prompt_tokens=-1, max_tokens=0, echo=True))
    assert scored["usage"]["prompt_tokens"] == MAX_MODEL_LEN


@pytest.mark.parametrize("path", ["/completions", "/chat/completions"])
def test_a_text_longer_than_any_prompt_the_context_holds_keeps_its_end(server, path):
    """A text past the characters max_model_len tokens can hold, refused before tokenizing without truncation, is
    tokenized and cut to its last k tokens, as vLLM reads it (it was a 400 all the same)."""
    text = "the quick brown fox " * (server.engine.engine.max_prompt_chars // 20 + 1)
    prompt = {"prompt": text} if path == "/completions" else {"messages": [{"role": "user", "content": text}]}
    refused = post(server, path, **prompt)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "context_length_exceeded"
    reply = ok(post(server, path, truncate_prompt_tokens=10, **prompt))
    assert reply["usage"]["prompt_tokens"] == 10 and reply["usage"]["completion_tokens"] == GREEDY["max_tokens"]


@pytest.mark.parametrize("path", ["/completions", "/chat/completions"])
def test_minus_one_leaving_no_room_to_generate_is_a_400_naming_it(server, path):
    """It said to shorten the prompt (or the messages), which -1 would cut to max_model_len tokens again."""
    text = "the quick brown fox " * 200
    prompt = {"prompt": text} if path == "/completions" else {"messages": [{"role": "user", "content": text}]}
    response = post(server, path, truncate_prompt_tokens=-1, **prompt)
    assert refused_param(response) == "truncate_prompt_tokens"
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert f"lower truncate_prompt_tokens to at most {MAX_MODEL_LEN - 1}" in error["message"]


def test_a_batch_prompt_that_truncate_prompt_tokens_cuts_to_fill_the_context_is_named(server):
    """Of a batch, the refusal names the prompt: here the second, which -1 cuts to max_model_len tokens."""
    response = post(server, "/completions", prompt=["hi", "the quick brown fox " * 200], truncate_prompt_tokens=-1)
    assert refused_param(response) == "truncate_prompt_tokens"
    assert response.json()["error"]["message"].startswith("prompt[1]: This model's maximum context length is")


def test_a_batch_truncates_each_prompt(server):
    batch = ok(post(server, "/completions", prompt=[PROMPT, PROMPT[:3]], truncate_prompt_tokens=5))
    assert batch["usage"]["prompt_tokens"] == 5 + 3


def test_a_chat_keeps_the_end_of_the_rendered_prompt(server):
    messages = [{"role": "user", "content": "tell me about the quick brown fox " * 60}]
    assert refused_param(post(server, "/chat/completions", messages=messages)) == "messages"
    reply = ok(post(server, "/chat/completions", messages=messages, truncate_prompt_tokens=100))
    assert reply["usage"]["prompt_tokens"] == 100 and reply["usage"]["completion_tokens"] == GREEDY["max_tokens"]


@pytest.mark.parametrize("path", ["/completions", "/chat/completions"])
@pytest.mark.parametrize("value", [0, -2, MAX_MODEL_LEN + 1, 1.5, "4"])
def test_an_invalid_value_is_a_400_naming_it(server, path, value):
    prompt = {"prompt": PROMPT} if path == "/completions" else {"messages": [{"role": "user", "content": "hi"}]}
    assert refused_param(post(server, path, truncate_prompt_tokens=value, **prompt)) == "truncate_prompt_tokens"


def _data_url() -> str:
    buffer = io.BytesIO()
    Image.fromarray((np.random.RandomState(3).rand(60, 90, 3) * 255).astype("uint8")).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def test_a_cut_into_an_images_placeholders_is_a_400_naming_the_field(server):
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": _data_url()}},
                                             {"type": "text", "text": "What is in the picture?"}]}]
    tokens = httpx.post(server.base_url.removesuffix("/v1") + "/tokenize", json={"messages": messages},
                        timeout=60).json()["tokens"]
    image = tokens.index(server.engine.engine.model_config.image_token_id)
    response = post(server, "/chat/completions", messages=messages, truncate_prompt_tokens=len(tokens) - image - 1)
    assert refused_param(response) == "truncate_prompt_tokens"
    assert "cut into its image or video 0" in response.json()["error"]["message"]
    assert server.wait_for_idle()["glimmer_num_requests_running"] == 0
