"""Request fields as OpenAI and vLLM define them, through the real server on a random tiny model: null means
unset, `logit_bias` changes the choice, legacy completion logprobs (offsets, the sampled token among the top
ones), stop ids and `include_stop_str_in_output`, message fields the template would drop, conflicting knobs.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time

import httpx
import openai
import pytest
import torch
from oracle import reference_logits, reference_model
from server_support import PINNED_DATE, live_server, spelled_text

from glimmer.engine.sampling_params import MAX_LOGIT_BIAS_ENTRIES, MAX_STOP_TOKEN_IDS, SamplingParams

PROMPT = [5, 77, 130, 42, 99, 310, 12, 8, 250, 61]
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(make_tiny):
    with live_server(make_tiny()) as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def next_logits(make_tiny) -> torch.Tensor:
    """The reference's logits after PROMPT."""
    return reference_logits(reference_model(make_tiny()), PROMPT)[-1]


def complete(server, **fields) -> dict:
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 1, "temperature": 0, **fields}
    response = httpx.post(server.base_url + "/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]


def chat_error(server, **fields) -> dict:
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 2, "chat_template_kwargs": PINNED_DATE, **fields}
    response = httpx.post(server.base_url + "/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    return response.json()["error"]


def test_fields_sent_as_null_take_their_defaults(server, client):
    # the OpenAI reference types these "… or null"; the SDK sends None as null
    chat = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2, n=None, logprobs=None,
                                          stream=None, temperature=None, seed=None,
                                          extra_body={"chat_template_kwargs": PINNED_DATE, "min_tokens": None,
                                                      "ignore_eos": None, "stream_options": None})
    assert len(chat.choices) == 1 and chat.choices[0].logprobs is None
    plain = complete(server, echo=None, n=None, logprobs=None, stream=None)
    assert plain["text"] == complete(server)["text"] and plain["logprobs"] is None


def test_a_null_that_means_something_keeps_its_meaning(server):
    # completions max_tokens: null is "up to the context" (vLLM), not the default 16
    choice = complete(server, prompt=[5], max_tokens=None, ignore_eos=True)
    assert len(choice["text"]) > 16 and choice["finish_reason"] == "length"


def test_a_completion_of_several_prompts_counts_once_toward_the_queue_limit(server):
    engine = server.engine
    engine.max_waiting_requests = 2
    try:
        body = {"model": "tiny", "prompt": [PROMPT, PROMPT[:5], PROMPT[:7]], "max_tokens": 2}
        response = httpx.post(server.base_url + "/completions", json=body, timeout=60)
        assert response.status_code == 200 and len(response.json()["choices"]) == 3, response.text
    finally:
        engine.max_waiting_requests = 1024


def test_a_completion_of_several_prompts_the_full_queue_refuses_queues_none_of_them(make_tiny, monkeypatch):
    """The queue limit refuses a request of several prompts before any is queued: its first prompt was refused (a
    429) while the others, started beside it, were admitted past the limit, and the 429 waited for their first
    tokens, so it came only once the requests ahead of them had run (here never, the one sequence slot held)."""
    with live_server(make_tiny(), scripted=True, max_waiting_requests=1, engine_options={"max_num_seqs": 1}) as live:
        engine = live.engine
        added = []
        add_request = engine.engine.add_request
        monkeypatch.setattr(engine.engine, "add_request", lambda request_id, *args, **kwargs: (
            added.append(request_id), add_request(request_id, *args, **kwargs))[1])

        async def settle(done) -> None:
            deadline = time.monotonic() + 5  # (the running request takes far longer to finish)
            while not done():
                assert time.monotonic() < deadline, (engine.num_waiting_requests, added)
                await asyncio.sleep(0.01)

        async def run() -> None:
            running = engine.generate("running", PROMPT, SamplingParams(max_tokens=1900, ignore_eos=True))
            await anext(running)  # it holds the one sequence slot for the whole test (a step takes 50 ms)
            queued = asyncio.ensure_future(anext(engine.generate("waiting", PROMPT, SamplingParams(max_tokens=1))))
            await settle(lambda: engine.num_waiting_requests == 1 and "waiting" in added)
            body = {"model": "tiny", "prompt": [PROMPT, PROMPT[:5], PROMPT[:7]], "max_tokens": 2}
            async with httpx.AsyncClient(transport=httpx.ASGITransport(live.app), base_url="http://glimmer") as client:
                refused = await asyncio.wait_for(client.post("/v1/completions", json=body), 10)
            assert refused.status_code == 429, refused.text
            # none of its prompts was added, nor is queued to be (queued ones count as waiting)
            assert added == ["running", "waiting"] and engine.num_waiting_requests == 1
            queued.cancel()
            await running.aclose()
            await settle(lambda: engine.num_waiting_requests == 0)

        engine.engine.runner.step_delay_s = 0.05
        asyncio.run(run())
        engine.engine.runner.step_delay_s = 0.0
        live.wait_for_idle()


@pytest.mark.parametrize("stream", [False, True])
def test_a_completion_of_several_prompts_fails_as_soon_as_one_prompt_fails(make_tiny, stream):
    """A prompt whose own constraint fails it while generating (bad_words leave none of allowed_token_ids after its
    first token) is a 400 at once, and the other prompts are aborted, freeing their KV pages: the answer waited for
    every prompt's first token, here a long prompt's, prefilled 16 tokens a step, which then ran for nobody."""
    with live_server(make_tiny(), scripted=True, engine_options={"max_num_batched_tokens": 16,
                                                                    "max_num_seqs": 16}) as live:
        engine = live.engine
        engine.engine.runner.add("[q]", "qqqq")  # "q" is one token (80), "z" another (89): the words ban both after q
        finished = []
        engine.on_finished(finished.append)
        body = {"model": "tiny", "prompt": ["[q] go", "[z]" + " go" * 600], "max_tokens": 4, "ignore_eos": True,
                "allowed_token_ids": [80, 89], "bad_words": ["qq", "qz"], "stream": stream}

        async def run() -> httpx.Response:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(live.app), base_url="http://glimmer") as client:
                return await asyncio.wait_for(client.post("/v1/completions", json=body), 60)

        engine.engine.runner.step_delay_s = 0.05  # the long prompt's prefill takes about 40 steps, 2 s
        refused = asyncio.run(run())
        engine.engine.runner.step_delay_s = 0.0
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"] == "bad_words"
        live.wait_for_idle()
        # the long prompt was aborted before its first token
        assert sorted((f.finish_reason, f.num_generation_tokens) for f in finished) == [("abort", 0), ("error", 1)]
        assert all(used == 0 for used, _ in engine.engine.kv.usage().values()) and not engine._listeners


