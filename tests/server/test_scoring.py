"""Scoring through /v1/completions: `echo` with `logprobs`, `max_tokens: 0`, and vLLM's `prompt_logprobs`.

The values are the reference model's (float32): the same prompt scored by transformers' forward.
"""

from __future__ import annotations

import re

import httpx
import openai
import pytest
import torch
from oracle import reference_logits, reference_model
from server_support import live_server, spelled_text

from glimmer import LLM, SamplingParams
from glimmer.engine.tokenizer import Tokenizer

PROMPT = [5, 77, 130, 42, 99, 310, 12, 8, 250, 61]


@pytest.fixture(scope="module")
def server(make_tiny, same_cpu_kernels_in_module):
    with live_server(make_tiny()) as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def expected(make_tiny) -> torch.Tensor:
    return torch.log_softmax(reference_logits(reference_model(make_tiny()), PROMPT), dim=-1)


@pytest.fixture(scope="module")
def token_count(make_tiny) -> int:
    """The tokenizer's ids: the logit columns past them pad the vocabulary, never an alternative or a rank."""
    return Tokenizer.from_dir(make_tiny()).vocab_size


def test_echo_with_logprobs_scores_every_prompt_token_the_first_null(client, expected, token_count):
    response = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=1, temperature=0, logprobs=2,
                                         echo=True)
    choice = response.choices[0]
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == len(PROMPT) + 1
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    for position in range(1, len(PROMPT)):
        assert abs(logprobs.token_logprobs[position] - expected[position - 1, PROMPT[position]].item()) < 1e-4
        # the 2 most likely tokens and, when it is not among them, the prompt token itself (OpenAI, vLLM)
        assert len(logprobs.top_logprobs[position]) <= 3
        assert logprobs.tokens[position] in logprobs.top_logprobs[position]
        assert max(logprobs.top_logprobs[position].values()) == pytest.approx(
            expected[position - 1, :token_count].max().item(), abs=1e-4)
    assert choice.text.startswith(spelled_text(logprobs.tokens[:len(PROMPT)]))
    assert logprobs.text_offset[:2] == [0, len(logprobs.tokens[0])]
    assert response.usage.completion_tokens == 1


def test_max_tokens_zero_with_echo_returns_the_scored_prompt_only(client):
    choice = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=0, logprobs=0, echo=True).choices[0]
    assert len(choice.logprobs.tokens) == len(PROMPT)
    assert choice.text == spelled_text(choice.logprobs.tokens)
    assert choice.finish_reason == "length"


def test_a_text_prompt_echoes_as_the_model_read_it(client):
    choice = client.completions.create(model="tiny", prompt="Hello world", max_tokens=0, echo=True).choices[0]
    assert choice.text == "<|begin_of_text|>Hello world"  # Glimmer added the bos


def test_streamed_echo_equals_the_whole_response(client):
    request = dict(model="tiny", prompt=PROMPT, max_tokens=3, temperature=0, logprobs=1, echo=True)
    whole = client.completions.create(**request).choices[0]
    text, tokens, offsets, values = "", [], [], []
    for chunk in client.completions.create(stream=True, **request):
        for choice in chunk.choices:
            text += choice.text
            tokens += choice.logprobs.tokens
            offsets += choice.logprobs.text_offset
            values += choice.logprobs.token_logprobs
    assert (text, tokens, offsets, values) == (whole.text, whole.logprobs.tokens, whole.logprobs.text_offset,
                                               whole.logprobs.token_logprobs)


