"""`LLM.beam_search` (vLLM's beam search) against a brute-force search over the reference's full forward (float32,
a tiny random model): the same sequences, cumulative logprobs and order."""

from __future__ import annotations

import copy
import dataclasses
import logging
from dataclasses import replace
from unittest.mock import MagicMock

import pytest
import torch
from oracle import reference_logits, reference_model

from glimmer import LLM, SamplingParams
from glimmer.engine.beam_search import BeamSearch, BeamSearchParams
from glimmer.engine.sampler import TokenLogprobs
from glimmer.errors import RequestError, UnsupportedArgumentError
from glimmer.tiny import TinySpec


@pytest.fixture(scope="module")
def checkpoint(make_tiny):
    return make_tiny(spec=TinySpec(sliding_window=16), seed=11)


@pytest.fixture(scope="module")
def llm(checkpoint):
    return LLM(str(checkpoint), progress=False, max_model_len=128)


@pytest.fixture(scope="module")
def reference(checkpoint):
    return reference_model(checkpoint)


def _prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(7)
    # 37 tokens span two full KV blocks (16): the beams' requests read them from the prefix cache
    return [torch.randint(0, 480, (n,), generator=generator).tolist() for n in (3, 37, 1)]


def reference_beam_search(model, prompt: list[int], params: BeamSearchParams, stop_ids: set[int],
                          token_count: int) -> list[tuple[list[int], float]]:
    """vLLM's beam search written out over the reference: every live beam's sequence run whole through the model
    (no cache), its 2 * beam_width most likely tokens (of the tokenizer's ids) its candidates; a stop id finishes
    its beam; the beam_width most likely of the others stay live; after max_tokens steps the finished and live
    beams ranked by cum_logprob / (prompt + generated tokens but a final stop id) ** length_penalty.
    Returns (generated tokens, a final stop id included; cum_logprob), best first."""
    live: list[tuple[list[int], float]] = [([], 0.0)]
    finished: list[tuple[list[int], float]] = []
    for _ in range(params.max_tokens):
        growing = []
        for tokens, cum in live:
            row = torch.log_softmax(reference_logits(model, prompt + tokens)[-1], dim=-1)
            values, ids = row[:token_count].topk(2 * params.beam_width)
            for token, logprob in zip(ids.tolist(), values.tolist(), strict=True):
                (finished if token in stop_ids else growing).append((tokens + [token], cum + logprob))
        live = sorted(growing, key=lambda beam: -beam[1])[: params.beam_width]

    def score(beam: tuple[list[int], float]) -> float:
        length = len(prompt) + len(beam[0]) - (beam[0][-1] in stop_ids)
        return beam[1] / length ** params.length_penalty

    return sorted(finished + live, key=score, reverse=True)[: params.beam_width]


def _assert_same_beams(output, prompt, expected, params, stop_ids):
    assert len(output.sequences) == len(expected)
    for sequence, (tokens, cum) in zip(output.sequences, expected, strict=True):
        ended = tokens[-1] in stop_ids
        kept = tokens[:-1] if ended and not params.include_stop_str_in_output else tokens
        assert sequence.tokens == prompt + kept
        assert sequence.cum_logprob == pytest.approx(cum, abs=1e-4)
        assert sequence.finish_reason == ("stop" if ended else "length")
        # one entry per generated token, keyed by its beam's candidates, summing to cum_logprob
        assert [entry.token_id for entry in sequence.logprobs] == tokens
        assert all(len(entry) == 2 * params.beam_width for entry in sequence.logprobs)
        assert sum(entry[token].logprob for entry, token in zip(sequence.logprobs, tokens, strict=True)) == \
            pytest.approx(sequence.cum_logprob)


@pytest.mark.parametrize(("beam_width", "length_penalty"), [(1, 1.0), (2, 1.0), (3, 0.5), (4, 2.0)])
def test_beams_match_a_brute_force_search_over_the_reference(llm, reference, beam_width, length_penalty):
    params = BeamSearchParams(beam_width=beam_width, max_tokens=4, length_penalty=length_penalty)
    prompts = _prompts()
    stop_ids = set(llm.engine.generation_defaults.stop_token_ids)
    outputs = llm.beam_search(prompts, params)
    for prompt, output in zip(prompts, outputs, strict=True):
        expected = reference_beam_search(reference, prompt, params, stop_ids, llm.engine.token_count)
        _assert_same_beams(output, prompt, expected, params, stop_ids)
        scores = [sequence.score for sequence in output.sequences]
        assert scores == sorted(scores, reverse=True)
        assert output.sequences[0].text == llm.engine.tokenizer.decode(output.sequences[0].tokens)