def test_seeds_take_the_whole_range_sampling_params_takes(server):
    assert complete(server, temperature=1, seed=2**64 - 1)["text"] is not None
    assert complete(server, temperature=1, seed=2**63, n=2)["text"] is not None
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 1, "seed": 2**64 - 1, "n": 2}
    error = httpx.post(server.base_url + "/completions", json=body, timeout=60).json()["error"]
    assert error["param"] == "seed" and error["message"].startswith("seed: seed + n - 1 must be below 2**64")
    assert str(2**64 - 2) in error["message"]  # the largest seed n=2 allows


def test_a_stop_token_id_outside_the_vocabulary_is_named_field_first(server):
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 1, "stop_token_ids": [10**9]}
    error = httpx.post(server.base_url + "/completions", json=body, timeout=60).json()["error"]
    assert error["param"] == "stop_token_ids"
    assert error["message"].startswith("stop_token_ids: ids [1000000000] are outside the vocabulary")


@pytest.mark.parametrize(("path", "fields", "param"), [
    ("/chat/completions", {"prompt": "hi"}, "prompt"),
    ("/completions", {"tool_choice": "auto"}, "tool_choice"),
    ("/responses", {"stop": ["x"]}, "stop"),
])
def test_a_field_of_another_endpoint_is_an_unknown_field(server, path, fields, param):
    base = {"/chat/completions": {"messages": MESSAGES, "max_tokens": 2}, "/completions": {"prompt": "hi"},
            "/responses": {"input": "hi"}}[path]
    response = httpx.post(server.base_url + path, json={"model": "tiny", **base, **fields}, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and "unknown field" in error["message"]


@pytest.mark.parametrize(("path", "fields", "meant"), [
    ("/responses", {"max_tokens": 5}, "max_output_tokens"),  # OpenAI's Responses renamed chat's limit
    ("/responses", {"reasoning_effort": "low"}, "reasoning.effort"),  # and moved chat's fields into objects
    ("/responses", {"response_format": {"type": "json_object"}}, "text.format"),
    ("/responses", {"verbosity": "medium"}, "text.verbosity"),
    ("/completions", {"max_completion_tokens": 3}, "max_tokens"),
    ("/chat/completions", {"temprature": 0}, "temperature"),
    ("/chat/completions", {"max_output_tokens": 5}, "max_completion_tokens"),  # the same names, the other way
    ("/chat/completions", {"text": {"verbosity": "low"}}, "response_format or verbosity"),
])
def test_an_unknown_field_names_the_field_it_likely_meant(server, path, fields, meant):
    """`max_tokens` on /v1/responses was refused as an unknown field without naming `max_output_tokens`; so were
    chat's `reasoning_effort`, `response_format` and `verbosity` there, which OpenAI's 400 says moved to
    `reasoning.effort`, `text.format` and `text.verbosity`."""
    base = {"/chat/completions": {"messages": MESSAGES, "max_tokens": 2}, "/completions": {"prompt": "hi"},
            "/responses": {"input": "hi"}}[path]
    response = httpx.post(server.base_url + path, json={"model": "tiny", **base, **fields}, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == next(iter(fields))
    assert error["message"].startswith(f"{next(iter(fields))}: unknown field (did you mean {meant}?); ")


@pytest.mark.parametrize("limit", ["max_tokens", "max_completion_tokens"])
def test_a_chat_token_limit_past_the_context_is_refused_naming_the_field_sent(server, limit):
    """A max_completion_tokens past the context, or below min_tokens, was refused as `max_tokens`, a field the
    request did not send."""
    body = {"messages": MESSAGES, "chat_template_kwargs": PINNED_DATE, limit: 2048}
    error = chat_error(server, **{"max_tokens": None, **body})
    assert error["param"] == limit
    assert f"2048 in the completion); lower {limit} to at most" in error["message"]
    error = chat_error(server, **{"max_tokens": None, "messages": MESSAGES, limit: 5, "min_tokens": 10})
    assert error["param"] == "min_tokens"
    assert error["message"] == f"min_tokens: 10 is more than {limit}=5; lower min_tokens to at most 5, or raise {limit}"


def test_a_responses_tool_choice_of_the_chat_shape_gets_the_responses_shape_as_the_hint(server):
    body = {"model": "tiny", "input": "hi", "tools": [{"type": "function", "name": "f"}],
            "tool_choice": {"type": "function", "function": {"name": "f"}}}
    error = httpx.post(server.base_url + "/responses", json=body, timeout=60).json()["error"]
    assert error["param"] == "tool_choice" and '{"type": "function", "name": NAME}' in error["message"]


def test_logit_bias_bans_and_forces_tokens_greedy_and_sampled(server, next_logits):
    top = next_logits.topk(2).indices.tolist()
    assert complete(server, logprobs=0)["logprobs"]["top_logprobs"][0]  # the greedy token is the reference's
    greedy = complete(server, logprobs=1)
    assert greedy["logprobs"]["token_logprobs"][0] == pytest.approx(
        torch.log_softmax(next_logits, -1)[top[0]].item(), abs=1e-4)
    banned = complete(server, logprobs=1, logit_bias={str(top[0]): -100})
    second = complete(server, logprobs=1, logit_bias={str(top[1]): 100})
    assert banned["logprobs"]["tokens"] == second["logprobs"]["tokens"] != greedy["logprobs"]["tokens"]
    # logprobs stay the model's own distribution
    assert banned["logprobs"]["token_logprobs"][0] == pytest.approx(
        torch.log_softmax(next_logits, -1)[top[1]].item(), abs=1e-4)
    forced = {str(top[1]): 100}
    for seed in range(4):
        assert complete(server, temperature=1.5, seed=seed, logprobs=0, logit_bias=forced)["logprobs"]["tokens"] \
            == second["logprobs"]["tokens"]


def test_allowed_token_ids_keep_a_completion_to_those_tokens_greedy_and_sampled(server, next_logits):
    """vLLM's `allowed_token_ids` on /v1/completions: the most likely allowed token, greedy; seeded draws as with those
    tokens forced by a +100 bias (which keeps their order and leaves the rest nothing); logprobs the model's own.
    Chat refuses it, naming it (its framing tokens would be banned)."""
    order = next_logits.argsort(descending=True).tolist()
    allowed = [order[2], order[7], order[40]]
    forced = {str(t): 100 for t in allowed}
    greedy = complete(server, max_tokens=4, logprobs=1, allowed_token_ids=allowed)
    assert greedy["logprobs"]["token_logprobs"][0] == pytest.approx(
        torch.log_softmax(next_logits, -1)[order[2]].item(), abs=1e-4)
    assert greedy["logprobs"] == complete(server, max_tokens=4, logprobs=1, logit_bias=forced)["logprobs"]
    for seed in range(6):
        sampled = {"max_tokens": 3, "temperature": 1.5, "seed": seed, "logprobs": 0}
        assert complete(server, allowed_token_ids=allowed, **sampled)["logprobs"] == \
            complete(server, logit_bias=forced, **sampled)["logprobs"]
    for fields, words in [({"allowed_token_ids": []}, "non-empty"), ({"allowed_token_ids": [99999]}, "outside"),
                          ({"allowed_token_ids": [5], "response_format": {"type": "json_object"}}, "structured")]:
        body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 1, **fields}
        response = httpx.post(server.base_url + "/completions", json=body, timeout=60)
        assert response.status_code == 400 and response.json()["error"]["param"] == "allowed_token_ids", response.text
        assert words in response.json()["error"]["message"]
    error = chat_error(server, allowed_token_ids=allowed)
    assert error["param"] == "allowed_token_ids" and "framing tokens" in error["message"]


@pytest.mark.parametrize(("bias", "words"), [
    ({"abc": 1}, "not a token id"), ({"-3": 1}, "not a token id"), ({"5": 101}, "[-100, 100]"),
    ({"99999": 1}, "outside the vocabulary"),
    ({"5": 100, "05": -100}, "keys '5' and '05' both name token 5"),  # one of them was silently dropped
    # refused by its size before any key is read: each of a 4 MB body's 380,000 keys was read and converted first, on
    # the event loop, holding every other stream for a second or more
    ({**{str(i): 1 for i in range(MAX_LOGIT_BIAS_ENTRIES)}, "x": 1}, f"at most {MAX_LOGIT_BIAS_ENTRIES} entries"),
])
def test_a_bad_logit_bias_is_400(server, bias, words):
    error = chat_error(server, logit_bias=bias)
    assert error["param"] == "logit_bias" and words in error["message"]


@pytest.mark.parametrize("route", ["/chat/completions", "/completions"])
def test_stop_token_ids_beyond_their_cap_are_400(server, route):
    """A 4 MB body of 1.9 million stop_token_ids was taken and processed; beyond MAX_STOP_TOKEN_IDS it is a 400
    naming the field and the cap, as too many logit_bias entries or stop strings are."""
    body = {"model": "tiny", "max_tokens": 2, "stop_token_ids": [5] * (MAX_STOP_TOKEN_IDS + 1),
            **({"messages": MESSAGES} if route == "/chat/completions" else {"prompt": PROMPT})}
    response = httpx.post(server.base_url + route, json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "stop_token_ids")
    assert error["message"] == f"stop_token_ids: must be a list of at most {MAX_STOP_TOKEN_IDS} token ids"
    body["stop_token_ids"] = body["stop_token_ids"][1:]
    assert httpx.post(server.base_url + route, json=body, timeout=60).status_code == 200


def test_text_offsets_are_where_each_token_starts_even_when_a_stop_string_held_text_back(server):
    free = complete(server, max_tokens=12, logprobs=0, ignore_eos=True)
    tokens, offsets, text = free["logprobs"]["tokens"], free["logprobs"]["text_offset"], free["text"]
    # (a token holding part of a character shows as its bytes, `bytes:\\xe2\\x80`, and the text the next token
    # completes starts with that character: check the others)
    whole = [i for i, token in enumerate(tokens)
             if not token.startswith("bytes:") and (i == 0 or not tokens[i - 1].startswith("bytes:"))]
    for i in whole:
        assert text[offsets[i] : offsets[i] + len(tokens[i])] == tokens[i]
    # a stop string from inside token k into token k + 1: token k's tail is held back (it might begin the stop
    # string) and released with token k + 1, which ends the text
    k = next(i for i in whole if i >= 3 and i + 1 in whole and len(tokens[i]) >= 2
             and text.find(tokens[i][1:] + tokens[i + 1][:1]) == offsets[i] + 1)
    stop = tokens[k][1:] + tokens[k + 1][:1]
    stopped = complete(server, max_tokens=12, logprobs=0, ignore_eos=True, stop=[stop])
    assert stopped["text"] == text[: offsets[k] + 1] and stopped["finish_reason"] == "stop"
    assert stopped["logprobs"]["text_offset"] == offsets[: k + 2]


def test_a_token_after_bytes_that_form_no_character_starts_after_their_replacement_character(server):
    """`text_offset` of a token following a piece of a character it cannot complete: the piece shows as U+FFFD, and
    the token starts after it (it pointed at the U+FFFD, so `text[offset:]` did not start with the token)."""
    tokenizer = server.engine.engine.tokenizer
    lead = next(i for i in range(tokenizer.vocab_size) if tokenizer.token_bytes(i) == b"\xe0")
    [word] = tokenizer.encode("days")
    echoed = complete(server, prompt=[lead, word], echo=True, max_tokens=0, logprobs=0)
    assert echoed["text"] == "\ufffddays" and echoed["logprobs"]["tokens"] == ["bytes:\\xe0", "days"]
    assert echoed["logprobs"]["text_offset"] == [0, 1]
    # generated: the lead byte forced twice, the second breaking the first's character
    forced = complete(server, max_tokens=2, logprobs=0, logit_bias={str(lead): 100})
    assert forced["text"] == "\ufffd\ufffd" and forced["logprobs"]["text_offset"] == [0, 1]
    streamed = httpx.post(server.base_url + "/completions", timeout=60, json={
        "model": "tiny", "prompt": PROMPT, "max_tokens": 2, "temperature": 0, "logprobs": 0,
        "logit_bias": {str(lead): 100}, "stream": True})
    chunks = [json.loads(line[len("data: "):]) for line in streamed.text.splitlines()
              if line.startswith("data: {")]
    assert [offset for chunk in chunks for offset in chunk["choices"][0]["logprobs"]["text_offset"]] == [0, 1]


@pytest.mark.parametrize(("fields", "choices"), [({"best_of": 1}, 1), ({"best_of": 3, "n": 3}, 3),
                                                  ({"best_of": 1, "n": 3}, None), ({"best_of": 4, "n": 2}, None)])
def test_best_of_is_taken_only_where_it_changes_nothing(server, fields, choices):
    """best_of = n picks every completion sampled; a best_of below n (which OpenAI refuses: it cannot pick n of fewer)
    was taken and ignored, returning n choices."""
    response = httpx.post(server.base_url + "/completions", timeout=60,
                          json={"model": "tiny", "prompt": PROMPT, "max_tokens": 1, **fields})
    if choices is None:
        assert response.status_code == 400 and response.json()["error"]["param"] == "best_of"
    else:
        assert response.status_code == 200 and len(response.json()["choices"]) == choices


def test_completion_top_logprobs_hold_the_sampled_token_too(server):
    for seed in range(6):
        choice = complete(server, temperature=3.0, seed=seed, max_tokens=4, logprobs=1)
        logprobs = choice["logprobs"]
        for token, value, top in zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"],
                                     strict=True):
            # (tokens spelled alike share a key, which the more likely one keeps)
            assert top[token] >= value and 1 <= len(top) <= 2
    zero = complete(server, max_tokens=3, logprobs=0, temperature=0)["logprobs"]
    assert [list(top) for top in zero["top_logprobs"]] == [[token] for token in zero["tokens"]]


