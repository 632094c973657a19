"""Differential test of the scheduler and the KV cache: a seeded random mix of requests run under stress gives what
each gives alone.

Alone: one request at a time, prefix caching off, a pool that never runs short. Under stress: prefix caching on, a
pool that holds little more than one sequence at max_model_len, admission without room kept for growth (preemption
and recompute), a token budget of 13 (chunked prefill that splits blocks, windows and images), prompts sharing
prefixes whose lengths fall at and around the block size and the sliding window, the same image bytes and different
images behind the same placeholder tokens, cache salts, n > 1, greedy and seeded sampling, prompt logprobs,
max_tokens 0, and requests added and aborted at random steps. Greedy and seeded outputs and their logprobs must be
the same; an aborted request's output must be a prefix of its own; afterwards every KV block is free and the engine
still serves.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import torch
from oracle import reference_logits, reference_model
from PIL import Image

from glimmer import SamplingParams
from glimmer.engine.llm_engine import EngineConfig, LLMEngine
from glimmer.engine.outputs import StepDelta
from glimmer.engine.sampler import TokenLogprobs
from glimmer.engine.sampling_params import StructuredOutputsParams
from glimmer.engine.sequence import MultimodalItem
from glimmer.tiny import TinySpec

WINDOW = 8
MAX_MODEL_LEN = 128
LOGPROB_TOLERANCE = 1e-4  # float32 prefill after a cache hit sums attention in other tiles than a whole prefill

Request = tuple[str, list[int], list[MultimodalItem], SamplingParams]


@pytest.fixture(scope="module")
def checkpoint(make_tiny):
    return make_tiny("canonical", vision=True, seed=23, spec=TinySpec(sliding_window=WINDOW))


def _image(seed: int, height: int, width: int) -> Image.Image:
    return Image.fromarray((np.random.RandomState(seed).rand(height, width, 3) * 255).astype("uint8"))


def _params(rng: random.Random) -> SamplingParams:
    greedy = rng.random() < 0.6
    return SamplingParams(
        temperature=0 if greedy else 1.0, seed=None if greedy else rng.randrange(1000), top_k=rng.choice([0, 5]),
        max_tokens=rng.choice([0, 1, 10]) if rng.random() < 0.2 else rng.randrange(2, 9), ignore_eos=True,
        n=rng.choice([1, 1, 2]), logprobs=2, prompt_logprobs=1 if rng.random() < 0.2 else None,
        cache_salt=rng.choice([None] * 6 + ["a", "b"]))


def _requests(engine: LLMEngine, rng: random.Random, block_size: int, count: int) -> list[Request]:
    """`count` text prompts sharing prefixes, and image prompts in pairs whose first image differs (its placeholder
    tokens do not)."""
    shared = [rng.randrange(20, 400) for _ in range(48)]
    cuts = sorted({1, block_size - 1, block_size, block_size + 1, WINDOW - 1, WINDOW, WINDOW + 1, 2 * block_size,
                   2 * WINDOW, 2 * WINDOW + 1, 33, 40})
    requests = []
    while len(requests) < count:
        i = len(requests)
        if rng.random() < 0.3:
            seeds = [rng.choice([1, 2]) for _ in range(rng.choice([1, 1, 2]))]
            text = (engine.tokenizer.bos_token + "Look at " + " and ".join(["<|patch|>"] * len(seeds)) + " then"
                    + "y" * rng.choice([2, 20]))
            params = _params(rng)
            for pair, first in enumerate((seeds[0], 3 - seeds[0])):
                ids, media = engine.prepare_prompt(text, [_image(seed, 56, 56) for seed in [first, *seeds[1:]]])
                requests.append((f"r{i}-{pair}", ids, media, params))
                # the twin can find the first's blocks: same salt, and it does not score its prompt
                params = dataclasses.replace(_params(rng), cache_salt=params.cache_salt, prompt_logprobs=None)
        else:
            ids = shared[: rng.choice(cuts)] + [rng.randrange(20, 400) for _ in range(rng.randrange(1, 10))]
            requests.append((f"r{i}", ids, [], _params(rng)))
    return requests


class _Outputs:
    """Per (request id, completion index): tokens, logprobs, finish reason, prompt logprobs."""

    def __init__(self):
        self.tokens: dict[tuple[str, int], list[int]] = {}
        self.logprobs: dict[tuple[str, int], list[TokenLogprobs]] = {}
        self.finish: dict[tuple[str, int], str] = {}
        self.prompt_logprobs: dict[tuple[str, int], list[TokenLogprobs | None]] = {}

    def add(self, deltas: list[StepDelta]) -> None:
        for delta in deltas:
            key = (delta.request_id, delta.index)
            self.tokens.setdefault(key, []).extend(delta.token_ids)
            self.logprobs.setdefault(key, []).extend(delta.logprobs)
            if delta.prompt_logprobs is not None:
                self.prompt_logprobs[key] = delta.prompt_logprobs
            if delta.finish_reason is not None:
                self.finish[key] = delta.finish_reason


def _same_logprobs(expected: list[TokenLogprobs | None], got: list[TokenLogprobs | None]) -> bool:
    return len(expected) == len(got) and all(
        (a is None and b is None) or (a is not None and b is not None and a.token_id == b.token_id
                                      and list(a.top) == list(b.top) and abs(a.logprob - b.logprob) < LOGPROB_TOLERANCE)
        for a, b in zip(expected, got, strict=True))


def _alone(engine: LLMEngine, requests: list[Request]) -> _Outputs:
    outputs = _Outputs()
    for request_id, ids, media, params in requests:
        engine.add_request(request_id, ids, params, media)
        while engine.has_unfinished_requests:
            outputs.add(engine.step())
    return outputs


@pytest.mark.parametrize(("seed", "block_size", "lookahead", "kv_cache_memory"), [
    # the pages hold little more than one sequence of max_model_len (128): block4 41 pages of the 41 it needs,
    # block8 23 of 22, block16 14 of 14
    (4, 4, False, 84_000),  # a window of two blocks (seed 1's mix fits the shared pages without preemption)
    (2, 8, True, 95_000),  # a window of one block; decode steps launched ahead of the host
    (3, 16, False, 120_000),  # a window inside a block
], ids=["block4", "block8-lookahead", "block16"])
def test_a_random_mix_under_stress_matches_each_request_alone(checkpoint, same_cpu_kernels, greedy_admission, seed,
                                                              block_size, lookahead, kv_cache_memory):
    rng = random.Random(seed)
    common = dict(progress=False, block_size=block_size, max_model_len=MAX_MODEL_LEN)
    reference = LLMEngine(EngineConfig(str(checkpoint), enable_prefix_caching=False, **common))
    requests = _requests(reference, rng, block_size, count=10)
    expected = _alone(reference, requests)

    engine = LLMEngine(EngineConfig(str(checkpoint), kv_cache_memory=kv_cache_memory, max_num_seqs=6,
                                    max_num_batched_tokens=13, async_scheduling=lookahead, **common))
    got = _Outputs()
    queue, aborted = list(requests), set()
    for _ in range(2000):
        if not queue and not engine.has_unfinished_requests:
            break
        if queue and (rng.random() < 0.4 or not engine.has_unfinished_requests):
            request_id, ids, media, params = queue.pop(0)
            engine.add_request(request_id, ids, params, media)
        if rng.random() < 0.05:
            request_id = rng.choice([r[0] for r in requests])  # waiting, running, preempted, finished or not yet added
            got.add(engine.abort(request_id))
            aborted.add(request_id)
        got.add(engine.step())
    assert not queue and not engine.has_unfinished_requests, "the engine stopped making progress"
    assert engine.scheduler.num_preemptions > 0 and engine.kv.prefix_cache_hit_rate() > 0  # it was under stress

    for key, tokens in expected.tokens.items():
        if key[0] in aborted and got.finish.get(key) in (None, "abort"):
            assert got.tokens.get(key, []) == tokens[: len(got.tokens.get(key, []))], key
            continue
        assert got.tokens[key] == tokens, key
        assert got.finish[key] == expected.finish[key], key
        assert _same_logprobs(expected.logprobs[key], got.logprobs[key]), key
        if key in expected.prompt_logprobs:
            assert _same_logprobs(expected.prompt_logprobs[key], got.prompt_logprobs[key]), key
    assert all(used == 0 for used, _ in engine.kv.usage().values())

    again = [(f"again-{request_id}", ids, media, params) for request_id, ids, media, params in requests[:2]]
    assert _alone(engine, again).tokens == _alone(reference, again).tokens
    assert all(used == 0 for used, _ in engine.kv.usage().values())


def _seeded_with_every_processor(rng: random.Random, shared: list[int]) -> list[Request]:
    """Seeded requests, each through other logits processors, on prompts that share a prefix (cache hits)."""
    kinds = [dict(top_p=0.8), dict(min_p=0.05, top_k=20), dict(top_p=0.9, logprobs=3, n=2),
             dict(presence_penalty=0.8, frequency_penalty=0.5, repetition_penalty=1.3, top_p=0.95),
             dict(logit_bias={30: 3.0, 31: 2.0, 77: -5.0}, min_p=0.1), dict(allowed_token_ids=list(range(30, 90))),
             dict(bad_words=["the", "hello"], min_tokens=4, stop_token_ids=[40, 41, 42], ignore_eos=False),
             dict(structured_outputs=StructuredOutputsParams(regex="[a-z]{2,6}[0-9]+"))]
    return [(f"seeded-{i}", shared[: rng.choice([5, 17, 33])] + [rng.randrange(20, 400) for _ in range(3)], [],
             SamplingParams(**{"temperature": 0.9, "max_tokens": 8, "ignore_eos": True, "seed": 100 + i, **kind}))
            for i, kind in enumerate(kinds)]


@pytest.mark.parametrize("lookahead", [False, True])
def test_seeded_requests_through_every_logits_processor_keep_their_tokens_under_stress(checkpoint, same_cpu_kernels,
                                                                                     lookahead):
    """Top-p, min-p, penalties, logit bias, allowed ids, bad words, min_tokens, a grammar, logprobs and n = 2, each
    seeded, beside greedy, unseeded and other seeded requests, one of them aborted, with preemption, chunked
    prefill and prefix-cache hits: the tokens each gives alone. (Float32 only: in bfloat16 a batch's products and a
    prefill after a cache hit round otherwise than a lone whole prefill's, and a random model's draws then differ.)"""
    rng = random.Random(7)
    common = dict(progress=False, block_size=8, max_model_len=MAX_MODEL_LEN)
    shared = [rng.randrange(20, 400) for _ in range(40)]
    seeded = _seeded_with_every_processor(rng, shared)
    expected = _alone(LLMEngine(EngineConfig(str(checkpoint), enable_prefix_caching=False, **common)), seeded)

    neighbours = [(f"beside-{i}", shared[: rng.randrange(1, 40)], [], SamplingParams(
        temperature=[0, 1.2, 0.7][i % 3], top_p=0.7, seed=[None, None, 5][i % 3], presence_penalty=1.0, max_tokens=12,
        ignore_eos=True, n=1 + i % 2)) for i in range(5)]
    engine = LLMEngine(EngineConfig(str(checkpoint), kv_cache_memory=120_000, max_num_seqs=6,
                                    max_num_batched_tokens=13, async_scheduling=lookahead, **common))
    got, queue = _Outputs(), neighbours[:3] + seeded + neighbours[3:]
    while queue or engine.has_unfinished_requests:
        if queue:
            request_id, ids, media, params = queue.pop(0)
            engine.add_request(request_id, ids, params, media)
        if got.tokens.get(("beside-1", 0)) and ("beside-1", 0) not in got.finish:  # once it has generated
            got.add(engine.abort("beside-1"))
        got.add(engine.step())
    assert engine.scheduler.num_preemptions > 0 and engine.kv.prefix_cache_hit_rate() > 0  # it was under stress
    assert got.finish["beside-1", 0] == "abort"
    assert {key: got.tokens[key] for key in expected.tokens} == expected.tokens


@torch.no_grad()
def _reference_greedy(reference, ids: list[int], max_tokens: int, token_count: int) -> tuple[list[int], list[float]]:
    """Greedy tokens and their logprobs from the reference's forward without a cache, one token at a time
    (architecture.md §12.2: its cached `generate` strays past the window)."""
    ids, tokens, logprobs = list(ids), [], []
    for _ in range(max_tokens):
        row = torch.log_softmax(reference_logits(reference, ids)[-1], dim=-1)
        token = int(row[:token_count].argmax())
        tokens.append(token)
        logprobs.append(row[token].item())
        ids.append(token)
    return tokens, logprobs


@pytest.mark.parametrize(("layers", "window", "block_size", "budget", "lookahead", "kv_cache_memory"), [
    # every prefill token a step of its own, laid out as a decode token is; a window of five one-position blocks (a
    # budget of one runs one sequence at a time: no pool is small enough to preempt)
    (4, 5, 1, 1, False, None),
    # a full and a sliding layer: both groups' blocks one page; a window of three blocks and a half
    (2, 7, 2, 3, True, 14_848),
    # a budget of 17 tokens ends chunks across blocks and windows; a window straddling two blocks
    (3, 5, 4, 17, False, 21_504),
], ids=["budget1-block1", "budget3-block2-one-page-groups-lookahead", "budget17-block4"])
def test_small_odd_token_budgets_and_small_blocks_under_stress_match_the_reference(
        make_tiny, same_cpu_kernels, greedy_admission, layers, window, block_size, budget, lookahead, kv_cache_memory):
    """Prefix-cache hits ending at, before and after a block boundary and the window's, the same prompt twice at once,
    a cache salt, n = 2 and prompt logprobs, run under prefix caching, token budgets of 1, 3 and 17, blocks of 1 to 4
    positions and a pool that holds little more than one sequence of max_model_len (preemption; the pages: 29 needed
    and given, 18 and 21): each output's tokens and logprobs are the reference's forward without a cache."""
    checkpoint = make_tiny(seed=29, spec=TinySpec(num_hidden_layers=layers, sliding_window=window))
    reference = reference_model(checkpoint)
    engine = LLMEngine(EngineConfig(str(checkpoint), progress=False, block_size=block_size, max_model_len=48,
                                    kv_cache_memory=kv_cache_memory, max_num_batched_tokens=budget,
                                    max_num_seqs=min(4, budget),  # a budget below it is refused, as vLLM refuses it
                                    async_scheduling=lookahead))
    rng = random.Random(layers)
    shared = [rng.randrange(20, 400) for _ in range(30)]
    cuts = [block_size - 1, block_size, block_size + 1, window - 1, window, window + 1, 2 * window + 1, 24, 24]
    requests = []
    for i, cut in enumerate(cuts):
        ids = shared[: max(cut, 1)] + [rng.randrange(20, 400) for _ in range(i % 3)]
        params = SamplingParams(temperature=0, max_tokens=11 + i % 2, ignore_eos=True, logprobs=0, n=1 + (i == 5),
                                prompt_logprobs=0 if i == 4 else None, cache_salt="salt" if i == 6 else None)
        requests.append((f"r{i}", ids, params))

    got = _Outputs()
    queue = list(requests)
    while queue or engine.has_unfinished_requests:
        if queue:  # one arrives a step: later ones find the blocks the earlier computed
            engine.add_request(*queue.pop(0))
        got.add(engine.step())
    assert engine.kv.prefix_cache_hit_rate() > 0
    assert engine.scheduler.num_preemptions > 0 or kv_cache_memory is None  # the small pools were short
    assert all(used == 0 for used, _ in engine.kv.usage().values())

    for request_id, ids, params in requests:
        tokens, logprobs = _reference_greedy(reference, ids, params.max_tokens, engine.token_count)
        for index in range(params.n):
            key = (request_id, index)
            assert got.tokens[key] == tokens, key
            assert [entry.logprob for entry in got.logprobs[key]] == pytest.approx(logprobs, abs=LOGPROB_TOLERANCE)
        if params.prompt_logprobs is not None:
            rows = torch.log_softmax(reference_logits(reference, ids), dim=-1)
            expected = [rows[p, ids[p + 1]].item() for p in range(len(ids) - 1)]
            scored = got.prompt_logprobs[request_id, 0]
            assert scored[0] is None
            assert [entry.logprob for entry in scored[1:]] == pytest.approx(expected, abs=LOGPROB_TOLERANCE)