def _candidates(*logprobs: dict[int, float]) -> list[TokenLogprobs]:
    return [TokenLogprobs(next(iter(top)), top[next(iter(top))], top) for top in logprobs]


@pytest.mark.parametrize(("length_penalty", "best"), [
    (300.0, [[5, 7], [5, 8]]), (-300.0, [[], [5, 7]]), (1e308, [[5, 7], [5, 8]]), (-1e308, [[], [5, 7]]),
    (1.0, [[], [5, 7]])])
def test_a_length_penalty_whose_power_leaves_floats_range_still_ranks_by_the_formula(length_penalty, best):
    """20 ** 300 overflows float and 20 ** -300 is 0: ranking raised OverflowError or ZeroDivisionError (the server's
    beam search answered 500 once its whole search had run). A large penalty puts the longer beams first, a large
    negative one the shorter, as cum_logprob / length ** length_penalty orders them."""
    params = BeamSearchParams(beam_width=2, max_tokens=2, length_penalty=length_penalty)
    search = BeamSearch(list(range(20)), params, stop_ids={9}, budget=2)
    search.advance(_candidates({9: -0.1, 5: -0.5, 6: -0.7, 4: -3.0}))  # 9 ends a beam: 20 tokens, the stop id not
    search.advance(_candidates({7: -0.5, 8: -0.6, 3: -4.0, 2: -5.0}, {7: -0.6, 8: -0.9, 3: -4.0, 2: -5.0}))
    results = search.results(MagicMock(decode=str), None).sequences
    assert [sequence.tokens[20:] for sequence in results] == best
    scores = [sequence.score for sequence in results]
    assert scores == sorted(scores, reverse=True) and all(score <= 0 for score in scores)


@pytest.mark.parametrize("temperature", [0.7, 1.5])
def test_a_temperature_is_taken_and_changes_no_beam(llm, reference, temperature):
    """vLLM's beam search takes a temperature (its server passes 1.0 to one that sends none); the search ranks by
    the model's own logprobs, so the beams are those of the brute-force search, which knows no temperature (it was
    refused here)."""
    params = BeamSearchParams(beam_width=3, max_tokens=4, temperature=temperature)
    prompts = _prompts()
    stop_ids = set(llm.engine.generation_defaults.stop_token_ids)
    for prompt, output in zip(prompts, llm.beam_search(prompts, params), strict=True):
        expected = reference_beam_search(reference, prompt, params, stop_ids, llm.engine.token_count)
        _assert_same_beams(output, prompt, expected, params, stop_ids)


@pytest.mark.parametrize("include_stop_str_in_output", [False, True])
def test_a_stop_id_among_the_candidates_ends_its_beam(llm, reference, monkeypatch, include_stop_str_in_output):
    """This random model never ranks the checkpoint's stop ids high; the test makes stop ids of two tokens its
    beams do rank high at their second step, so some beams end there (finish_reason "stop") and are ranked,
    length-penalised, beside the beams that ran to max_tokens."""
    prompt = _prompts()[1]
    params = BeamSearchParams(beam_width=3, max_tokens=4, length_penalty=0.0,
                              include_stop_str_in_output=include_stop_str_in_output)
    free = reference_beam_search(reference, prompt, params, set(), llm.engine.token_count)
    stop_ids = {free[0][0][1], free[1][0][1]}
    monkeypatch.setattr(llm.engine, "generation_defaults",
                        replace(llm.engine.generation_defaults, stop_token_ids=tuple(stop_ids)))
    output = llm.beam_search([prompt], params)[0]
    expected = reference_beam_search(reference, prompt, params, stop_ids, llm.engine.token_count)
    assert any(tokens[-1] in stop_ids for tokens, _ in expected)  # the case this test is about occurs
    _assert_same_beams(output, prompt, expected, params, stop_ids)
    stopped = [sequence for sequence in output.sequences if sequence.finish_reason == "stop"]
    assert all(sequence.stop_reason in stop_ids for sequence in stopped)
    # ignore_eos: no id ends a beam
    ignoring = llm.beam_search([prompt], replace(params, ignore_eos=True))[0]
    assert all(sequence.finish_reason == "length" for sequence in ignoring.sequences)


def test_width_one_is_greedy_decoding(llm):
    prompt = _prompts()[1]
    beam = llm.beam_search([prompt], BeamSearchParams(beam_width=1, max_tokens=8, ignore_eos=True))[0].sequences[0]
    greedy = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0))[0]
    assert beam.tokens == prompt + greedy.token_ids
    assert beam.cum_logprob == pytest.approx(greedy.outputs[0].cumulative_logprob, abs=1e-5)