def test_completion_logprobs_spell_pieces_of_characters_as_bytes_so_k_alternatives_keep_k_keys(server):
    """As OpenAI: a token whose bytes are no UTF-8 text on their own is `bytes:\\xf0\\x9f`, chosen or alternative.
    They all read U+FFFD before and shared one `top_logprobs` key, so fewer than k alternatives came back."""
    choice = complete(server, prompt="I love 🍕 and 日本語", echo=True, max_tokens=8, logprobs=20, ignore_eos=True)
    tokens, tops, offsets = (choice["logprobs"][field] for field in ("tokens", "top_logprobs", "text_offset"))
    assert any(token.startswith("bytes:") for token in tokens)  # the pizza and the kanji are split into bytes
    for token, top in zip(tokens[1:], tops[1:], strict=True):
        assert len(top) in (20, 21) and token in top
        assert not any("\ufffd" in key for key in top)
    assert spelled_text(tokens) == choice["text"]
    # each token starts where its text (or the character it is a piece of) starts in the choice's text
    assert offsets == sorted(offsets) and offsets[-1] < len(choice["text"])
    for token, offset in zip(tokens, offsets, strict=True):
        if not token.startswith("bytes:"):
            assert choice["text"][offset:offset + len(token)] == token


def test_a_stop_token_id_leaves_its_text_out_unless_include_stop_str_in_output(server):
    # as vLLM: the text of a stop id from the request goes only with include_stop_str_in_output
    tokens = complete(server, max_tokens=8, logprobs=0, ignore_eos=True)["logprobs"]["tokens"]
    tokenizer = server.engine.engine.tokenizer
    special = set(tokenizer.all_special_ids)
    stop_id = next(i for i in range(server.engine.engine.model_config.text.vocab_size)
                   if i not in special and tokenizer.decode([i]) == tokens[2])
    left_out = complete(server, max_tokens=8, ignore_eos=True, stop_token_ids=[stop_id])
    kept = complete(server, max_tokens=8, ignore_eos=True, stop_token_ids=[stop_id], include_stop_str_in_output=True)
    assert left_out["stop_reason"] == kept["stop_reason"] == stop_id
    assert left_out["text"] == spelled_text(tokens[:2]) and kept["text"] == spelled_text(tokens[:3])