def test_vllm_prompt_logprobs_name_the_prompt_token_its_rank_and_the_top_alternatives(server, expected, token_count):
    body = httpx.post(server.base_url + "/completions", timeout=60, json={
        "model": "tiny", "prompt": PROMPT, "max_tokens": 1, "prompt_logprobs": 1}).json()
    scored = body["choices"][0]["prompt_logprobs"]
    assert len(scored) == len(PROMPT) and scored[0] is None
    for position in range(1, len(PROMPT)):
        row = expected[position - 1, :token_count]
        entry = scored[position][str(PROMPT[position])]
        assert abs(entry["logprob"] - row[PROMPT[position]].item()) < 1e-4
        assert entry["rank"] == int((row >= row[PROMPT[position]]).sum())
        best = str(int(row.argmax()))
        assert scored[position][best]["rank"] == 1
    chat = httpx.post(server.base_url + "/chat/completions", timeout=60, json={
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "prompt_logprobs": 0,
        "chat_template_kwargs": {"current_date": "2026-01-01"}}).json()
    assert chat["prompt_logprobs"][0] is None and len(chat["prompt_logprobs"]) == chat["usage"]["prompt_tokens"]


def test_vllm_sampling_extras_are_honoured(client, expected):
    first = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0,
                                      extra_body={"ignore_eos": True}).choices[0]
    greedy_first = int(expected[-1].argmax())
    stopped = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0,
                                        extra_body={"stop_token_ids": [greedy_first]})
    assert (stopped.choices[0].finish_reason, stopped.usage.completion_tokens) == ("stop", 1)
    stop = first.text[2:4]
    kept = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0, stop=[stop],
                                     extra_body={"ignore_eos": True, "include_stop_str_in_output": True})
    assert kept.choices[0].text.endswith(stop) and kept.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("field", ["use_beam_search", "logits_processors", "guided_json"])
def test_vllm_fields_glimmer_cannot_honour_are_refused_by_name(server, field):
    response = httpx.post(server.base_url + "/completions", timeout=30, json={
        "model": "tiny", "prompt": "hi", field: 1})
    assert response.status_code == 400 and field in response.json()["error"]["message"]


def test_bad_words_on_completions_and_chat(server, client, make_tiny, same_cpu_kernels):
    """vLLM's `bad_words` was refused (a 400); on /v1/completions a word of the greedy output is now avoided as
    `SamplingParams(bad_words=...)` avoids it, chat takes it (over the raw turn; words are tokenized as plain text,
    so the framing is never banned), and beside a grammar it is refused naming the field."""
    prompt = "The quick brown fox"
    free = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    word = re.findall("[A-Za-z]{2,}", free)[0]
    banned = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0,
                                       extra_body={"ignore_eos": True, "bad_words": [word]}).choices[0].text
    offline = LLM(str(make_tiny()), progress=False).generate([prompt], SamplingParams(
        temperature=0, max_tokens=12, ignore_eos=True, bad_words=[word]))[0].outputs[0].text
    assert banned == offline != free
    chat = httpx.post(server.base_url + "/chat/completions", timeout=30, json={
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "bad_words": [word]})
    assert chat.status_code == 200, chat.text
    for path, body in [("/completions", {"prompt": "hi", "bad_words": [""]}),
                       ("/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "bad_words": ["x"],
                                              "response_format": {"type": "json_object"}})]:
        response = httpx.post(server.base_url + path, timeout=30, json={"model": "tiny", **body})
        assert response.status_code == 400 and response.json()["error"]["param"] == "bad_words", response.text


def test_a_completion_its_bad_words_leave_no_allowed_id_is_a_400_naming_bad_words(server, make_tiny):
    """After the word's first token, its last, the only allowed id, was banned: the completion went on with id 0 (a
    token it did not allow), and a request stopped then was a 500, an internal error."""
    tokenizer = Tokenizer.from_dir(make_tiny())
    token = next(t for t in range(tokenizer.vocab_size) if tokenizer.decode([t]).isalnum()
                 and tokenizer.encode_text(tokenizer.decode([t]) * 2) == [t, t])
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "ignore_eos": True,
            "allowed_token_ids": [token], "bad_words": [tokenizer.decode([token]) * 2]}
    response = httpx.post(server.base_url + "/completions", timeout=30, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "bad_words" and "allowed_token_ids" in response.text
    body["max_tokens"] = 1  # ends before the dead end
    response = httpx.post(server.base_url + "/completions", timeout=30, json=body)
    assert response.status_code == 200 and response.json()["choices"][0]["text"] == tokenizer.decode([token])