def test_beams_read_the_prompt_from_the_prefix_cache(llm, monkeypatch):
    kv = llm.engine.scheduler.kv
    found = []  # (whether the lookup counts in the metrics, tokens found cached) per admitted request

    def acquire_cached_prefix(seq):
        cached = type(kv).acquire_cached_prefix(kv, seq)
        found.append((seq.counts_prefix_lookup, cached))
        return cached

    monkeypatch.setattr(kv, "acquire_cached_prefix", acquire_cached_prefix)
    before = llm.engine.stats()["prefix_cache_hits"]
    llm.beam_search([_prompts()[1]], BeamSearchParams(beam_width=2, max_tokens=3))
    later_steps = [cached for counted, cached in found if not counted]
    # every later step's requests find at least the prompt's two full blocks cached
    assert len(later_steps) >= 2 and min(later_steps) >= 32
    # and the metrics count the search's prompt once, at its first step (the later steps' hits are its own blocks)
    assert llm.engine.stats()["prefix_cache_hits"] - before == sum(cached for counted, cached in found if counted)


def _search_records(caplog) -> list[logging.LogRecord]:
    """The beam search logger's records: another logger's record meanwhile (asyncio's, of a client an earlier test
    left and the garbage collector closes now) is not the search's."""
    return [record for record in caplog.records if record.name == "glimmer.engine.beam_search"]


def test_a_search_without_the_prefix_cache_warns_once_per_engine_that_it_recomputes(checkpoint, llm, caplog):
    """Every step's beams computed the prompt and their tokens in full again, silently quadratic in max_tokens."""
    uncached = LLM(str(checkpoint), progress=False, max_model_len=128, enable_prefix_caching=False)
    params = BeamSearchParams(beam_width=2, max_tokens=2)
    with caplog.at_level(logging.WARNING, logger="glimmer.engine.beam_search"):
        llm.beam_search([_prompts()[0]], params)
        assert not _search_records(caplog)
        uncached.beam_search([_prompts()[0]], params)
        uncached.beam_search([_prompts()[1]], params)
    [record] = _search_records(caplog)
    assert "without the prefix cache" in record.message
    assert "--no-enable-prefix-caching / enable_prefix_caching=False" in record.message


def test_beams_end_where_the_context_does(llm):
    prompt = _prompts()[1] * 3 + [1] * (llm.engine.max_model_len - 3 * 37 - 2)
    output = llm.beam_search([prompt], BeamSearchParams(beam_width=2, max_tokens=10, ignore_eos=True))[0]
    assert [len(sequence.tokens) for sequence in output.sequences] == [llm.engine.max_model_len] * 2
    assert all(sequence.finish_reason == "length" for sequence in output.sequences)


@pytest.mark.parametrize(("arguments", "param"), [
    ({"beam_width": 0}, "beam_width"), ({"beam_width": 11}, "beam_width"), ({"beam_width": True}, "beam_width"),
    ({"beam_width": "2"}, "beam_width"), ({"max_tokens": 0}, "max_tokens"), ({"temperature": -0.5}, "temperature"),
    ({"temperature": float("inf")}, "temperature"), ({"temperature": True}, "temperature"),
    ({"length_penalty": float("nan")}, "length_penalty"), ({"ignore_eos": 1}, "ignore_eos"),
])
def test_bad_params_are_refused_naming_the_field(arguments, param):
    with pytest.raises(RequestError) as caught:
        BeamSearchParams(**{"beam_width": 2, "max_tokens": 4, **arguments})
    assert caught.value.param == param and str(caught.value).startswith(f"{param}: ")


def test_numpy_numbers_are_taken_as_the_numbers_they_hold():
    """As SamplingParams takes them: `beam_width=np.int64(2)` was refused as no integer."""
    import numpy as np

    params = BeamSearchParams(beam_width=np.int64(2), max_tokens=np.int32(4), temperature=np.float64(0),
                              length_penalty=np.float32(0.5))
    assert (params.beam_width, params.max_tokens, params.length_penalty) == (2, 4, 0.5)
    assert type(params.beam_width) is int and type(params.length_penalty) is float


