"""vLLM's `use_beam_search` on /v1/completions: n is the beam width, the choices of a prompt are its best beams, best
first, as `LLM.beam_search` finds them; what beam search cannot take is a 400 naming the field."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import time
from collections.abc import Callable
from dataclasses import replace

import httpx
import pytest
from server_support import live_server

from glimmer import LLM, SamplingParams
from glimmer.engine.beam_search import BeamSearchParams

PROMPTS = [[5, 77, 130, 42, 99, 310, 12, 8, 250, 61, 17, 23, 40, 41, 42, 43, 44, 45], [300, 12]]
BEAM = {"model": "tiny", "prompt": PROMPTS, "n": 3, "max_tokens": 4, "use_beam_search": True, "length_penalty": 0.5}


@pytest.fixture(scope="module")
def checkpoint(make_tiny):
    return make_tiny(seed=11)


@pytest.fixture(scope="module")
def server(checkpoint, same_cpu_kernels_in_module):
    with live_server(checkpoint) as live:
        yield live


def post(server, **body) -> httpx.Response:
    return httpx.post(server.base_url + "/completions", json=body, timeout=120)


def test_choices_are_each_prompts_best_beams_best_first(server, checkpoint, same_cpu_kernels):
    response = post(server, **BEAM)
    assert response.status_code == 200, response.text
    body = response.json()
    expected = LLM(str(checkpoint), progress=False).beam_search(PROMPTS, BeamSearchParams(
        beam_width=3, max_tokens=4, length_penalty=0.5))
    tokenizer = server.engine.engine.tokenizer
    choices = body["choices"]
    assert [choice["index"] for choice in choices] == list(range(6))
    for number, output in enumerate(expected):
        for rank, sequence in enumerate(output.sequences):
            choice = choices[number * 3 + rank]
            assert choice["text"] == tokenizer.decode([entry.token_id for entry in sequence.logprobs])
            assert choice["finish_reason"] == sequence.finish_reason == "length"
    assert body["usage"]["completion_tokens"] == 6 * 4
    assert body["usage"]["prompt_tokens"] == sum(map(len, PROMPTS))
    # streamed, the same choices come whole, one chunk each
    with httpx.stream("POST", server.base_url + "/completions", json={**BEAM, "stream": True,
                                                                     "stream_options": {"include_usage": True}},
                      timeout=120) as streamed:
        events = [line.removeprefix("data: ") for line in streamed.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert [chunk["choices"][0] for chunk in chunks[:-1]] == choices
    usage = chunks[-1]["usage"]
    assert {key: usage[key] for key in ("prompt_tokens", "completion_tokens")} == {
        key: body["usage"][key] for key in ("prompt_tokens", "completion_tokens")}
    # the first request's beams left the first prompt's full block in the prefix cache
    assert usage["prompt_tokens_details"]["cached_tokens"] == 16
    server.wait_for_idle()


def test_use_beam_search_false_and_neutral_options_change_nothing(server):
    plain = {"model": "tiny", "prompt": PROMPTS[1], "max_tokens": 3, "temperature": 0}
    expected = post(server, **plain).json()["choices"][0]["text"]
    taken = post(server, **plain, use_beam_search=False, length_penalty=1.0, early_stopping=False)
    assert taken.status_code == 200 and taken.json()["choices"][0]["text"] == expected
    # the fields a vLLM client sends at their neutral values are taken beside beam search
    assert post(server, **BEAM, temperature=0, top_p=1, top_k=-1, stop=[], logprobs=None, seed=3).status_code == 200


def test_a_temperature_is_taken_and_changes_no_beam(server):
    """As vLLM's beam search takes a temperature (it was a 400 here): the search ranks by the model's own logprobs,
    so its choices are those at temperature 0."""
    searched = [post(server, **BEAM, temperature=temperature) for temperature in (0, 0.7, 2)]
    assert all(response.status_code == 200 for response in searched), searched[-1].text
    texts = [[choice["text"] for choice in response.json()["choices"]] for response in searched]
    assert texts[1] == texts[2] == texts[0]
    chats = [chat(server, use_beam_search=True, n=2, temperature=temperature) for temperature in (0, 1.3)]
    assert chats[1].status_code == 200, chats[1].text
    assert [choice["message"] for choice in chats[1].json()["choices"]] == [
        choice["message"] for choice in chats[0].json()["choices"]]


@pytest.mark.parametrize(("fields", "param"), [
    ({"temperature": -0.7}, "temperature"), ({"stop": ["x"]}, "stop"), ({"logprobs": 1}, "logprobs"),
    ({"echo": True}, "echo"), ({"repetition_penalty": 1.2}, "repetition_penalty"), ({"min_tokens": 1}, "min_tokens"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"guided_regex": "a+"}, "guided_regex"), ({"early_stopping": True}, "early_stopping"),
    ({"n": 11}, "n"), ({"max_tokens": 0}, "max_tokens"), ({"length_penalty": float("inf")}, "length_penalty"),
])
def test_what_beam_search_cannot_take_is_a_400_naming_it(server, fields, param):
    response = httpx.post(server.base_url + "/completions", timeout=60,
                          content=json.dumps({**BEAM, **fields}, allow_nan=True), headers={
                              "content-type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"].startswith(f"{param}: ")


@pytest.mark.parametrize("length_penalty", [300.0, -300.0])
def test_a_length_penalty_past_floats_range_is_served(server, length_penalty):
    """A prompt of 18 tokens to the power 300 overflows float, and to -300 is 0: the search ran, then its ranking
    raised OverflowError or ZeroDivisionError, a 500."""
    response = post(server, **{**BEAM, "length_penalty": length_penalty})
    assert response.status_code == 200, response.text
    assert len(response.json()["choices"]) == len(PROMPTS) * BEAM["n"]


@pytest.mark.parametrize(("fields", "param"), [({"length_penalty": 0.5}, "length_penalty"),
                                               ({"early_stopping": True}, "early_stopping")])
def test_beam_search_options_without_it_are_refused(server, fields, param):
    response = post(server, model="tiny", prompt="hi", max_tokens=2, **fields)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and "use_beam_search" in error["message"]


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 6,
        "chat_template_kwargs": {"current_date": "2026-01-01"}}


def chat(server, **body) -> httpx.Response:
    return httpx.post(server.base_url + "/chat/completions", json={**CHAT, **body}, timeout=120)


def test_a_chat_choice_is_its_beams_turn_read_as_any_reply(server, checkpoint, same_cpu_kernels):
    """Width 1 is greedy decoding: its choice is the greedy reply, message and usage alike; wider, the n choices are
    the beams LLM.beam_search finds for the rendered prompt, best first, each read as a reply."""
    greedy = chat(server, temperature=0).json()
    beam = chat(server, use_beam_search=True)
    assert beam.status_code == 200, beam.text
    one = beam.json()
    assert one["choices"][0]["message"] == greedy["choices"][0]["message"]
    assert one["choices"][0]["finish_reason"] == greedy["choices"][0]["finish_reason"]
    assert one["usage"]["completion_tokens"] == greedy["usage"]["completion_tokens"]
    prompt = httpx.post(server.url + "/tokenize", json={key: CHAT[key] for key in (
        "model", "messages", "chat_template_kwargs")}, timeout=60).json()["tokens"]
    expected = LLM(str(checkpoint), progress=False).beam_search([prompt], BeamSearchParams(
        beam_width=3, max_tokens=6, length_penalty=2.0))[0].sequences
    wide = chat(server, use_beam_search=True, n=3, length_penalty=2.0).json()
    assert [choice["index"] for choice in wide["choices"]] == [0, 1, 2]
    assert [choice["finish_reason"] for choice in wide["choices"]] == [s.finish_reason for s in expected]
    assert wide["usage"]["completion_tokens"] == sum(len(s.logprobs) for s in expected)
    with httpx.stream("POST", server.base_url + "/chat/completions", timeout=120, json={
            **CHAT, "use_beam_search": True, "n": 3, "length_penalty": 2.0, "stream": True}) as streamed:
        chunks = [json.loads(line.removeprefix("data: ")) for line in streamed.iter_lines()
                  if line.startswith("data: {")]
    finishes = {c["choices"][0]["index"]: c["choices"][0]["finish_reason"] for c in chunks
                if c["choices"] and c["choices"][0]["finish_reason"]}
    assert finishes == {choice["index"]: choice["finish_reason"] for choice in wide["choices"]}
    server.wait_for_idle()


@pytest.mark.parametrize(("fields", "param"), [
    ({"temperature": -1.0}, "temperature"), ({"logprobs": True}, "logprobs"), ({"stop": ["."]}, "stop"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}, "tools"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"thinking_token_budget": 4}, "thinking_token_budget"), ({"n": 0}, "n"),
])
def test_what_beam_search_cannot_take_on_chat_is_a_400_naming_it(server, fields, param):
    response = chat(server, use_beam_search=True, **fields)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_a_chat_beam_ended_by_a_stop_id_reads_as_the_reply_it_ended(server, checkpoint, monkeypatch,
                                                                    same_cpu_kernels):
    """The random model never ends its turn; the test makes a stop id of the greedy reply's third token, so the
    greedy reply and the width-1 beam both end there: the same message, finish_reason and stop_reason."""
    engine = server.engine.engine
    prompt = httpx.post(server.url + "/tokenize", json={key: CHAT[key] for key in (
        "model", "messages", "chat_template_kwargs")}, timeout=60).json()["tokens"]
    stop_id = LLM(str(checkpoint), progress=False).generate(prompt, SamplingParams(
        temperature=0, max_tokens=3, ignore_eos=True))[0].token_ids[2]
    monkeypatch.setattr(engine, "generation_defaults", replace(engine.generation_defaults, stop_token_ids=(stop_id,)))
    greedy = chat(server, temperature=0).json()["choices"][0]
    beam = chat(server, use_beam_search=True).json()["choices"][0]
    assert greedy["finish_reason"] == "stop" and greedy["stop_reason"] == stop_id
    assert {key: beam[key] for key in ("message", "finish_reason", "stop_reason")} == {
        key: greedy[key] for key in ("message", "finish_reason", "stop_reason")}


def test_a_completion_beam_ended_by_a_stop_id_reads_as_the_sampled_choice_it_ended(server, checkpoint, monkeypatch,
                                                                                   same_cpu_kernels):
    """As for chat: with a stop id made of the greedy completion's third token, the greedy choice and the width-1
    beam end there alike, the stop id's text kept in both (a completion's raw text keeps the token that ended it)."""
    engine = server.engine.engine
    stop_id = LLM(str(checkpoint), progress=False).generate(PROMPTS[0], SamplingParams(
        temperature=0, max_tokens=3, ignore_eos=True))[0].token_ids[2]
    monkeypatch.setattr(engine, "generation_defaults", replace(engine.generation_defaults, stop_token_ids=(stop_id,)))
    plain = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 6}
    greedy = post(server, **plain, temperature=0).json()["choices"][0]
    beam = post(server, **plain, use_beam_search=True).json()["choices"][0]
    assert greedy["finish_reason"] == "stop" and greedy["stop_reason"] == stop_id
    assert {key: beam[key] for key in ("text", "finish_reason", "stop_reason")} == {
        key: greedy[key] for key in ("text", "finish_reason", "stop_reason")}


def test_a_client_request_id_names_a_beam_search_response(server):
    """The header or the body's request_id names a beam search's response as any other's (request_id.py); two
    searches in flight under one id stay two."""
    completion = httpx.post(server.base_url + "/completions", json={**BEAM, "request_id": "beams-1"}, timeout=120)
    assert completion.status_code == 200, completion.text
    assert completion.json()["id"] == "cmpl-beams-1"
    replies = [httpx.post(server.base_url + "/chat/completions", json={**CHAT, "use_beam_search": True, "n": 2},
                          headers={"X-Request-Id": "beams-2"}, timeout=120) for _ in range(2)]
    assert [reply.status_code for reply in replies] == [200, 200], replies[0].text
    assert [reply.json()["id"] for reply in replies] == ["chatcmpl-beams-2"] * 2
    assert replies[0].json()["choices"] == replies[1].json()["choices"]


def test_a_beam_that_generated_a_placeholder_id_goes_on_as_greedy_decoding_does(server, monkeypatch):
    """A placeholder id the model generates is no stray placeholder of the prompt (a 400 mid-search, before)."""
    body = {"model": "tiny", "prompt": PROMPTS[1], "max_tokens": 3, "ignore_eos": True}
    greedy = post(server, **body, temperature=0, logprobs=0).json()["choices"][0]
    first = server.engine.engine.tokenizer.encode(greedy["logprobs"]["tokens"][0], add_special_tokens=False)
    config = copy.copy(server.engine.engine.model_config)  # a text-only config refuses one at construction
    object.__setattr__(config, "image_token_id", first[0])
    monkeypatch.setattr(server.engine.engine, "model_config", config)
    response = post(server, **body, n=1, use_beam_search=True)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"] == greedy["text"]


def test_a_search_without_the_prefix_cache_warns_once_that_it_recomputes(checkpoint, caplog):
    """Every step's beams computed the prompt and their tokens in full again, silently quadratic in max_tokens."""
    body = {**BEAM, "prompt": PROMPTS[1], "n": 2, "max_tokens": 2}
    with live_server(checkpoint, engine_options={"enable_prefix_caching": False}) as live, \
            caplog.at_level(logging.WARNING, logger="glimmer.engine.beam_search"):
        for _ in range(2):
            response = post(live, **body)
            assert response.status_code == 200, response.text
    # the search's own logger: a record another logger makes meanwhile (asyncio's, of a client a garbage-collected
    # earlier test left) is not this test's
    [record] = [r for r in caplog.records if r.name == "glimmer.engine.beam_search"]
    assert "without the prefix cache" in record.message and "--no-enable-prefix-caching" in record.message