@pytest.mark.parametrize(("messages", "param"), [
    ([*MESSAGES, {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}},
      *MESSAGES], "messages[1].function_call"),
    ([{"role": "developer", "content": "a"}, {"role": "critic", "content": "x"}], "messages[1].role"),
])
def test_what_an_assistant_said_that_the_template_cannot_render_is_refused(server, messages, param):
    assert chat_error(server, messages=messages)["param"] == param


def test_an_assistant_refusal_is_rendered_as_what_the_assistant_said_as_on_responses(server, client):
    """An assistant message's non-empty `refusal` was a 400 ("cannot be rendered") where /v1/responses renders a
    refusal part as what the model said: the field (beside null content, as OpenAI sends it back) and a `refusal`
    content part render as the assistant's text, as the openai SDK types both."""
    said = "I can't help with that."

    def prompt(assistant: dict) -> list[int]:
        messages = [*MESSAGES, {"role": "assistant", **assistant}, {"role": "user", "content": "Why?"}]
        response = httpx.post(server.url + "/tokenize", timeout=30,
                              json={"messages": messages, "chat_template_kwargs": PINNED_DATE})
        assert response.status_code == 200, response.text
        return response.json()["tokens"]

    as_text = prompt({"content": said})
    assert prompt({"content": None, "refusal": said}) == prompt({"content": [{"type": "refusal", "refusal": said}]})
    assert prompt({"content": None, "refusal": said}) == as_text != prompt({"content": "No."})
    assert prompt({"content": [{"type": "text", "text": "Sorry. "}, {"type": "refusal", "refusal": said}]}) == (
        prompt({"content": "Sorry. " + said}))
    refused = {"role": "assistant", "content": None, "refusal": said}
    answered = client.chat.completions.create(model="tiny", max_tokens=2, temperature=0,
                                              messages=[*MESSAGES, refused, {"role": "user", "content": "Why?"}],
                                              extra_body={"chat_template_kwargs": PINNED_DATE})
    assert answered.usage.prompt_tokens == len(as_text)


@pytest.mark.parametrize(("messages", "param"), [
    ([*MESSAGES, {"role": "assistant", "content": "Sure.", "refusal": "I won't."}, *MESSAGES], "messages[1].refusal"),
    ([*MESSAGES, {"role": "assistant", "content": None, "refusal": ["I won't."]}, *MESSAGES], "messages[1].refusal"),
    ([{"role": "user", "content": [{"type": "refusal", "refusal": "I won't."}]}], "messages[0].content[0]"),
    ([*MESSAGES, {"role": "assistant", "content": [{"type": "refusal", "text": "No."}]}, *MESSAGES],
     "messages[1].content[0].refusal"),
])
def test_a_refusal_beside_content_outside_an_assistant_message_or_not_a_string_is_400_naming_it(server, messages,
                                                                                              param):
    assert chat_error(server, messages=messages)["param"] == param


_CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}


@pytest.mark.parametrize(("messages", "param"), [
    ([*MESSAGES, _CALL, {"role": "tool", "tool_call_id": "zzz", "content": "18"}], "messages[2].tool_call_id"),
    ([*MESSAGES, _CALL, {"role": "tool", "tool_call_id": 5, "content": "18"}], "messages[2].tool_call_id"),
    ([*MESSAGES, {"role": "tool", "tool_call_id": "abc", "content": "42"}], "messages[1].tool_call_id"),
    ([*MESSAGES, {"role": "tool", "name": "f", "content": "42"}], "messages[1]"),  # no call before it
    ([*MESSAGES, {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "self", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "18"}], "messages[1].tool_calls[0].function.name"),
    ([*MESSAGES, _CALL, {"role": "tool", "tool_call_id": "c1", "content": "18"},
      {"role": "tool", "name": "f", "content": "19"}], "messages[3]"),  # a second result of one call
    ([{"role": "user"}], "messages[0].content"),
    ([{"role": "user", "content": None}], "messages[0].content"),
    ([{"role": "system"}, *MESSAGES], "messages[0].content"),
    ([{"role": "developer", "content": None}, *MESSAGES], "messages[0].content"),
    ([*MESSAGES, _CALL, {"role": "tool", "tool_call_id": "c1"}], "messages[2].content"),
    ([{"role": "user", "content": []}], "messages[0].content"),  # no part renders the empty turn null does
    ([*MESSAGES, _CALL, {"role": "tool", "tool_call_id": "c1", "content": []}], "messages[2].content"),
])
def test_a_turn_the_template_would_render_empty_or_misnamed_is_refused(server, messages, param):
    """A tool result answering no call of the history was rendered under its raw id as the tool's name (§2.1), one
    answering no call of the turn before it as the result of a call never made, a message without content as an empty
    turn; all gave answers to questions nobody asked."""
    error = chat_error(server, messages=messages)
    assert error["param"] == param and error["message"].startswith(param), error