def test_bad_arguments_of_beam_search_are_refused(llm):
    with pytest.raises(RequestError, match="^params must be a BeamSearchParams") as caught:
        llm.beam_search(["Hi"], SamplingParams(n=2))
    assert caught.value.param == "params"
    params = BeamSearchParams(beam_width=2, max_tokens=2)
    params.beam_width = 40  # set after construction: checked again when the search starts
    with pytest.raises(RequestError, match="^beam_width: "):
        llm.beam_search(["Hi"], params)
    with pytest.raises(UnsupportedArgumentError, match="LoRA"):
        llm.beam_search(["Hi"], BeamSearchParams(beam_width=2, max_tokens=2), lora_request=object())
    assert not llm.engine.has_unfinished_requests


def test_beam_search_takes_vllms_arguments_in_vllms_positional_order(llm):
    from tqdm import tqdm

    made = []

    def bar(*args, **kwargs):
        made.append(kwargs)
        return tqdm(*args, disable=True, **kwargs)

    params = BeamSearchParams(beam_width=2, max_tokens=2)
    # vLLM's order: prompts, params, lora_request, use_tqdm, concurrency_limit
    by_position = llm.beam_search(["Hi"], params, None, bar, None)[0]
    assert made and made[0]["total"] == 1
    assert by_position == llm.beam_search(["Hi"], params)[0]
    with pytest.raises(UnsupportedArgumentError, match="^lora_request: .*LoRA") as caught:
        llm.beam_search(["Hi"], params, object())
    assert caught.value.param == "lora_request"
    with pytest.raises(UnsupportedArgumentError, match="^concurrency_limit: "):
        llm.beam_search(["Hi"], params, None, False, 4)
    assert not llm.engine.has_unfinished_requests


def test_a_prompt_with_an_image_keeps_it_in_every_beam(make_tiny):
    from PIL import Image

    llm = LLM(str(make_tiny("canonical", vision=True, seed=17)), progress=False)
    prompt = {"prompt": "<|begin_of_text|>Describe <|patch|> briefly.",
              "multi_modal_data": {"image": Image.new("RGB", (56, 56), "orange")}}
    beam = llm.beam_search(prompt, BeamSearchParams(beam_width=1, max_tokens=4, ignore_eos=True))[0].sequences[0]
    greedy = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=0))[0]
    assert beam.tokens == greedy.prompt_token_ids + greedy.token_ids
    assert beam.cum_logprob == pytest.approx(greedy.outputs[0].cumulative_logprob, abs=1e-5)


def test_a_beam_that_generated_a_placeholder_id_goes_on_as_greedy_decoding_does(llm, monkeypatch):
    """A placeholder id the model generates is embedded as decoding embeds it; only the prompt's own are refused (a
    random tiny model ranks them high: here the image placeholder is made the id greedy decoding picks first)."""
    prompt = _prompts()[1]
    greedy = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=0))[0]
    config = copy.copy(llm.engine.model_config)  # a text-only config refuses an image_token_id at construction
    object.__setattr__(config, "image_token_id", greedy.token_ids[0])
    monkeypatch.setattr(llm.engine, "model_config", config)
    monkeypatch.setattr(llm.engine, "media_token_ids",  # the ids the engine's placeholder checks read
                        dataclasses.replace(llm.engine.media_token_ids, image=greedy.token_ids[0]))
    beam = llm.beam_search([prompt], BeamSearchParams(beam_width=1, max_tokens=4, ignore_eos=True))[0].sequences[0]
    assert beam.tokens == prompt + greedy.token_ids
    with pytest.raises(RequestError, match="image placeholder"):
        llm.beam_search([prompt + greedy.token_ids[:1]], BeamSearchParams(beam_width=1, max_tokens=2))


def test_a_beams_refusal_names_its_prompt_not_the_beams_place(llm, monkeypatch):
    """Each step runs the live beams of every search as one flat list: an error of the second prompt's beam at the
    second step (the first prompt's two beams before it) was named prompts[2] or prompts[3], for two prompts."""
    first, second = _prompts()[0], _prompts()[1]
    add_request = llm.engine.add_request

    def refusing(request_id, ids, *args, **kwargs):
        if ids[:len(second)] == second and len(ids) > len(second):  # a beam of the second prompt, past its start
            raise RequestError("the prompt is refused for the test; shorten the prompt", param="prompt")
        return add_request(request_id, ids, *args, **kwargs)

    monkeypatch.setattr(llm.engine, "add_request", refusing)
    with pytest.raises(RequestError, match=r"^prompts\[1\]: the prompt is refused") as caught:
        llm.beam_search([first, second], BeamSearchParams(beam_width=2, max_tokens=3, ignore_eos=True))
    assert caught.value.param == "prompts[1]"