def test_a_search_the_full_queue_refuses_queues_none_of_its_beams(checkpoint, monkeypatch):
    """The queue limit refuses a search whole, before any of its beams is queued (a 429): its other prompts' beams,
    started beside its first one, were added to the engine past the limit and aborted only once the first was
    refused."""
    with live_server(checkpoint, scripted=True, max_waiting_requests=1, engine_options={"max_num_seqs": 1}) as live:
        engine = live.engine
        added = []
        add_request = engine.engine.add_request
        monkeypatch.setattr(engine.engine, "add_request", lambda request_id, *args, **kwargs: (
            added.append(request_id), add_request(request_id, *args, **kwargs))[1])

        async def settle(done: Callable[[], bool]) -> None:
            deadline = time.monotonic() + 5  # (the running request takes far longer to finish)
            while not done():
                assert time.monotonic() < deadline, (engine.num_waiting_requests, added)
                await asyncio.sleep(0.01)

        async def run() -> None:
            running = engine.generate("running", PROMPTS[1], SamplingParams(max_tokens=1900, ignore_eos=True))
            await anext(running)  # it holds the one sequence slot for the whole test (a step takes 50 ms)
            queued = asyncio.ensure_future(anext(engine.generate("waiting", PROMPTS[1], SamplingParams(max_tokens=1))))
            await settle(lambda: engine.num_waiting_requests == 1 and "waiting" in added)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(live.app), base_url="http://glimmer") as client:
                refused = await client.post("/v1/completions", json={**BEAM, "prompt": PROMPTS + [[7, 8, 9]]})
            assert refused.status_code == 429, refused.text
            # none of its beams was added, nor is queued to be (queued ones count as waiting)
            assert added == ["running", "waiting"] and engine.num_waiting_requests == 1
            queued.cancel()
            await running.aclose()
            await settle(lambda: engine.num_waiting_requests == 0)

        live.engine.engine.runner.step_delay_s = 0.05
        asyncio.run(run())
        live.engine.engine.runner.step_delay_s = 0.0
        live.wait_for_idle()