def test_a_tool_result_answering_a_call_of_the_history_is_accepted(server, client):
    messages = [*MESSAGES, _CALL, {"role": "tool", "tool_call_id": "c1", "content": "18"}]
    reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=2,
                                           extra_body={"chat_template_kwargs": PINNED_DATE})
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_metadata_clients_and_frameworks_send_back_is_accepted_and_changes_nothing(server, client):
    """Agent frameworks send messages back with fields of their own: LangGraph's agent `name`, litellm's
    `provider_specific_fields`, `annotations`; the template renders none of them, as OpenAI's and vLLM's ignore
    them (a 400 there broke every second turn of those frameworks)."""
    plain = [*MESSAGES, {"role": "assistant", "content": "hello", "reasoning": "r", "tool_calls": _CALL["tool_calls"]},
             {"role": "tool", "tool_call_id": "c1", "name": "f", "content": "ok"}, *MESSAGES]
    decorated = [{**MESSAGES[0], "name": "ann"},
                 {**plain[1], "refusal": None, "annotations": [], "audio": None, "function_call": None,
                  "name": "weather_agent", "provider_specific_fields": {"reasoning": "r"}, "id": "m1"},
                 plain[2], {**MESSAGES[0], "name": "ann"}]
    replies = [client.chat.completions.create(model="tiny", messages=messages, max_tokens=4, temperature=0,
                                              extra_body={"chat_template_kwargs": PINNED_DATE})
               for messages in (plain, decorated)]
    assert replies[0].usage.prompt_tokens == replies[1].usage.prompt_tokens
    assert replies[0].choices[0].message.content == replies[1].choices[0].message.content


def test_conflicting_reasoning_knobs_are_refused(server):
    error = chat_error(server, reasoning_effort="high", reasoning={"effort": "low"})
    assert error["param"] == "reasoning.effort" and "contradicts" in error["message"]
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 2, "chat_template_kwargs": PINNED_DATE,
            "reasoning_effort": "low", "reasoning": {"effort": "low"}}
    assert httpx.post(server.base_url + "/chat/completions", json=body, timeout=60).status_code == 200


def test_the_two_reasoning_efforts_agree_whatever_their_case(server):
    """P-EFF-2 reads an effort case-insensitively, as the effort given top-level and in chat_template_kwargs are
    compared: `High` and `high` ask for the same strength, so they do not contradict each other (they were a 400)."""
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 2, "chat_template_kwargs": PINNED_DATE,
            "reasoning_effort": "High", "reasoning": {"effort": "high"}}
    response = httpx.post(server.base_url + "/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text


def _with_sampling_defaults(checkpoint, tmp_path):
    """A copy of `checkpoint` whose generation_config.json sets temperature 0, min_p 0.1, repetition_penalty 1.2 and
    max_new_tokens 60."""
    model = tmp_path / "model"
    shutil.copytree(checkpoint, model)
    generation = json.loads((model / "generation_config.json").read_text())
    generation |= {"temperature": 0.0, "min_p": 0.1, "repetition_penalty": 1.2, "max_new_tokens": 60}
    (model / "generation_config.json").write_text(json.dumps(generation))
    return model


def _recording_params(live) -> list[SamplingParams]:
    """The SamplingParams of each request `live`'s engine is given from now on, in order."""
    seen = []
    generate = live.engine.generate

    def recording(request_id, ids, params, **options):
        seen.append(params)
        return generate(request_id, ids, params, **options)

    live.engine.generate = recording
    return seen


def test_chat_defaults_come_from_generation_config_and_a_default_max_tokens_stops_at_the_context_end(
        make_tiny, tmp_path):
    """A chat request that leaves them out takes generation_config.json's min_p, repetition_penalty and
    max_new_tokens (as max_tokens), as vLLM's "auto" does; the default is clamped where the context ends
    (the request asked for nothing past it), while an explicit max_tokens past it stays a 400."""
    model = _with_sampling_defaults(make_tiny(), tmp_path)
    with live_server(model, engine_options={"max_model_len": 230}) as live:
        seen = _recording_params(live)

        def chat(text, **fields):
            body = {"model": "tiny", "messages": [{"role": "user", "content": text}], "ignore_eos": True,
                    "chat_template_kwargs": PINNED_DATE, **fields}
            return httpx.post(live.base_url + "/chat/completions", json=body, timeout=60)

        for text in ("hi", "hi " * 30):
            reply = chat(text)
            assert reply.status_code == 200, reply.text
            usage = reply.json()["usage"]
            assert usage["completion_tokens"] == min(60, 230 - usage["prompt_tokens"])
            assert reply.json()["choices"][0]["finish_reason"] == "length"
        assert 230 - usage["prompt_tokens"] < 60  # the second prompt left less room than the default
        assert (seen[0].min_p, seen[0].repetition_penalty, seen[0].temperature) == (0.1, 1.2, 0.0)
        assert chat("hi", max_tokens=3).json()["usage"]["completion_tokens"] == 3
        # a request's min_tokens above the default is no conflict the request made: it gets min_tokens
        assert chat("hi", min_tokens=70).json()["usage"]["completion_tokens"] == 70
        assert (seen[-1].min_p, seen[-1].repetition_penalty) == (0.1, 1.2)
        assert chat("hi", min_p=0, repetition_penalty=1).status_code == 200
        assert (seen[-1].min_p, seen[-1].repetition_penalty) == (0.0, 1.0)
        too_long = chat("hi " * 30, max_tokens=100)
        assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "max_tokens"
        # a min_tokens past the context is no default to clamp: the request asked for it
        beyond = chat("hi", min_tokens=1000)
        assert beyond.status_code == 400 and beyond.json()["error"]["param"] == "min_tokens", beyond.text
        assert "max_model_len=230" in beyond.json()["error"]["message"]  # not a max_tokens the request never sent


def test_a_completions_max_tokens_null_stops_at_the_checkpoints_max_new_tokens_for_each_prompt(make_tiny, tmp_path):
    """vLLM's get_max_tokens takes a completion's `max_tokens: null` as the generation config's max_new_tokens
    (clamped where each prompt's context ends), as Glimmer's chat takes a max_tokens left out: it ran every prompt to
    the end of the context. Left out, max_tokens stays OpenAI's 16."""
    model = _with_sampling_defaults(make_tiny(), tmp_path)
    with live_server(model, engine_options={"max_model_len": 230}) as live:
        seen = _recording_params(live)

        def complete(prompt=(PROMPT, PROMPT * 19), **fields):
            body = {"model": "tiny", "prompt": list(prompt), "ignore_eos": True, **fields}
            reply = httpx.post(live.base_url + "/completions", json=body, timeout=120)
            assert reply.status_code == 200, reply.text
            return reply.json()["usage"]["completion_tokens"]

        room = 230 - len(PROMPT) * 19
        assert room < 60
        assert complete(max_tokens=None) == 60 + room
        assert [params.max_tokens for params in seen] == [60, room]
        assert complete([PROMPT], max_tokens=None, min_tokens=70) == 70  # a request's min_tokens outranks the default
        assert complete() == 2 * 16
        assert complete(max_tokens=None, use_beam_search=True) == 60 + room


def test_a_server_of_generation_config_vllm_takes_no_default_from_the_checkpoint(make_tiny, tmp_path):
    """vLLM's `--generation-config vllm`: fields a request leaves out take OpenAI's defaults, and a chat request
    without max_tokens runs to the end of the context, whatever generation_config.json says (the flag was an
    unrecognized argument). The mode is the engine's, as vLLM's is its model config's: an AsyncEngine(...,
    generation_config="vllm") served by create_app took the checkpoint's defaults (it only silenced a warning)."""
    model = _with_sampling_defaults(make_tiny(), tmp_path)
    with live_server(model, engine_options={"max_model_len": 230}, generation_config="vllm") as live:
        seen = _recording_params(live)
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "ignore_eos": True,
                "chat_template_kwargs": PINNED_DATE}
        reply = httpx.post(live.base_url + "/chat/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        usage = reply.json()["usage"]
        assert usage["completion_tokens"] == 230 - usage["prompt_tokens"] > 60
        assert (seen[0].temperature, seen[0].min_p, seen[0].repetition_penalty) == (1.0, 0.0, 1.0)


@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
def test_a_min_tokens_the_context_cannot_hold_is_400_without_max_tokens_too(server, path):
    """With max_tokens it was a 400; without (chat, or completions' max_tokens null: up to the context) it was
    capped silently and the request ran to the end of the context."""
    body = {"model": "tiny", "min_tokens": 1_000_000, "chat_template_kwargs": PINNED_DATE, "messages": MESSAGES}
    if path == "/completions":
        body = {"model": "tiny", "prompt": PROMPT, "max_tokens": None, "min_tokens": 1_000_000}
    response = httpx.post(server.base_url + path, json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "min_tokens" and error["message"].startswith("min_tokens: 1000000 is more than")


def test_a_completions_min_tokens_past_max_tokens_is_400_naming_both_numbers(server):
    """(Chat's: test_a_chat_token_limit_past_the_context_is_refused_naming_the_field_sent.) It said only "min_tokens:
    must not exceed max_tokens"."""
    response = httpx.post(server.base_url + "/completions", json={"model": "tiny", "prompt": PROMPT, "min_tokens": 5,
                                                                  "max_tokens": 3}, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "min_tokens"
    assert error["message"] == ("min_tokens: 5 is more than max_tokens=3; lower min_tokens to at most 3, or raise "
                                "max_tokens")


def streamed_chunks(server, path: str, **fields) -> list[dict]:
    """The JSON chunks of a streamed chat completion or completion, in order."""
    body = {"model": "tiny", "max_tokens": 6, "temperature": 0, "min_tokens": 6, "stream": True, **fields}
    if path == "/chat/completions":
        body |= {"messages": MESSAGES, "chat_template_kwargs": PINNED_DATE}
    else:
        body |= {"prompt": PROMPT}
    with httpx.stream("POST", server.base_url + path, json=body, timeout=60) as response:
        assert response.status_code == 200, response.read()
        return [json.loads(line[len("data: "):]) for line in response.iter_lines() if line.startswith("data: {")]


@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
@pytest.mark.parametrize("n", [1, 2])
def test_continuous_usage_stats_puts_the_usage_so_far_in_every_chunk(server, path, n):
    chunks = streamed_chunks(server, path, n=n, stream_options={"include_usage": True, "continuous_usage_stats": True})
    *answer, last = chunks
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 6 * n
    counts = [chunk["usage"]["completion_tokens"] for chunk in answer]
    assert counts == sorted(counts) and counts[-1] == 6 * n
    assert all(chunk["usage"]["prompt_tokens"] == last["usage"]["prompt_tokens"] for chunk in answer)
    assert all(chunk["usage"]["total_tokens"] == chunk["usage"]["prompt_tokens"] + chunk["usage"]["completion_tokens"]
               for chunk in answer)
    assert answer[-1]["usage"] == last["usage"]


@pytest.mark.parametrize("n", [1, 2])
def test_every_chat_chunk_reports_the_cached_prompt_tokens_the_role_chunk_too(server, n):
    """The role chunks (and an echo's) went out before the first delta was read into its choice, so with
    continuous_usage_stats they said `cached_tokens: 0` for a prompt found in the prefix cache and the next chunks
    the real count. The count is known at admission and comes with the first delta, read before any chunk is sent."""
    options = {"include_usage": True, "continuous_usage_stats": True}
    streamed_chunks(server, "/chat/completions", n=n, stream_options=options)  # fills the prefix cache
    for fields in ({}, {"echo": True, "messages": [*MESSAGES, {"role": "assistant", "content": "Hi"}]}):
        *answer, last = streamed_chunks(server, "/chat/completions", n=n, stream_options=options, **fields)
        cached = last["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached > 0 and answer[0]["choices"][0]["delta"].get("role") == "assistant", answer[0]
        assert [chunk["usage"]["prompt_tokens_details"]["cached_tokens"] for chunk in answer] == [cached] * len(answer)


@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
def test_continuous_usage_stats_alone_adds_no_final_usage_chunk(server, path):
    chunks = streamed_chunks(server, path, stream_options={"continuous_usage_stats": True})
    assert all(chunk["choices"] and chunk["usage"]["completion_tokens"] <= 6 for chunk in chunks)
    assert chunks[-1]["usage"]["completion_tokens"] == 6


@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
def test_include_usage_alone_keeps_a_null_usage_on_every_chunk_but_the_last(server, path):
    options = {"include_usage": True, "continuous_usage_stats": False}
    *answer, last = streamed_chunks(server, path, stream_options=options)
    assert all(chunk["usage"] is None for chunk in answer)
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 6
    assert all("usage" not in chunk for chunk in streamed_chunks(server, path))


@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
@pytest.mark.parametrize("obfuscation", [False, True])
def test_stream_options_include_obfuscation_of_the_openai_sdk_is_accepted_and_adds_no_field(server, path, obfuscation):
    """The SDK's `stream_options` type has `include_obfuscation` (OpenAI pads streamed chunks against side channels;
    clients send false to turn it off): it cannot change the output, and was a 400 naming it as unknown."""
    options = {"include_usage": True, "include_obfuscation": obfuscation}
    *answer, last = streamed_chunks(server, path, stream_options=options)
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 6
    assert all("obfuscation" not in chunk for chunk in answer)
    # the same reply as without it; where chunks split depends on the reader's pace (deltas coalesce), so each
    # choice's fields are compared joined
    assert _joined_choices(answer) == _joined_choices(streamed_chunks(server, path,
                                                                      stream_options={"include_usage": True}))


def _joined_choices(chunks: list[dict]) -> dict[int, dict]:
    """Per choice index, every text field of its deltas (chat) or chunks (completions) joined, and its finish
    reason."""
    joined: dict[int, dict] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            entry = joined.setdefault(choice["index"], {})
            for key, value in (choice.get("delta") or {"text": choice.get("text")}).items():
                if isinstance(value, str):
                    entry[key] = entry.get(key, "") + value
            if choice.get("finish_reason") is not None:
                entry["finish_reason"] = choice["finish_reason"]
    return joined


@pytest.mark.parametrize("value", ["no", 0, None])
def test_an_include_obfuscation_that_is_not_a_boolean_is_400_naming_it(server, value):
    if value is None:  # null is unset, as everywhere
        assert streamed_chunks(server, "/chat/completions", stream_options={"include_obfuscation": None})
        return
    error = chat_error(server, stream=True, stream_options={"include_obfuscation": value})
    assert error["param"] == "stream_options.include_obfuscation", error


@pytest.mark.parametrize("options", [{}, {"mode": "explicit", "ttl": "30m"}, {"mode": "implicit"}])
def test_prompt_cache_options_of_the_openai_sdk_are_accepted_and_change_nothing(server, client, options):
    """`prompt_cache_options` replaces the deprecated `prompt_cache_retention`, which was accepted while it was a 400
    as an unknown field; like it, a caching hint cannot change the output."""
    def ask(**fields):
        return client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, temperature=0,
                                              extra_body={"chat_template_kwargs": PINNED_DATE, **fields})

    hinted, plain = ask(prompt_cache_options=options), ask()
    assert hinted.choices[0].message == plain.choices[0].message
    assert hinted.usage.prompt_tokens == plain.usage.prompt_tokens


@pytest.mark.parametrize(("options", "param"), [({"mode": "always"}, "prompt_cache_options.mode"),
                                                ({"ttl": "1h"}, "prompt_cache_options.ttl"),
                                                ({"size": 3}, "prompt_cache_options.size"),
                                                ("implicit", "prompt_cache_options")])
def test_prompt_cache_options_that_openai_refuses_are_400_naming_the_field(server, options, param):
    error = chat_error(server, prompt_cache_options=options)
    assert error["param"] == param, error


@pytest.mark.parametrize("logprobs", [{}, {"logprobs": False}, {"logprobs": None}])
def test_top_logprobs_0_without_logprobs_asks_for_none(server, logprobs):
    reply = httpx.post(server.base_url + "/chat/completions", timeout=60, json={
        "model": "tiny", "messages": MESSAGES, "max_tokens": 2, "top_logprobs": 0, **logprobs})
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["logprobs"] is None


def test_positive_top_logprobs_without_logprobs_is_a_400_naming_the_fix(server):
    error = chat_error(server, top_logprobs=2)
    assert error["param"] == "top_logprobs" and "set logprobs to true" in error["message"]


@pytest.mark.parametrize("value", ["yes", 2, [True], {"on": True}])
def test_a_continuous_usage_stats_that_is_not_a_boolean_is_400_naming_it(server, value):
    error = chat_error(server, stream=True, stream_options={"continuous_usage_stats": value})
    assert error["param"] == "stream_options.continuous_usage_stats", error


BATCH = [[5 + (7 * i + j) % 300 for j in range(33 + 5 * i)] for i in range(3)]  # each past a KV block, to be cached
BATCH_N, BATCH_TOKENS = 2, 5


def _batch(server, stream: bool, **fields) -> dict | list[dict]:
    """A completion of BATCH, n=BATCH_N, BATCH_TOKENS each; streamed: its chunks, the usage on every one."""
    body = {"model": "tiny", "prompt": BATCH, "n": BATCH_N, "max_tokens": BATCH_TOKENS, "ignore_eos": True,
            "stream": stream, "stream_options": {"include_usage": True, "continuous_usage_stats": True} if stream
            else None, **fields}
    if not stream:
        response = httpx.post(server.base_url + "/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        return response.json()
    with httpx.stream("POST", server.base_url + "/completions", json=body, timeout=60) as response:
        assert response.status_code == 200, response.read()
        return [json.loads(line[len("data: "):]) for line in response.iter_lines() if line.startswith("data: {")]


def _listed_tokens(choice: dict, echoed: int) -> int:
    """The completion tokens a choice (or a chunk of one) lists in its logprobs, less the `echoed` prompt tokens."""
    return len(choice["logprobs"]["tokens"]) - echoed


def _whole_batch_usage(server, **fields) -> dict:
    """The usage of a completion of BATCH, checked against its choices: prompt_tokens sums the prompts,
    completion_tokens the choices' tokens (BATCH_TOKENS each; with logprobs, as many as they list)."""
    whole = _batch(server, stream=False, **fields)
    choices, prompt_tokens = whole["choices"], sum(map(len, BATCH))
    assert sorted(choice["index"] for choice in choices) == list(range(len(BATCH) * BATCH_N))
    if "logprobs" in fields:
        assert [_listed_tokens(choice, len(BATCH[choice["index"] // BATCH_N]) if fields.get("echo") else 0)
                for choice in choices] == [BATCH_TOKENS] * len(choices)
    usage = whole["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (
        prompt_tokens, BATCH_TOKENS * len(choices), prompt_tokens + BATCH_TOKENS * len(choices))
    return usage


@pytest.mark.parametrize("fields", [{}, {"echo": True}, {"logprobs": 1}, {"echo": True, "logprobs": 1}],
                         ids=["plain", "echo", "logprobs", "echo-logprobs"])
def test_a_batch_usage_is_the_sum_over_its_choices_in_every_chunk_and_in_the_response(server, fields):
    """prompt_tokens sums the prompts, completion_tokens every choice's tokens so far, cached_tokens per prompt the
    most its n choices found cached; each chunk's usage (continuous_usage_stats) as it is when the chunk is sent."""
    fields = {**fields, "min_tokens": BATCH_TOKENS}
    logprobs = "logprobs" in fields
    _whole_batch_usage(server, **fields)  # also fills the prefix cache for the requests below
    # what each prompt finds cached, asked alone: any of its n choices finds as much
    cached_alone = [_batch(server, stream=False, **fields, prompt=prompt, n=1)["usage"]["prompt_tokens_details"][
        "cached_tokens"] for prompt in BATCH]
    assert all(cached_alone) or fields.get("echo") and logprobs  # scoring the prompt reads none of it from the cache
    assert _whole_batch_usage(server, **fields)["prompt_tokens_details"]["cached_tokens"] == sum(cached_alone)
    prompt_tokens = sum(map(len, BATCH))
    *answer, last = _batch(server, stream=True, **fields)
    assert last["choices"] == [] and last["usage"] == answer[-1]["usage"]
    assert last["usage"]["prompt_tokens_details"]["cached_tokens"] == sum(cached_alone)
    tokens_of: dict[int, int] = {}  # choice index → the completion tokens its chunks brought, by the usage's counts
    completion = 0
    for chunk in answer:
        (choice,) = chunk["choices"]
        index, first = choice["index"], choice["index"] not in tokens_of
        chunk_usage = chunk["usage"]
        brought = chunk_usage["completion_tokens"] - completion
        if logprobs:  # the tokens listed are the count's growth
            echoed = len(BATCH[index // BATCH_N]) if first and fields.get("echo") else 0
            assert brought == _listed_tokens(choice, echoed), chunk
        assert brought >= 0, chunk
        tokens_of[index] = tokens_of.get(index, 0) + brought
        completion = chunk_usage["completion_tokens"]
        assert chunk_usage["prompt_tokens"] == prompt_tokens
        assert chunk_usage["total_tokens"] == prompt_tokens + completion
        # a choice's cached tokens come with its first chunk, and a prompt's count once, however many choices it has
        begun = {index // BATCH_N for index in tokens_of}
        assert chunk_usage["prompt_tokens_details"]["cached_tokens"] == sum(cached_alone[i] for i in begun), chunk
    assert tokens_of == {index: BATCH_TOKENS for index in range(len(BATCH) * BATCH_N)}


def test_a_beam_searched_batch_streams_its_whole_usage_on_every_chunk(server):
    """Beam search streams its choices once the search has ended: every chunk carries the usage of them all."""
    _whole_batch_usage(server, use_beam_search=True)  # fills the prefix cache as it is for the two below
    chunks = _batch(server, stream=True, use_beam_search=True)
    assert len(chunks) == len(BATCH) * BATCH_N + 1
    usage = _whole_batch_usage(server, use_beam_search=True)
    assert all(chunk["usage"] == usage for chunk in chunks)



@pytest.mark.parametrize(("fields", "param"), [({"service_tier": "fastest"}, "service_tier"),
                                               ({"prompt_cache_retention": "forever"}, "prompt_cache_retention"),
                                               ({"prompt_cache_retention": "in-memory"}, "prompt_cache_retention")])
def test_a_tier_or_cache_retention_openai_refuses_is_400_on_chat_as_on_responses(server, fields, param):
    """Chat and completions took any string for `service_tier` and `prompt_cache_retention`, where /v1/responses
    and OpenAI refuse a value the SDK does not type."""
    assert chat_error(server, **fields)["param"] == param
    response = httpx.post(server.base_url + "/completions", timeout=30,
                          json={"model": "tiny", "prompt": PROMPT, "max_tokens": 1, **fields})
    assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text


def test_every_tier_and_cache_retention_of_the_openai_sdk_is_taken_on_chat_and_changes_nothing(client):
    def answer(**hints):
        return client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, temperature=0,
                                              extra_body={"chat_template_kwargs": PINNED_DATE, **hints}
                                              ).choices[0].message

    plain = answer()
    for tier in ("auto", "default", "flex", "scale", "priority", "fast", "ultrafast"):
        assert answer(service_tier=tier) == plain
    for retention in ("in_memory", "24h"):
        assert answer(prompt_cache_retention=retention) == plain


@pytest.mark.parametrize("tier", [None, "auto", "flex", "priority"])
def test_a_chat_completion_reports_the_default_tier_that_served_it_as_openai_and_responses_do(client, tier):
    """A chat completion (and each of its chunks) left `service_tier` out, which the SDK reads as None, where OpenAI
    reports the tier that served the request and /v1/responses reports "default": Glimmer serves every request in one
    tier, whatever tier was asked for."""
    hints = {} if tier is None else {"service_tier": tier}
    completion = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, temperature=0,
                                                extra_body={"chat_template_kwargs": PINNED_DATE, **hints})
    chunks = list(client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, temperature=0,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body={"chat_template_kwargs": PINNED_DATE, **hints}))
    assert chunks[-1].usage is not None and not chunks[-1].choices
    assert {completion.service_tier} | {chunk.service_tier for chunk in chunks} == {"default"}


def test_verbosity_medium_openai_s_default_is_taken_and_changes_nothing(client):
    """`verbosity` was a 400 whatever its value, "medium" too: OpenAI's default, which asks for nothing different."""
    def answer(**fields):
        return client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, temperature=0,
                                              extra_body={"chat_template_kwargs": PINNED_DATE}, **fields
                                              ).choices[0].message

    assert answer(verbosity="medium") == answer()


@pytest.mark.parametrize("value", ["low", "high", "loud", 1])
def test_a_verbosity_glimmer_cannot_honour_is_400_naming_it(server, value):
    error = chat_error(server, verbosity=value)
    assert error["param"] == "verbosity", error


def test_an_empty_mm_processor_kwargs_is_no_overrides_and_a_key_is_refused_naming_it(server, client):
    """vLLM's chat request takes `mm_processor_kwargs`, and LLM.generate takes it empty (None or {}): the server
    refused even `{}` as an unknown field. A key is refused naming it, as LLM.generate refuses any."""
    fields = {"chat_template_kwargs": PINNED_DATE}
    plain = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, temperature=0,
                                           extra_body=fields)
    empty = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, temperature=0,
                                           extra_body={**fields, "mm_processor_kwargs": {}})
    assert empty.choices[0].message.content == plain.choices[0].message.content
    error = chat_error(server, mm_processor_kwargs={"max_pixels": 1024, "fps": 2})
    assert error["param"] == "mm_processor_kwargs.max_pixels" and "not supported per request" in error["message"]
    assert chat_error(server, mm_processor_kwargs=[1])["param"] == "mm_processor_kwargs"
