"""Speculative decoding with the DFlash drafter: exact at any batch size (issue 10).

Greedy decoding with speculation must be token-identical to greedy decoding without it, whatever the
batch, arrivals, window crossings, chunked prefill, preemption, prefix-cache hits, images or controllers.
A random tiny drafter rarely agrees with a random tiny target, so most tests also use `ReplayProposer`,
which proposes the target's own continuation (recorded without speculation) with mistakes where a schedule
puts them: full, partial and zero acceptance all happen. Sampling is checked statistically in
test_rejection_sampler.py (and end to end here).
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import re
import types
from pathlib import Path

import pytest
import torch
from oracle import reference_drafter, reference_model
from spec_support import DRAFTER, TARGET, K, record_drafts

from glimmer import LLM, SamplingParams
from glimmer.engine import llm_engine, spec_decode
from glimmer.engine.grammar import GrammarController, GrammarMasks
from glimmer.engine.kv_cache_manager import DRAFT
from glimmer.engine.llm_engine import EngineConfig, LLMEngine, StepError
from glimmer.engine.proposers import Draft, ReplayProposer, cycling_acceptance, forced_acceptance
from glimmer.engine.sampler import SamplingRow, constrain, sampling_probs
from glimmer.engine.sampling_params import StructuredOutputsParams
from glimmer.engine.sequence import Sequence
from glimmer.engine.spec_decode import SpeculativeConfig
from glimmer.errors import CheckpointError, ConfigError
from glimmer.model.context import ForwardContext
from glimmer.tiny import TinyDrafterSpec, TinySpec, write_tiny_drafter

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)

# nearly every test compares the tokens of two engines (with and without the drafter, or two runs) exactly: each
# engine of the module takes the same CPU kernels, not the ones its load-time timing chose
pytestmark = pytest.mark.usefixtures("same_cpu_kernels")


@pytest.fixture(scope="module")
def target(make_tiny):
    return make_tiny(spec=TARGET, seed=21)


@pytest.fixture(scope="module")
def drafter(target, tmp_path_factory):
    return write_tiny_drafter(tmp_path_factory.mktemp("drafter"), target, seed=5, spec=DRAFTER)


def speculative(drafter, **policy) -> dict:
    return {"method": "dflash", "model": str(drafter), "draft_policy": "always", **policy}


@pytest.fixture(scope="module")
def plain(target, same_cpu_kernels_in_module):
    return LLM(str(target), progress=False, enable_prefix_caching=False)


def _prompts(count: int, seed: int = 9) -> list[list[int]]:
    """Mixed lengths, most of them longer than the target's (16) and the drafter's (12) windows."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 480, (int(n),), generator=generator).tolist()
            for n in torch.randint(1, 70, (count,), generator=generator)]


def _continuations(plain: LLM, prompts: list[list[int]], params: SamplingParams) -> dict[tuple[int, ...], list[int]]:
    return {tuple(p): o.token_ids for p, o in zip(prompts, plain.generate(prompts, params), strict=True)}


def _replay(engine: LLMEngine, known: dict[tuple[int, ...], list[int]], correct, keep_drafter: bool = True,
            mistake=None) -> None:
    spec = engine.speculator
    spec.proposer = ReplayProposer(lambda seq: known.get(tuple(seq.prompt_token_ids)), correct,
                                   engine.model_config.text.vocab_size, K,
                                   inner=spec.proposer if keep_drafter else None, mistake=mistake)


def _drive(engine: LLMEngine, arrivals: dict[int, list[tuple[str, list[int]]]], params=GREEDY):
    tokens: dict[str, list[int]] = {}
    step = 0
    while arrivals or engine.has_unfinished_requests:
        for request_id, prompt in arrivals.pop(step, []):
            engine.add_request(request_id, prompt, params)
            tokens[request_id] = []
        for delta in engine.step():
            tokens[delta.request_id].extend(delta.token_ids)
        step += 1
    return tokens


def _generate(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    """The tokens of each prompt, run together through `engine`."""
    tokens = _drive(engine, {0: [(f"g{i}", p) for i, p in enumerate(prompts)]}, params)
    return [tokens[f"g{i}"] for i in range(len(prompts))]


# --- against transformers ------------------------------------------------------------------------------


@pytest.mark.parametrize("schedule", [lambda: cycling_acceptance(K, 0, 2), lambda: forced_acceptance(0.5)])
def test_a_replay_schedule_starts_afresh_for_each_new_sequence_whose_id_a_finished_one_had(schedule):
    """The schedules are kept per sequence object: CPython hands a finished sequence's id to the next one made,
    and a schedule keyed by id() gave that one the old sequence's place in the pattern, so seeded sampled runs
    with speculation differed batched and alone by chance (a CI failure of test_feature_differential.py)."""

    class Seq:  # the schedules need only a weakly referable object
        pass

    correct = schedule()
    first = [correct(Seq(), K) for _ in range(50)]  # each object dies at once; its id is reused
    assert first == [first[0]] * 50
    seq = Seq()
    assert [correct(seq, K) for _ in range(4)] == ([K, 0, 2, K] if first[0] == K else [0, 1, 0, 1])


def test_drafts_and_tokens_match_transformers_dflash_generate_at_batch_1(make_tiny, tmp_path):
    """generate(assistant_model=..., speculation_type="dflash"): the same candidates at every step, the same
    tokens (the prompt and output stay within the target's window, where transformers' cache is exact, §12.2;
    they cross the drafter's window of 12)."""
    from transformers.generation.candidate_generator import DFlashTokenCandidateGenerator

    checkpoint = make_tiny(seed=11)
    drafter_dir = write_tiny_drafter(tmp_path / "d", checkpoint, seed=3, spec=DRAFTER)
    prompt = torch.randint(0, 480, (8,), generator=torch.Generator().manual_seed(4)).tolist()
    theirs: list[list[int]] = []
    original = DFlashTokenCandidateGenerator.get_candidates

    def spy(self, input_ids, *args, **kwargs):
        out = original(self, input_ids, *args, **kwargs)
        if out[0].shape[1] > input_ids.shape[1]:
            theirs.append(out[0][0, input_ids.shape[1] :].tolist())
        return out

    DFlashTokenCandidateGenerator.get_candidates = spy
    try:
        with torch.no_grad():
            out = reference_model(checkpoint).generate(
                torch.tensor([prompt]), assistant_model=reference_drafter(drafter_dir), speculation_type="dflash",
                do_sample=False, max_new_tokens=22, eos_token_id=None, pad_token_id=0)
    finally:
        DFlashTokenCandidateGenerator.get_candidates = original
    llm = LLM(str(checkpoint), progress=False, speculative_config=speculative(drafter_dir))
    ours = record_drafts(llm.engine)
    output = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=22, ignore_eos=True))[0]
    assert output.token_ids == out[0, len(prompt) :].tolist()
    # near max_tokens we propose only what can still be emitted; transformers always drafts a full block
    assert len(ours) == len(theirs) and all(t[: len(o)] == o for o, t in zip(ours, theirs, strict=True))
    assert sum(map(len, ours)) > 3 * len(ours)


# --- greedy exactness -----------------------------------------------------------------------------------


def test_batch_16_staggered_arrivals_with_the_drafter_match_greedy_without(target, drafter, plain):
    prompts = _prompts(16)
    expected = [o.token_ids for o in plain.generate(prompts, GREEDY)]
    engine = LLMEngine(EngineConfig(str(target), progress=False, speculative_config=speculative(drafter)))
    arrivals: dict[int, list] = {}
    for i, prompt in enumerate(prompts):
        arrivals.setdefault(i * 3, []).append((f"r{i}", prompt))
    tokens = _drive(engine, arrivals)
    assert [tokens[f"r{i}"] for i in range(16)] == expected
    assert engine.speculator.stats.num_draft_tokens > 0


def test_full_partial_and_zero_acceptance_match_greedy_without(target, drafter, plain):
    prompts = _prompts(16, seed=2)
    known = _continuations(plain, prompts, GREEDY)
    engine = LLMEngine(EngineConfig(str(target), progress=False, speculative_config=speculative(drafter)))
    _replay(engine, known, cycling_acceptance(K, 2, 0))
    arrivals: dict[int, list] = {}
    for i, prompt in enumerate(prompts):
        arrivals.setdefault(i * 2, []).append((f"r{i}", prompt))
    tokens = _drive(engine, arrivals)
    assert [tokens[f"r{i}"] for i in range(16)] == [known[tuple(p)] for p in prompts]
    lengths = engine.speculator.stats.acceptance_lengths
    assert lengths[1] and lengths[3] and lengths[K + 1]  # zero, partial (2 of K) and full acceptance
    assert engine.speculator.stats.mean_acceptance_length > 2


def test_verification_steps_replayed_from_static_graph_buffers_match_greedy_without(target, drafter, plain):
    """The CUDA-graph path lays out q = 1 + k tokens per sequence in static buffers with padding rows; here it
    runs without capturing (no CUDA on the test machine), batch buckets and padding included."""
    from glimmer.engine.cuda_graphs import DecodeGraphs

    prompts = _prompts(5, seed=13)
    known = _continuations(plain, prompts, GREEDY)
    engine = LLMEngine(EngineConfig(str(target), progress=False, speculative_config=speculative(drafter)))
    runner = engine.runner
    runner.graphs = DecodeGraphs(engine.loaded.model, runner.kv_caches, engine.kv, runner.null_blocks, 8,
                                 engine.kv.blocks_needed_for(engine.max_model_len), engine.device,
                                 capture_layers=runner.capture_layers, max_query_len=1 + K, eager_replay=True)
    _replay(engine, known, cycling_acceptance(K, 2, 0))
    tokens = _drive(engine, {0: [(f"r{i}", p) for i, p in enumerate(prompts[:3])],
                             2: [(f"r{i}", p) for i, p in enumerate(prompts[3:], start=3)]})
    assert [tokens[f"r{i}"] for i in range(5)] == [known[tuple(p)] for p in prompts]
    query_lens = {key[1] for key in runner.graphs._graphs}
    assert 1 + K in query_lens and engine.speculator.stats.acceptance_lengths[K + 1] > 0

    # and one token per sequence: plain decode steps, with the drafter's layers captured
    engine.speculator.policy.max_draft_tokens = 0
    engine.speculator.policy.choose = lambda batch: 0
    tokens = _drive(engine, {0: [(f"s{i}", p) for i, p in enumerate(prompts[:3])]})
    assert [tokens[f"s{i}"] for i in range(3)] == [known[tuple(p)] for p in prompts[:3]]
    assert 1 in {key[1] for key in runner.graphs._graphs}


def test_drafter_steps_replayed_from_static_graph_buffers_propose_what_eager_steps_do(target, drafter, plain):
    from glimmer.engine.draft_graphs import DraftGraphs

    prompts = _prompts(3, seed=14)
    recorded = []
    for graphs in (False, True):
        engine = LLMEngine(EngineConfig(str(target), progress=False, speculative_config=speculative(drafter)))
        proposer = engine.speculator.proposer
        if graphs:
            proposer.graphs = DraftGraphs(proposer.drafter, engine.loaded.model.embed_tokens.raw, proposer.kv_caches,
                                          engine.kv.pools[DRAFT].num_blocks, 8, engine.device, eager_replay=True,
                                          widest=proposer.widest_table())
            proposer.graphs.capture_graphs()  # as at start-up on CUDA: every batch bucket and width, over padding alone
            captured = set(proposer.graphs._graphs)
        # speculation on and off: the off steps leave the drafter's context pending, written when a step proposes
        # again or (after 15 off steps) by a context-only forward
        steps = itertools.count()
        engine.speculator.policy.choose = lambda batch, steps=steps: K if next(steps) % 20 in (0, 1, 5) else 0
        drafts = record_drafts(engine)
        tokens = _drive(engine, {0: [(f"r{i}", p) for i, p in enumerate(prompts[:2])], 3: [("r2", prompts[2])]})
        recorded.append((drafts, tokens))
    assert recorded[0] == recorded[1]
    assert sum(map(len, recorded[0][0])) > 20
    assert {key[1] > 0 for key in proposer.graphs._graphs} == {True, False}  # drafting and context-only graphs
    assert set(proposer.graphs._graphs) == captured  # no step met a shape start-up had not captured
    # the drafter's window (13 positions) spans at most 2 cache blocks of 16: the one width; 0 is context-only
    assert engine.kv.windows[DRAFT] == 13 and engine.kv.block_size == 16 and proposer.graphs.width_buckets == (2,)
    assert captured == {(batch, width) for batch in (1, 2, 4, 8) for width in (0, 2)}


def test_preemption_and_chunked_prefill_under_a_tiny_pool_match_greedy_without(target, drafter, plain,
                                                                             greedy_admission):
    prompts = _prompts(6)
    longer = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    known = _continuations(plain, prompts, longer)
    engine = LLMEngine(EngineConfig(str(target), progress=False, kv_cache_memory=250_000, max_num_seqs=3,
                                    max_num_batched_tokens=32, max_model_len=160,
                                    speculative_config=speculative(drafter)))
    _replay(engine, known, cycling_acceptance(K, 1, 3))
    tokens = _drive(engine, {0: [(f"r{i}", p) for i, p in enumerate(prompts)]}, longer)
    assert engine.scheduler.num_preemptions > 0
    assert [tokens[f"r{i}"] for i in range(len(prompts))] == [known[tuple(p)] for p in prompts]
    assert all(used == 0 for used, _ in engine.kv.usage().values())  # the drafter's blocks too


def test_a_prefix_cache_hit_restores_the_drafter_context(target, drafter):
    """The drafter's keys/values of cached blocks come back with them: the drafts after a hit are those of a
    run without the cache."""
    shared = list(range(20, 100))  # 5 full blocks
    runs = []
    for caching in (True, False):
        llm = LLM(str(target), progress=False, enable_prefix_caching=caching, speculative_config=speculative(drafter))
        first = llm.generate([shared + [7, 8]], GREEDY)[0]
        recorded = record_drafts(llm.engine)
        second = llm.generate([shared + [9]], GREEDY)[0]
        runs.append((first.token_ids, second.token_ids, second.num_cached_tokens, recorded))
    (first, second, cached, drafts), (first_plain, second_plain, _, drafts_plain) = runs
    assert cached == 80
    assert (first, second) == (first_plain, second_plain)
    assert drafts == drafts_plain


def test_a_windowed_drafter_that_let_a_prefix_go_still_finds_the_models_hit(target, drafter):
    """A windowed drafter keeps only its window of each running sequence: with one sequence at a time, the drafter
    blocks of a shared prefix are overwritten as the first request moves on, while the model's pages keep it. A hit
    asked the drafter for the window before the hit, so the second request found none and recomputed all 96 shared
    tokens. The drafter's context of a position is its target hidden states' projection, which the target's forward
    over the rest of the prompt writes again: the hit backs off to leave the drafter its window, and the tokens and
    drafts are those of a run without the cache."""
    shared = list(range(20, 116))  # 6 full blocks
    tail = list(range(200, 290))  # the first request moves well past the drafter's window
    runs = []
    for caching in (True, False):
        llm = LLM(str(target), progress=False, enable_prefix_caching=caching, max_num_seqs=1,
                  speculative_config=speculative(drafter))
        first = llm.generate([shared + tail], GREEDY)[0]
        recorded = record_drafts(llm.engine)
        second = llm.generate([shared + [7, 8, 9]], GREEDY)[0]
        runs.append((first.token_ids, second.token_ids, second.num_cached_tokens, recorded))
        assert all(used == 0 for used, _ in llm.engine.kv.usage().values())
    (first, second, cached, drafts), (first_plain, second_plain, _, drafts_plain) = runs
    window, block, last = DRAFTER.sliding_window, llm.engine.kv.block_size, len(shared) + 3 - 1
    assert cached == (last - window + 1) // block * block > 0  # up to the drafter's window before the last token
    assert (first, second) == (first_plain, second_plain)
    assert drafts == drafts_plain


def test_an_image_prompt_matches_greedy_without(make_tiny, tmp_path):
    from PIL import Image

    checkpoint = make_tiny(vision=True, seed=17)
    drafter_dir = write_tiny_drafter(tmp_path / "d", checkpoint, seed=2, spec=DRAFTER)
    pixels = torch.Generator().manual_seed(3)
    image = Image.fromarray(torch.randint(0, 256, (90, 120, 3), generator=pixels, dtype=torch.uint8).numpy())
    prompt = {"prompt": "<|begin_of_text|>Look: <|patch|> What is it?", "multi_modal_data": {"image": image}}
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    expected = LLM(str(checkpoint), progress=False).generate(prompt, params)[0].token_ids
    llm = LLM(str(checkpoint), progress=False, speculative_config=speculative(drafter_dir))
    ids = llm.engine.prepare_prompt(prompt["prompt"], [image])[0]
    _replay(llm.engine, {tuple(ids): expected}, cycling_acceptance(3, K, 0))
    output = llm.generate(prompt, params)[0]
    assert output.token_ids == expected
    assert llm.engine.speculator.stats.num_accepted_tokens > 0


# --- stops, limits, logprobs and controllers inside an accepted run -------------------------------------


def test_stops_max_tokens_and_logprobs_inside_an_accepted_run(target, drafter, plain):
    prompt = _prompts(1, seed=4)[0]
    free = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    known = plain.generate([prompt], free)[0]
    tokenizer = plain.get_tokenizer()
    stop_token = known.token_ids[13]
    stop_text = tokenizer.decode(known.token_ids[20:22]).strip()
    cases = [
        SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[stop_token], logprobs=2),
        SamplingParams(temperature=0, max_tokens=40, stop=[stop_text] if stop_text else [], ignore_eos=True,
                       logprobs=0),
        SamplingParams(temperature=0, max_tokens=11, ignore_eos=True, logprobs=3),
    ]
    llm = LLM(str(target), progress=False, speculative_config=speculative(drafter))
    _replay(llm.engine, {tuple(prompt): known.token_ids}, lambda seq, k: k)  # every proposal right
    for params in cases:
        expected = plain.generate([prompt], params)[0]
        got = llm.generate([prompt], params)[0]
        assert (got.token_ids, got.text, got.finish_reason, got.stop_reason) == (
            expected.token_ids, expected.text, expected.finish_reason, expected.stop_reason)
        assert [(e.token_id, e.top.keys()) for e in got.logprobs] == [(e.token_id, e.top.keys())
                                                                       for e in expected.logprobs]
        assert max(abs(a.logprob - b.logprob) for a, b in zip(got.logprobs, expected.logprobs, strict=True)) < 1e-4
    assert llm.engine.speculator.stats.acceptance_lengths[K + 1] > 0


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_min_tokens_max_tokens_1_and_n_2_with_accepted_runs_match_greedy_without(target, drafter, plain,
                                                                                async_scheduling):
    """A stop id banned below min_tokens inside a run of accepted proposals (and allowed from there on), a request
    of one token (no room to propose), and n = 2 greedy completions: the tokens, text, finish and logprobs of a run
    without speculation."""
    prompt = _prompts(1, seed=4)[0]
    known = plain.generate([prompt], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0].token_ids
    repeated = next(t for i, t in enumerate(known[8:], start=8) if t not in known[:i])  # allowed from min_tokens on
    cases = [
        SamplingParams(temperature=0, max_tokens=40, min_tokens=8, stop_token_ids=[known[3], repeated], logprobs=2),
        SamplingParams(temperature=0, max_tokens=1, logprobs=1, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=30, n=2, ignore_eos=True, logprobs=0),
    ]
    llm = LLM(str(target), progress=False, async_scheduling=async_scheduling,
              speculative_config=speculative(drafter))
    continuation: list[int] = []
    _replay(llm.engine, {tuple(prompt): continuation}, lambda seq, k: k)  # every proposal right
    ends = []
    for params in cases:
        expected = plain.generate([prompt], params)[0].outputs
        ends.append((expected[0].finish_reason, expected[0].stop_reason, len(expected[0].token_ids), len(expected)))
        continuation[:] = expected[0].token_ids
        got = llm.generate([prompt], params)[0].outputs
        assert [(o.token_ids, o.text, o.finish_reason, o.stop_reason) for o in got] == [
            (o.token_ids, o.text, o.finish_reason, o.stop_reason) for o in expected]
        for mine, theirs in zip(got, expected, strict=True):
            assert [(e.token_id, e.top.keys()) for e in mine.logprobs] == [(e.token_id, e.top.keys())
                                                                          for e in theirs.logprobs]
    # the banned id was the free run's 4th token; the stop came from min_tokens on, a run after the ban
    assert ends == [("stop", repeated, 13, 1), ("length", None, 1, 1), ("length", None, 30, 2)]
    assert llm.engine.speculator.stats.acceptance_lengths[K + 1] > 0
    assert all(used == 0 for used, _ in llm.engine.kv.usage().values())


def test_proposals_accepted_past_a_stop_count_as_accepted_as_vllm_counts_them(target, drafter, plain):
    """The accepted-tokens counter measures the drafter (vLLM's scheduler counts before its stop checks): a run of
    right proposals a stop token ends midway counts whole, while the output, and the generation tokens, end at the
    stop."""
    prompt = _prompts(1, seed=4)[0]
    known = plain.generate([prompt], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0].token_ids
    stop = known[13]
    llm = LLM(str(target), progress=False, speculative_config=speculative(drafter))
    _replay(llm.engine, {tuple(prompt): known}, lambda seq, k: k)  # every proposal right
    got = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[stop]))[0]
    assert got.token_ids == known[:known.index(stop) + 1]
    stats = llm.engine.speculator.stats
    # the tokens after the prefill's: each verification's accepted proposals and one more, up to the stop
    assert stats.num_accepted_tokens == stats.num_draft_tokens > len(got.token_ids) - 1 - stats.num_drafts


@pytest.mark.parametrize("pattern", [(K,), (3, 0, K, 1)], ids=["all-accepted", "mixed"])
def test_async_scheduling_with_speculation_matches_synchronous_plain_decoding(target, drafter, plain, pattern):
    """Text made a step late: a stop string found inside an accepted run ends the sequence, its later tokens
    and the verification already running for it are dropped, and every block goes back."""
    prompts = _prompts(6, seed=12)
    free = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    known = _continuations(plain, prompts, free)
    tokenizer = plain.get_tokenizer()
    texts = [tokenizer.decode(known[tuple(p)][18:21]).strip() for p in prompts]
    params = [
        SamplingParams(temperature=0, max_tokens=40, stop=[texts[0]] if texts[0] else [], ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=40, stop=[texts[1]] if texts[1] else [], ignore_eos=True,
                       include_stop_str_in_output=True, logprobs=1),
        SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[known[tuple(prompts[2])][9]]),
        SamplingParams(temperature=0, max_tokens=13, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=0),
        SamplingParams(temperature=0, max_tokens=40, stop=[texts[5], "zz"] if texts[5] else ["zz"], ignore_eos=True),
    ]
    llm = LLM(str(target), progress=False, async_scheduling=True, speculative_config=speculative(drafter))
    _replay(llm.engine, known, cycling_acceptance(*pattern))
    expected = plain.generate(prompts, params)
    got = llm.generate(prompts, params)
    assert [(o.token_ids, o.text, o.finish_reason, o.stop_reason) for r in got for o in r.outputs] == [
        (o.token_ids, o.text, o.finish_reason, o.stop_reason) for r in expected for o in r.outputs]
    assert sum(r.outputs[0].finish_reason == "stop" for r in expected) >= 3  # the stops did cut runs short
    assert llm.engine.speculator.stats.acceptance_lengths[K + 1] > 0
    assert not llm.engine.has_unfinished_requests
    assert all(used == 0 for used, _ in llm.engine.kv.usage().values())


def test_scoring_with_max_tokens_0_and_prompt_logprobs_beside_speculating_requests(target, drafter, plain):
    """A scored prompt (prompt logprobs, nothing generated) in the same steps as requests that verify proposals:
    its logprobs and the others' tokens are those of a run without speculation."""
    prompts = _prompts(3, seed=15)
    scored = SamplingParams(max_tokens=0, prompt_logprobs=2)
    expected_scores = plain.generate([prompts[0]], scored)[0].prompt_logprobs
    known = _continuations(plain, prompts[1:], GREEDY)
    engine = LLMEngine(EngineConfig(str(target), progress=False, speculative_config=speculative(drafter)))
    _replay(engine, known, cycling_acceptance(K, 1))
    engine.add_request("g1", prompts[1], GREEDY)
    engine.step()  # g1 decodes (and verifies proposals) while the scored prompt and g2 arrive
    engine.add_request("s", prompts[0], scored)
    engine.add_request("g2", prompts[2], GREEDY)
    tokens: dict[str, list[int]] = {"g1": [], "s": [], "g2": []}
    scores = None
    while engine.has_unfinished_requests:
        for delta in engine.step():
            tokens[delta.request_id].extend(delta.token_ids)
            if delta.request_id == "s" and delta.prompt_logprobs is not None:
                scores = delta.prompt_logprobs
    assert tokens["s"] == [] and scores is not None
    assert [None if e is None else (e.token_id, e.top.keys()) for e in scores] == [
        None if e is None else (e.token_id, e.top.keys()) for e in expected_scores]
    assert max(abs(a.logprob - b.logprob) for a, b in zip(scores[1:], expected_scores[1:], strict=True)) < 1e-4
    assert tokens["g2"] == known[tuple(prompts[2])]
    assert engine.speculator.stats.num_accepted_tokens > 0


def test_a_kv_budget_that_cannot_hold_the_drafter_context_of_one_sequence_is_refused(target, drafter):
    with pytest.raises(ConfigError, match=r"cannot hold one sequence of max_model_len=2048 tokens \(available/"
                                          r"needed: .*'draft'"):
        LLMEngine(EngineConfig(str(target), progress=False, kv_cache_memory=60_000, max_model_len=2048,
                               speculative_config=speculative(drafter)))


def test_a_kv_budget_that_holds_one_sequence_in_every_group_is_not_refused_with_the_drafter(target, drafter, plain):
    """The drafter's share of the budget (its bytes per token of all groups') gave it 8 blocks where a sequence
    needs 2, and the windows half the rest (5 blocks of 2), leaving the full-attention group 17 of the 32 that
    max_model_len=512 needs: a budget that holds one sequence in every group was refused."""
    engine = LLMEngine(EngineConfig(str(target), progress=False, kv_cache_memory=330_000, max_model_len=512,
                                    speculative_config=speculative(drafter)))
    assert (engine.kv_layout.draft_blocks, engine.kv_layout.num_pages) == (2, 2 * 3 + 32)  # sliding blocks: 3 pages
    prompt = torch.randint(0, 480, (496,), generator=torch.Generator().manual_seed(4)).tolist()
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    assert _generate(engine, [prompt], params) == [plain.generate([prompt], params)[0].token_ids]


LETTERS = SamplingParams(temperature=0, max_tokens=24, structured_outputs=StructuredOutputsParams(regex="[a-z ]{40}"))


def _favourites(engine: LLMEngine, prompt: list[int], output: list[int]) -> list[int]:
    """The target's unconstrained argmax at each position of `output` (after the prompt)."""
    model = engine.loaded.model
    ids = prompt + output
    with torch.no_grad():
        hidden = model(torch.tensor(ids), ForwardContext.without_cache([len(ids)]))
        return model.compute_logits(hidden[len(prompt) - 1 :]).argmax(-1).tolist()


def test_a_grammar_mask_applies_to_every_verified_position(target, drafter):
    """Structured output (lower-case letters and spaces only). The proposals' mistakes are the target's
    unconstrained favourites, which the grammar refuses there: accepted without its mask at every verified
    position, they would pass the greedy comparison."""
    prompts = _prompts(3, seed=6)
    plain = LLMEngine(EngineConfig(str(target), progress=False))
    expected = _generate(plain, prompts, LETTERS)
    favourites = {tuple(p): _favourites(plain, p, o) for p, o in zip(prompts, expected, strict=True)}
    assert sum(f != t for p, o in zip(prompts, expected, strict=True)
               for f, t in zip(favourites[tuple(p)], o, strict=False)) > 10
    engine = LLMEngine(EngineConfig(str(target), progress=False, speculative_config=speculative(drafter)))
    _replay(engine, {tuple(p): o for p, o in zip(prompts, expected, strict=True)}, cycling_acceptance(2, 0, K),
            mistake=lambda seq, index, right: (favourites[tuple(seq.prompt_token_ids)] + [right + 1] * K)[index])
    got = _generate(engine, prompts, LETTERS)
    assert got == expected
    stats = engine.speculator.stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens


@pytest.mark.parametrize(("broken_class", "method"), [(GrammarController, "observe"),
                                                      (GrammarMasks, "fill_verification")])
def test_a_grammar_failing_mid_run_ends_its_request_alone(target, drafter, plain, monkeypatch, broken_class,
                                                          method):
    """Containment (issue 8) with speculation: a constrained request whose grammar fails after a few steps, while
    it verifies proposals, ends alone; the request beside it decodes on, exactly, and every block is freed."""
    prompts = _prompts(2, seed=16)
    known = {**_continuations(plain, prompts[:1], GREEDY), **_continuations(plain, prompts[1:], LETTERS)}
    engine = LLMEngine(EngineConfig(str(target), progress=False, speculative_config=speculative(drafter)))
    _replay(engine, known, cycling_acceptance(K, 1))
    real = getattr(broken_class, method)
    calls = itertools.count()

    def fails_on_the_fourth_call(*args, **kwargs):
        if next(calls) == 3:
            raise RuntimeError("grammar broke")
        return real(*args, **kwargs)

    monkeypatch.setattr(broken_class, method, fails_on_the_fourth_call)
    engine.add_request("plain", prompts[0], GREEDY)
    engine.add_request("constrained", prompts[1], LETTERS)
    tokens: list[int] = []
    failed: list[str] = []
    while engine.has_unfinished_requests:
        try:
            deltas = engine.step()
        except StepError as error:
            assert not error.whole_batch and "grammar broke" in str(error)
            failed.extend(error.request_ids)
            for request_id in error.request_ids:
                engine.abort(request_id)
            deltas = error.deltas
        tokens.extend(t for delta in deltas if delta.request_id == "plain" for t in delta.token_ids)
    assert failed == ["constrained"]
    assert tokens == known[tuple(prompts[0])]
    assert engine.speculator.stats.num_accepted_tokens > 0
    assert all(used == 0 for used, _ in engine.kv.usage().values())


def test_a_chat_turn_steered_into_a_tool_call_matches_without(target, drafter):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Oslo", "Rome"]}}, "required": ["city"]}}}]
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    params = SamplingParams(temperature=0, max_tokens=40)
    # no reasoning and a bounded value: a random model would write on past 40 tokens, before its call (P-REQ-4)
    kwargs = {"tools": tools, "tool_choice": "required", "chat_template_kwargs": {"current_date": "2026-01-01"},
              "thinking_token_budget": 0}
    expected = LLM(str(target), progress=False).chat(messages, params, **kwargs)[0].output
    llm = LLM(str(target), progress=False, speculative_config=speculative(drafter))
    prompt = tuple(expected.prompt_token_ids)
    _replay(llm.engine, {prompt: expected.token_ids}, cycling_acceptance(K, 0, 2))
    got = llm.chat(messages, params, **kwargs)[0].output
    assert (got.token_ids, got.finish_reason) == (expected.token_ids, expected.finish_reason)
    assert llm.engine.speculator.stats.num_accepted_tokens > 0


# --- sampling ----------------------------------------------------------------------------------------------


def _chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    keep = probs > 0
    assert counts[~keep].sum() == 0
    expected = probs[keep] * counts.sum()
    statistic = ((counts[keep] - expected) ** 2 / expected).sum()
    return float(torch.special.gammaincc(torch.tensor((int(keep.sum()) - 1) / 2), statistic / 2))


@pytest.mark.parametrize("proposer", ["drafter", "replay"])
def test_sampled_tokens_follow_the_target_distribution(target, drafter, plain, proposer):
    """End to end, 600 seeded completions of one prompt (temperature 0.8, top-k 4). The first token is
    ordinary sampling; the second is decided by verifying proposals — drafts sampled from the drafter's
    softmax, or deterministic ones (the greedy continuation) that are often right. Its counts, among the
    completions whose first token is the most frequent one, against the target's processed distribution."""
    prompt = _prompts(1, seed=8)[0]
    # max_tokens 3: after the first token one proposal fits (a step emits at most k + 1 tokens)
    params = SamplingParams(temperature=0.8, top_k=4, max_tokens=3, ignore_eos=True, n=600, seed=100)
    llm = LLM(str(target), progress=False, speculative_config=speculative(drafter), max_num_seqs=128)
    if proposer == "replay":
        _replay(llm.engine, _continuations(plain, [prompt], GREEDY), lambda seq, k: k, keep_drafter=False)
    outputs = llm.generate([prompt], params)[0].outputs
    first = max(set(o.token_ids[0] for o in outputs), key=[o.token_ids[0] for o in outputs].count)
    model = llm.engine.loaded.model
    ids = prompt + [first]
    with torch.no_grad():
        logits = model.compute_logits(model(torch.tensor(ids), ForwardContext.without_cache([len(ids)]))[-1:])
    row = SamplingRow(params, prompt, [first], None)
    expected = sampling_probs(constrain(logits.float(), [row]), [row])[0]
    second = [o.token_ids[1] for o in outputs if o.token_ids[0] == first]
    counts = torch.bincount(torch.tensor(second), minlength=expected.numel()).float()
    assert counts.sum() > 100
    assert _chi_square_p_value(counts, expected) > 1e-3
    stats = llm.engine.speculator.stats
    assert stats.num_draft_tokens > 0
    if proposer == "replay":
        assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens


class _SharpProposer:
    """Drafts drawn from the target's own distribution at temperature 0.2 over its top 6, with that distribution
    attached: often accepted, and sharper than the request's, so a rejection's residual max(0, p - q) is far from
    p (a residual drawn from p would go unnoticed with a draft distribution close to the target's)."""

    def __init__(self, model, inner):
        self.model, self.inner, self.max_draft_tokens = model, inner, inner.max_draft_tokens
        self.generator = torch.Generator().manual_seed(7)

    def first_pending(self, seq):
        return self.inner.first_pending(seq)

    def write_pending(self):
        self.inner.write_pending()

    def release(self, seq):
        self.inner.release(seq)

    def propose(self, context, requests):
        self.inner.propose(context, requests)  # keeps the drafter's context as a real step does
        drafts = []
        for seq, k in requests:
            ids, rows = [*seq.prompt_token_ids, *seq.output_token_ids], []
            for _ in range(k):
                logits = _last_logits(self.model, ids)
                values, top = (logits / 0.2).topk(6)
                q = torch.zeros_like(logits).index_put_((top,), torch.softmax(values, 0))
                ids.append(int(torch.multinomial(q, 1, generator=self.generator)))
                rows.append(q)
            drafts.append(Draft(ids[len(ids) - k:], torch.stack(rows)))
        return drafts


def _last_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model.compute_logits(model(torch.tensor(ids), ForwardContext.without_cache([len(ids)]))[-1:]).float()[0]


def test_whole_sampled_runs_under_penalties_follow_the_target_distribution(target, drafter):
    """The joint distribution of 3-token completions (2,000 seeded ones; temperature 1, top-k 3, repetition,
    frequency and presence penalties) against the one ordinary sampling gives, built from the target's logits
    token by token. Accepted drafts, the token after a rejection, the bonus token and penalties updated inside
    an accepted run all count; drawing a rejection's token from p instead of the residual fails this test."""
    prompt = [5, 17, 99, 3, 250, 41, 7]
    params = SamplingParams(temperature=1.0, top_k=3, presence_penalty=1.5, frequency_penalty=0.7,
                            repetition_penalty=1.6, ignore_eos=True, max_tokens=3, n=2000, seed=1000)
    llm = LLM(str(target), progress=False, enable_prefix_caching=False, max_num_seqs=256,
              speculative_config=speculative(drafter))
    model = llm.engine.loaded.model
    llm.engine.speculator.proposer = _SharpProposer(model, llm.engine.speculator.proposer)
    counts = collections.Counter(tuple(o.token_ids) for o in llm.generate([prompt], params)[0].outputs)
    expected = {(): 1.0}
    for _ in range(params.max_tokens):
        grown = {}
        for before, chance in expected.items():
            row = SamplingRow(params, prompt, list(before), None, (), llm.engine.token_count)
            probs = sampling_probs(constrain(_last_logits(model, prompt + list(before))[None].clone(), [row]), [row])[0]
            grown.update({(*before, t): chance * float(probs[t]) for t in torch.nonzero(probs > 0).flatten().tolist()})
        expected = grown
    runs = list(expected)
    assert set(counts) <= set(runs), "a completion ordinary sampling cannot produce"
    p_value = _chi_square_p_value(torch.tensor([float(counts[r]) for r in runs]),
                                  torch.tensor([expected[r] for r in runs]))
    assert p_value > 1e-3, p_value
    stats = llm.engine.speculator.stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens


@pytest.mark.parametrize("n", [1, 2])
def test_a_seeded_request_is_reproducible_with_speculation(target, drafter, n):
    """n = 2: each completion draws from a generator of its own (seed + index), so both are reproducible, and they
    differ."""
    params = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True, seed=42, n=n)
    prompt = _prompts(1, seed=3)[0]
    runs = []
    for others in (0, 3):  # alone, then with other requests in the batch
        llm = LLM(str(target), progress=False, speculative_config=speculative(drafter))
        batch = [prompt] + _prompts(others, seed=12)
        runs.append([o.token_ids for o in llm.generate(batch, params)[0].outputs])
        assert llm.engine.speculator.stats.num_drafts > 0
    assert runs[0] == runs[1] and len(runs[0]) == n
    assert len(set(map(tuple, runs[0]))) == n



def test_seeded_requests_through_logits_processors_keep_their_tokens_beside_others_with_speculation(target, drafter,
                                                                                                   same_cpu_kernels):
    """Top-p, min-p, penalties, logit bias, min_tokens, a grammar, logprobs and n = 2, each seeded and verified with
    accepted runs: the same tokens alone as beside greedy, unseeded and other seeded requests arriving one a step,
    one of them aborted mid-generation."""
    kinds = [dict(top_p=0.8, logprobs=3), dict(min_p=0.05, top_k=20, n=2),
             dict(presence_penalty=0.8, frequency_penalty=0.5, repetition_penalty=1.3, top_p=0.95),
             dict(logit_bias={30: 3.0, 31: 2.0, 77: -5.0}, min_tokens=4, stop_token_ids=[40, 41], ignore_eos=False),
             dict(structured_outputs=StructuredOutputsParams(regex="[a-z]{2,6}[0-9]+"))]
    seeded = [(f"seeded-{i}", prompt, SamplingParams(**{"temperature": 0.9, "max_tokens": 12, "ignore_eos": True,
                                                        "seed": 100 + i, **kind}))
              for i, (prompt, kind) in enumerate(zip(_prompts(len(kinds), seed=4), kinds, strict=True))]
    others = [(f"beside-{i}", prompt, SamplingParams(temperature=[0, 1.2, 0.7][i % 3], seed=[None, None, 5][i % 3],
                                                     top_p=0.7, max_tokens=12, ignore_eos=True, n=1 + i % 2))
              for i, prompt in enumerate(_prompts(4, seed=8))]

    def run(engine: LLMEngine, requests: list[tuple[str, list[int], SamplingParams]]
            ) -> dict[tuple[str, int], list[int]]:
        tokens: dict[tuple[str, int], list[int]] = {}
        queue, aborted = list(requests), False
        while queue or engine.has_unfinished_requests:
            if queue:
                engine.add_request(*queue.pop(0))
            if ("beside-1", 0) in tokens and not aborted:  # once it has generated
                engine.abort("beside-1")
                aborted = True
            for delta in engine.step():
                tokens.setdefault((delta.request_id, delta.index), []).extend(delta.token_ids)
        return tokens

    engines = [LLMEngine(EngineConfig(str(target), progress=False,
                                      speculative_config=speculative(drafter, num_speculative_tokens=4)))
               for _ in range(2)]
    alone = {}
    for request in seeded:
        alone |= run(engines[0], [request])
    beside = run(engines[1], others[:2] + seeded + others[2:])
    assert {key: beside[key] for key in alone} == alone
    assert 0 < len(beside["beside-1", 0]) < 12  # aborted mid-generation
    assert all(engine.speculator.stats.num_accepted_tokens > 0 for engine in engines)



@pytest.mark.parametrize("limit", [2, 4])
def test_a_disable_by_batch_size_below_max_num_seqs_is_warned_of_for_seeded_requests(target, drafter, caplog, limit,
                                                                                   same_cpu_kernels):
    """Past disable_by_batch_size a step proposes nothing and samples plainly, so a seeded request's draws depend on
    how many requests share its steps, as where the token budget cuts proposals short: said at start-up (it was
    not, and the README promised such a request the same tokens whatever else is in the batch)."""
    with caplog.at_level(logging.WARNING, logger="glimmer.engine.llm_engine"):
        LLM(str(target), progress=False, max_num_seqs=4,
            speculative_config=speculative(drafter, disable_by_batch_size=limit))
    warned = [r.getMessage() for r in caplog.records if "disable_by_batch_size" in r.getMessage()]
    assert warned == ([] if limit == 4 else [
        "speculative_config.disable_by_batch_size=2 is below max_num_seqs=4: steps with more decoding sequences "
        "propose nothing, and a seeded sampled request is then reproducible in distribution, not token for token "
        "(its draws depend on whether its steps proposed)"])


def test_a_drafter_config_warning_is_logged_once_when_the_engine_loads_it(target, drafter, tmp_path, caplog):
    """The engine reads the drafter's config before the target's weights load (to check num_speculative_tokens)
    and again when it loads the drafter: each warning of the config was logged twice."""
    copy = tmp_path / "drafter"
    copy.mkdir()
    for file in Path(drafter).iterdir():
        (copy / file.name).write_bytes(file.read_bytes())
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "frobnicate": 1}))
    with caplog.at_level(logging.INFO, logger="glimmer"):
        LLMEngine(EngineConfig(str(target), progress=False, speculative_config=speculative(copy)))
    warned = [r.getMessage() for r in caplog.records if "frobnicate" in r.getMessage()]
    assert warned == [f"{copy / 'config.json'}: ignoring unknown keys: frobnicate"]


def test_a_native_drafter_without_a_config_is_said_to_take_the_released_sizes_once(target, tmp_path, caplog):
    native = write_tiny_drafter(tmp_path / "native", target, seed=5, layout="native", spec=TinyDrafterSpec())
    (Path(native) / "config.json").unlink(missing_ok=True)
    with caplog.at_level(logging.INFO, logger="glimmer"):
        # the tiny drafter is not the released geometry: refused as its config is first read, before anything loads
        with pytest.raises(ConfigError, match=r"\(no config\.json beside .*: the released drafter's sizes were "
                                              r"assumed; put the drafter's config\.json beside it\)$"):
            LLMEngine(EngineConfig(str(target), progress=False, speculative_config=speculative(native)))
    said = [r.getMessage() for r in caplog.records if "has no config.json" in r.getMessage()]
    assert said == []  # said once, in the refusal

# --- resources, configuration and interface --------------------------------------------------------------


def test_the_drafter_context_lives_in_its_own_pool_and_is_freed_with_the_request(target, drafter):
    engine = LLMEngine(EngineConfig(str(target), progress=False, enable_prefix_caching=False,
                                    speculative_config=speculative(drafter)))
    assert engine.kv_layout.draft_blocks and engine.kv_layout.draft_window == DRAFTER.sliding_window + 1
    engine.add_request("a", list(range(60)), SamplingParams(max_tokens=40, ignore_eos=True))
    engine.step()
    assert engine.kv.usage()[DRAFT][0] > 0
    engine.abort("a")
    assert engine.kv.usage()[DRAFT][0] == 0


def test_aborting_while_the_drafter_context_is_pending_frees_everything(target, drafter):
    """Cancellation mid-decode, after steps without proposals: the kept hidden states and every block go."""
    engine = LLMEngine(EngineConfig(str(target), progress=False, speculative_config=speculative(drafter)))
    engine.speculator.policy.choose = lambda batch: 0  # speculation attached, nothing proposed
    for name in ("a", "b"):
        engine.add_request(name, list(range(3, 30)), SamplingParams(max_tokens=40, ignore_eos=True))
    for _ in range(5):
        engine.step()
    pending = engine.speculator.proposer.pending
    assert pending.num_pending > 0
    engine.abort("a")
    engine.abort("b")
    assert pending.num_pending == 0 and not engine.has_unfinished_requests
    assert all(used == 0 for used, _ in engine.kv.usage().values())


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_aborting_a_request_whose_proposals_wait_for_verification_leaves_the_others_exact(target, drafter, plain,
                                                                                         async_scheduling):
    """Cancellation between a step that proposed tokens for a sequence and the step that would verify them: its
    proposals go with it, the request beside it decodes as without speculation, and every block goes back."""
    prompts = _prompts(2, seed=17)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    engine = LLMEngine(EngineConfig(str(target), progress=False, async_scheduling=async_scheduling,
                                    speculative_config=speculative(drafter)))
    _replay(engine, _continuations(plain, prompts, params), cycling_acceptance(K, 2))
    for name, prompt in zip("ab", prompts, strict=True):
        engine.add_request(name, prompt, params)
    tokens: dict[str, list[int]] = {"a": [], "b": []}
    doomed = engine._seqs["a"][0]
    while not (doomed.spec_token_ids and tokens["a"]):
        for delta in engine.step():
            tokens[delta.request_id].extend(delta.token_ids)
    engine.abort("a")
    while engine.has_unfinished_requests:
        for delta in engine.step():
            tokens[delta.request_id].extend(delta.token_ids)
    assert tokens["b"] == plain.generate([prompts[1]], params)[0].token_ids
    assert engine.speculator.proposer.inner.pending.num_pending == 0
    assert all(used == 0 for used, _ in engine.kv.usage().values())


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"method": "eagle", "model": "x"}, "method='eagle' is not supported"),
        ({"method": "dflash"}, "needs 'model'"),
        ({"method": "dflash", "model": "x", "num_speculative_tokens": 0}, "must be an integer >= 1"),
        ({"method": "dflash", "model": "x", "num_speculative_tokens": 4.5}, "=4.5 must be an integer >= 1 (a whole"),
        ('{"method": "dflash", "model": "x", "disable_by_batch_size": 2.5}', "=2.5 must be an integer >= 1 (a whole"),
        ({"method": "dflash", "model": "x", "num_speculative_tokens": float("inf")}, "=inf must be an integer"),
        ({"method": "dflash", "model": "x", "draft_tensor_parallel_size": 1}, "unknown key(s)"),
        ({"method": "dflash", "model": "x", "draft_policy": "sometimes"}, "draft_policy='sometimes'"),
        ("{not json", "not valid JSON"),
    ],
)
def test_bad_speculative_configs_are_refused(target, config, message):
    with pytest.raises(ConfigError) as error:
        LLMEngine(EngineConfig(str(target), progress=False, speculative_config=config))
    assert message in str(error.value)


def test_integral_floats_are_taken_as_their_integers_as_vllm_takes_them():
    """vLLM's SpeculativeConfig (a pydantic dataclass, lax) takes 4.0 for its int fields; JSON writers emit it."""
    config = SpeculativeConfig.parse('{"method": "dflash", "model": "x", "num_speculative_tokens": 4.0, '
                                     '"disable_by_batch_size": 8.0}')
    assert (config.num_speculative_tokens, config.disable_by_batch_size) == (4, 8)
    assert type(config.num_speculative_tokens) is int and type(config.disable_by_batch_size) is int


def test_null_options_take_their_defaults():
    """A JSON null is the default for every optional key (draft_policy was refused as "None is not one of ...", while
    num_speculative_tokens and disable_by_batch_size took null)."""
    config = SpeculativeConfig.parse('{"method": "dflash", "model": "x", "draft_policy": null, '
                                     '"num_speculative_tokens": null, "disable_by_batch_size": null}')
    assert config.draft_policy == SpeculativeConfig("dflash", "x").draft_policy == "adaptive"
    assert (config.num_speculative_tokens, config.disable_by_batch_size) == (None, None)


def test_a_path_object_names_the_drafter(target, drafter):
    """As LLM(model=...) takes one; it was refused as naming no drafter."""
    llm = LLM(str(target), progress=False, speculative_config={"method": "dflash", "model": Path(drafter)})
    assert llm.engine.speculator.config.model == str(drafter)


def test_a_hub_id_names_the_drafter_as_it_names_the_target(target, drafter, plain, monkeypatch):
    """As vLLM takes one, and as LLM(model=...) does; it was refused as a path that does not exist. Only its config
    and weights (safetensors or the native head.pt) are fetched, its config first (read before the target's weights
    load), and with dummy weights its config alone."""
    import huggingface_hub

    fetched, ignored = [], []

    def snapshot_download(repo_id, revision=None, allow_patterns=None, ignore_patterns=None, tqdm_class=None):
        fetched.append((repo_id, allow_patterns))
        ignored.append(ignore_patterns)
        return str(drafter)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    llm = LLM(str(target), progress=False, speculative_config=speculative("muse-org/tiny-assistant"))
    prompt = _prompts(1, seed=3)[0]
    assert llm.generate([prompt], GREEDY)[0].token_ids == plain.generate([prompt], GREEDY)[0].token_ids
    [(repo, config_patterns), (repo_again, patterns)] = fetched
    assert repo == repo_again == "muse-org/tiny-assistant" and {"*.json", "*.safetensors", "head.pt"} <= set(patterns)
    assert "*.json" in config_patterns and not {"*.safetensors", "head.pt"} & set(config_patterns)
    assert ignored[1] == ["*/*"]  # no files below the top level (a Trainer's checkpoint-N/ folders)
    LLMEngine(EngineConfig(str(target), progress=False, load_format="dummy",
                           speculative_config=speculative("muse-org/tiny-assistant")))
    assert len(fetched) == 4 and all("*.json" in patterns and not {"*.safetensors", "head.pt"} & set(patterns)
                                     for _, patterns in fetched[2:])  # its config alone, before and at loading


def test_a_hub_id_drafter_that_cannot_be_fetched_is_refused_naming_speculative_config_model(target, monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    def offline(repo_id, revision=None, allow_patterns=None, ignore_patterns=None, tqdm_class=None):
        raise LocalEntryNotFoundError("offline")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(CheckpointError, match=r"^speculative_config\.model: model 'muse-org/tiny-assistant' is not a "
                                              r"local directory and could not be downloaded"):
        LLMEngine(EngineConfig(str(target), progress=False, speculative_config=speculative("muse-org/tiny-assistant")))


def test_unknown_keys_of_mixed_types_are_refused_naming_them():
    """sorted() compared an int key with a str key and raised TypeError instead."""
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \[1, 'foo'\]"):
        SpeculativeConfig.parse({"method": "dflash", "model": "x", 1: "y", "foo": 2})


@pytest.mark.parametrize("config", [
    {"method": "ngram", "num_speculative_tokens": 3},
    {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2},
    '{"method": "suffix"}',
])
def test_a_vllm_method_glimmer_lacks_is_refused_as_such_before_its_keys(config):
    """vLLM's ngram and suffix methods take no model and keys of their own: the refusal said to add 'model', or named
    prompt_lookup_max an unknown key, and only once those were mended that the method is not supported."""
    with pytest.raises(ConfigError, match=r"^speculative_config\.method='(ngram|suffix)' is not supported; use one of "
                                          r"\['dflash'\] with the model's DFlash drafter as 'model'$"):
        SpeculativeConfig.parse(config)


def test_a_missing_model_shows_an_example_that_parses():
    with pytest.raises(ConfigError) as error:
        SpeculativeConfig.parse({"method": "dflash"})
    example = re.search(r"\(e\.g\. (.*)\)$", str(error.value)).group(1)
    assert json.loads(example) == {"method": "dflash", "model": "/path/to/Muse-Glimmer-30B-assistant"}


@pytest.mark.parametrize("config", [{}, {"method": None}, '{"method": null}'])
def test_a_drafter_without_a_method_runs_as_dflash_as_vllm_infers_the_method(target, drafter, plain, config):
    """vLLM's method defaults to None, inferred from the drafter; DFlash is the one Glimmer has. A speculative_config
    naming only its model was refused as needing 'method', one with "method": null as an unsupported method."""
    if isinstance(config, str):
        config = config[:-1] + f', "model": {json.dumps(str(drafter))}}}'
    else:
        config = {**config, "model": str(drafter)}
    llm = LLM(str(target), progress=False, speculative_config=config)
    assert llm.engine.speculator.config.method == "dflash"
    prompt = _prompts(1, seed=4)[0]
    assert llm.generate([prompt], GREEDY)[0].token_ids == plain.generate([prompt], GREEDY)[0].token_ids
    assert llm.engine.speculator.stats.num_drafts > 0


def test_a_target_named_as_the_drafter_without_a_method_is_refused_as_no_drafter(target):
    with pytest.raises(ConfigError, match=r"is not a DFlash drafter config; expected 'muse_glimmer_assistant'"):
        LLMEngine(EngineConfig(str(target), progress=False, speculative_config={"model": str(target)}))


def test_configurations_that_cannot_verify_are_refused_with_the_numbers(target, drafter):
    with pytest.raises(ConfigError, match=r"exceeds what the drafter proposes per step: its block_size is 6, so at "
                                          r"most 5"):
        LLMEngine(EngineConfig(str(target), progress=False,
                               speculative_config=speculative(drafter, num_speculative_tokens=8)))
    with pytest.raises(ConfigError, match=r"max_num_batched_tokens=4 cannot hold one sequence's verification step "
                                          r"\(1 \+ num_speculative_tokens = 6 tokens\)"):
        LLMEngine(EngineConfig(str(target), progress=False, max_num_batched_tokens=4,
                               speculative_config=speculative(drafter)))


def test_more_speculative_tokens_than_the_drafter_proposes_are_refused_before_the_target_loads(target, drafter,
                                                                                                monkeypatch):
    """The drafter's config is read before the target's weights: it was refused only once the target and the
    drafter had loaded (minutes for the 30B)."""
    import glimmer.engine.llm_engine

    def load_model(*args, **kwargs):
        pytest.fail("the target's weights were loaded")

    monkeypatch.setattr(glimmer.engine.llm_engine, "load_model", load_model)
    with pytest.raises(ConfigError, match=r"^speculative_config\.num_speculative_tokens=8 exceeds what the drafter "
                                          r"proposes per step: its block_size is 6, so at most 5$"):
        LLM(str(target), progress=False, speculative_config=speculative(drafter, num_speculative_tokens=8))


def test_a_drafter_that_does_not_fit_the_target_is_refused_before_the_target_loads(target, monkeypatch):
    """The drafter of another model (glimmer-nano's, hidden size 256, beside the tiny target's 64) was refused with
    the numbers only once the target's weights had loaded (minutes for the 30B); its config and the target's hold
    them before."""
    import glimmer.engine.llm_engine

    def load_model(*args, **kwargs):
        pytest.fail("the target's weights were loaded")

    monkeypatch.setattr(glimmer.engine.llm_engine, "load_model", load_model)
    with pytest.raises(ConfigError, match=r"glimmer-nano-dflash: the drafter does not fit the target model: "
                                          r"hidden_size=256 but the target's hidden_size is 64"):
        LLM(str(target), progress=False, speculative_config={"method": "dflash", "model": "glimmer-nano-dflash"})


def test_a_token_budget_below_the_drafters_own_proposals_is_refused_before_the_target_loads(target, drafter,
                                                                                           monkeypatch):
    """Without num_speculative_tokens a step proposes what the drafter's block holds, which its config (read before
    the target's weights) says: a max_num_batched_tokens that cannot verify them was refused only once the target and
    the drafter had loaded (minutes for the 30B)."""
    import glimmer.engine.llm_engine

    def load_model(*args, **kwargs):
        pytest.fail("the target's weights were loaded")

    monkeypatch.setattr(glimmer.engine.llm_engine, "load_model", load_model)
    with pytest.raises(ConfigError, match=r"^max_num_batched_tokens=4 cannot hold one sequence's verification step "
                                          r"\(1 \+ num_speculative_tokens = 6 tokens\)"):
        LLM(str(target), progress=False, max_num_batched_tokens=4, speculative_config=speculative(drafter))


def test_a_token_budget_below_the_given_num_speculative_tokens_is_refused_before_the_model_is_looked_for():
    """It was refused only once the target and the drafter had loaded (minutes for the 30B)."""
    with pytest.raises(ConfigError, match=r"^max_num_batched_tokens=8 cannot hold one sequence's verification step "
                                          r"\(1 \+ num_speculative_tokens = 16 tokens\)"):
        LLM("/nonexistent/model/dir", progress=False, max_num_batched_tokens=8,
            speculative_config={"method": "dflash", "model": "glimmer-nano-dflash", "num_speculative_tokens": 15})


def test_the_adaptive_policy_measures_acceptance_from_verifications(target, drafter, plain):
    """(The choice itself, from acceptance and step times, is tested in test_draft_policy.py: wall times on a
    shared test machine are too noisy to assert on here.)"""
    prompts = _prompts(4, seed=5)
    known = _continuations(plain, prompts, GREEDY)
    engine = LLMEngine(EngineConfig(str(target), progress=False,
                                    speculative_config={"method": "dflash", "model": str(drafter)}))
    _replay(engine, known, lambda seq, k: 0)  # every proposal wrong
    tokens = _drive(engine, {0: [(f"r{i}", p) for i, p in enumerate(prompts)]})
    assert [tokens[f"r{i}"] for i in range(4)] == [known[tuple(p)] for p in prompts]
    assert engine.speculator.policy.acceptance[1] < 0.1
    assert engine.speculator.stats.num_drafts > 0 and engine.speculator.stats.num_accepted_tokens == 0


# --- steps without proposals: the drafter's context caught up later (draft_context.py) -----------------------


def _visible_draft_cache(engine: LLMEngine, seq) -> torch.Tensor:
    """The drafter keys/values a block of `seq` reads now: every layer, at the positions of its visible blocks
    before the anchor."""
    proposer = engine.speculator.proposer
    anchor = seq.num_tokens - 1
    start = engine.kv.first_needed_block(DRAFT, anchor) * engine.kv.block_size
    slots = engine.kv.blocks_for(seq, DRAFT, start, anchor)[2]
    return torch.stack([cache.flatten(0, 1)[slots] for pair in proposer.kv_caches for cache in pair])


def _record_drafts(engine: LLMEngine) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Lists that fill, as the engine runs, with each proposal's drafts and the drafter cache it read."""
    drafts, caches = [], []
    inner = engine.speculator.proposer.propose

    def propose(context, requests):
        out = inner(context, requests)
        drafts.extend(d.token_ids for d in out)
        caches.extend(_visible_draft_cache(engine, seq) for seq, _ in requests)
        return out

    engine.speculator.proposer.propose = propose
    return drafts, caches


def _run_lazy_and_eager(target, drafter, prompts, choose, **config):
    """Drafts, tokens and the drafter cache each drafting step reads, with the context of steps without
    proposals left pending (as the engine runs) and written at once (max_rows 0: never pending)."""
    runs = []
    for max_rows in (K, 0):
        engine = LLMEngine(EngineConfig(str(target), progress=False, speculative_config=speculative(drafter),
                                        **config))
        spec = engine.speculator
        spec.proposer.pending.max_rows = max_rows
        steps = itertools.count()
        spec.policy.choose = lambda batch, steps=steps: choose(next(steps))
        drafts, caches = _record_drafts(engine)
        params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
        tokens = _drive(engine, {0: [(f"r{i}", p) for i, p in enumerate(prompts[:3])],
                                 5: [(f"r{i}", p) for i, p in enumerate(prompts[3:], start=3)]}, params)
        runs.append((drafts, tokens, caches, engine))
    return runs


def test_context_left_pending_by_steps_without_proposals_is_caught_up_exactly(target, drafter):
    """Runs of steps without proposals shorter and longer than a block (the longer ones write their context in a
    context-only forward): the same drafts, tokens and drafter cache as writing the context every step."""
    prompts = _prompts(5, seed=31)
    (drafts, tokens, caches, engine), (drafts_now, tokens_now, caches_now, _) = _run_lazy_and_eager(
        target, drafter, prompts, lambda step: K if step % 11 in (3, 10) else 0)
    assert drafts == drafts_now and tokens == tokens_now
    assert len(caches) == len(caches_now) > 10
    for cache, cache_now in zip(caches, caches_now, strict=True):
        torch.testing.assert_close(cache, cache_now, rtol=1e-3, atol=1e-4)  # float32 rounding
    assert engine.speculator.proposer.pending.num_pending == 0  # finished sequences leave nothing behind


def test_pending_context_under_preemption_and_chunked_prefill_is_caught_up_exactly(target, drafter):
    prompts = _prompts(6)
    runs = _run_lazy_and_eager(target, drafter, prompts, lambda step: K if step % 9 == 8 else 0,
                               kv_cache_memory=340_000, max_num_seqs=3, max_num_batched_tokens=32, max_model_len=160)
    (drafts, tokens, caches, engine), (drafts_now, tokens_now, caches_now, _) = runs
    assert engine.scheduler.num_preemptions > 0
    assert drafts == drafts_now and tokens == tokens_now and len(drafts) > 5
    for cache, cache_now in zip(caches, caches_now, strict=True):
        torch.testing.assert_close(cache, cache_now, rtol=1e-3, atol=1e-4)  # float32 rounding
    assert all(used == 0 for used, _ in engine.kv.usage().values())


def test_a_preempted_sequence_keeps_no_pending_drafter_context(target, drafter, plain):
    """Preemption frees the drafter blocks a sequence's pending context was meant for: the context goes with them
    before the next step runs, so a re-admission that resumes where it ended (a block-aligned prefix hit from an
    identical sibling) cannot write it into a shared cached block. Greedy outputs stay those without speculation."""
    prompts = [prompt[:10] for prompt in _prompts(12) if len(prompt) >= 10][:4]
    longer = SamplingParams(temperature=0, max_tokens=70, ignore_eos=True)
    engine = LLMEngine(EngineConfig(str(target), progress=False, kv_cache_memory=230_000, max_num_seqs=3,
                                    max_num_batched_tokens=32, max_model_len=160,
                                    speculative_config=speculative(drafter)))
    scheduler, proposer, runner = engine.scheduler, engine.speculator.proposer, engine.runner
    steps = itertools.count()
    engine.speculator.policy.choose = lambda batch: K if next(steps) % 9 == 8 else 0
    preempted, pending_when_preempted, pending_when_run = [], [], []
    preempt, execute = scheduler._preempt, runner.execute

    def recorded_preempt(seq):
        preempted.append(seq)
        pending_when_preempted.append(proposer.first_pending(seq))
        preempt(seq)

    def checked_execute(step, *args, **kwargs):
        pending_when_run.extend(proposer.first_pending(seq) for seq in preempted)
        preempted.clear()
        return execute(step, *args, **kwargs)

    scheduler._preempt, runner.execute = recorded_preempt, checked_execute
    assert _generate(engine, prompts, longer) == [o.token_ids for o in plain.generate(prompts, longer)]
    assert any(first is not None for first in pending_when_preempted)
    assert len(pending_when_run) == len(pending_when_preempted) and set(pending_when_run) == {None}


def test_a_re_admitted_sequence_never_writes_drafter_context_into_a_block_it_shares_from_the_cache(target, drafter,
                                                                                                 plain):
    """Three requests for one prompt, staggered, in a pool small enough to preempt them: a sequence preempted with
    its drafter context pending is re-admitted on its sibling's cached blocks. No drafter forward writes context
    into a cached block that another sequence holds too (it once wrote the stale pending rows there)."""
    prompt = _prompts(1, seed=13)[0][:25]
    params = SamplingParams(temperature=0, max_tokens=81, ignore_eos=True)
    engine = LLMEngine(EngineConfig(str(target), progress=False, kv_cache_memory=250_000, max_num_seqs=4,
                                    max_num_batched_tokens=32, max_model_len=160,
                                    speculative_config=speculative(drafter)))
    steps = itertools.count()
    engine.speculator.policy.choose = lambda batch: K if next(steps) % 17 == 16 else 0
    proposer, pool, block_size = engine.speculator.proposer, engine.kv.pools[DRAFT], engine.kv.block_size
    shared_writes, layout = [], proposer._layout

    def checked_layout(rows, seqs):
        out = layout(rows, seqs)
        blocks = {slot // block_size for slots in out.context_slots for slot in slots}
        shared_writes.extend(b for b in blocks if pool.is_cached(b) and pool.ref_counts[b] > 1)
        return out

    proposer._layout = checked_layout
    tokens = _drive(engine, {4: [("a", prompt)], 5: [("b", prompt)], 19: [("c", prompt)]}, params)
    assert engine.scheduler.num_preemptions > 0
    assert shared_writes == []
    assert tokens == dict.fromkeys("abc", plain.generate([prompt], params)[0].token_ids)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_pending_context_is_dropped_only_where_no_later_block_can_see_it(make_tiny, tmp_path, async_scheduling):
    """A drafter window (4) much smaller than its block (16) and KV blocks of 4: steps without proposals leave up to
    15 positions pending, and the window moves past the oldest before a step proposes, so their drafter blocks are
    released unwritten (draft_context.py drops them). Every block the drafter denoises still reads, at each position
    its window sees, the keys/values written there for its own tokens (never a released or reused slot), and the
    tokens are greedy's without speculation."""
    checkpoint = make_tiny(spec=TinySpec(sliding_window=4), seed=21)
    drafter_dir = write_tiny_drafter(tmp_path / "d", checkpoint, seed=5,
                                     spec=TinyDrafterSpec(sliding_window=4, block_size=16))
    prompts = _prompts(4, seed=35)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    engine = LLMEngine(EngineConfig(str(checkpoint), progress=False, block_size=4, async_scheduling=async_scheduling,
                                    speculative_config=speculative(drafter_dir)))
    proposer, kv = engine.speculator.proposer, engine.kv
    assert kv.windows[DRAFT] == 5 and proposer.pending.max_rows == 15
    steps = itertools.count()
    engine.speculator.policy.choose = lambda batch: 15 if next(steps) % 13 in (0, 12) else 0
    written: dict[int, tuple[tuple[int, ...], int]] = {}  # cache slot → (the tokens up to its position, position)
    wrong_reads, dropped, layout = [], [], proposer._layout
    live = proposer.pending._live

    def tokens_through(seq, position):
        return tuple((seq.prompt_token_ids + seq.output_token_ids)[: position + 1]), position

    def checked_layout(rows, seqs):
        out = layout(rows, seqs)
        for seq, positions, slots in zip(rows.seqs, out.context_positions, out.context_slots, strict=True):
            written.update((slot, tokens_through(seq, p)) for p, slot in zip(positions, slots, strict=True))
        for seq, table, first in zip(seqs, out.tables, out.table_starts, strict=True):
            anchor = seq.num_tokens - 1
            for p in range(max(0, anchor - kv.windows[DRAFT] + 1), anchor):
                slot = table[(p - first) // kv.block_size] * kv.block_size + p % kv.block_size
                if written.get(slot) != tokens_through(seq, p):
                    wrong_reads.append((seq.request_id, anchor, p))
        return out

    def counted_live(pending):
        first, rows = live(pending)
        dropped.append(first - pending.start)
        return first, rows

    proposer._layout, proposer.pending._live = checked_layout, counted_live
    assert _generate(engine, prompts, params) == [o.token_ids for o in LLM(
        str(checkpoint), progress=False, block_size=4).generate(prompts, params)]
    assert sum(dropped) > 20 and engine.speculator.stats.num_drafts > 10
    assert wrong_reads == []


def test_a_step_without_proposals_hands_over_its_drafter_context_before_its_tokens_are_read(target, drafter,
                                                                                          monkeypatch):
    """The bookkeeping of the drafter context runs while the device computes the step (stage_context), not on
    the host's critical path after the sampled tokens are read."""
    import glimmer.engine.llm_engine as engine_module

    llm = LLM(str(target), progress=False, speculative_config=speculative(drafter))
    engine = llm.engine
    engine.speculator.policy.choose = lambda batch: 0  # never propose: every step leaves its context pending
    pending_at_sampling = []
    original = engine_module.sample

    def sample(*args, **kwargs):
        pending_at_sampling.append(engine.speculator.proposer.pending.num_pending)
        return original(*args, **kwargs)

    monkeypatch.setattr(engine_module, "sample", sample)
    engine.add_request("a", _prompts(1, seed=3)[0][:5], GREEDY)
    while engine.has_unfinished_requests:
        engine.step()
    # the 5 prompt positions, then one more per decode step, already pending when the step's token is read;
    # the step that would make K + 1 writes them all with its own, and the count starts again
    assert pending_at_sampling[:K - 2] == list(range(5, K + 1)) + [0, 1]


def test_a_block_is_registered_in_the_prefix_cache_only_once_its_drafter_context_is_written(target, drafter):
    engine = LLMEngine(EngineConfig(str(target), progress=False, speculative_config=speculative(drafter)))
    spec = engine.speculator
    spec.policy.choose = lambda batch: 0
    engine.add_request("r", list(range(20, 50)), SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    seq = engine._seqs["r"][0]
    while seq.num_computed_tokens < 34:  # decoding: positions 30 … 33 committed, their drafter context pending
        engine.step()
    assert spec.proposer.first_pending(seq) == 30
    assert seq.num_registered_blocks == 1  # block 1 (positions 16 … 31) is complete in the target's groups only
    spec.policy.choose = lambda batch: K
    engine.step()  # proposes: the pending context is written first
    assert spec.proposer.first_pending(seq) is None
    engine.step()
    assert seq.num_registered_blocks == 2


def test_a_prefix_cache_hit_on_blocks_decoded_without_proposals_restores_the_drafter_context(target, drafter):
    """The second prompt continues the first one's output, whose blocks were decoded mostly without proposals (the
    last one completed by the final step, its drafter context written as the request ends): after a hit the
    drafter reads the cache, and drafts, of a run without the prefix cache."""
    prompt = list(range(20, 40))
    params = SamplingParams(temperature=0, max_tokens=45, ignore_eos=True)  # 64 positions computed at the end
    runs = []
    for caching in (True, False):
        llm = LLM(str(target), progress=False, enable_prefix_caching=caching, speculative_config=speculative(drafter))
        engine = llm.engine
        steps = itertools.count()
        engine.speculator.policy.choose = lambda batch, steps=steps: K if next(steps) % 7 == 6 else 0
        first = llm.generate([prompt], params)[0].token_ids
        engine.speculator.policy.choose = lambda batch: K
        recorded, caches = record_drafts(engine), []
        inner = engine.speculator.proposer.propose

        def propose(context, requests, engine=engine, inner=inner, caches=caches):
            out = inner(context, requests)
            caches.extend(_visible_draft_cache(engine, seq) for seq, _ in requests)
            return out

        engine.speculator.proposer.propose = propose
        second = llm.generate([prompt + first + [7]], GREEDY)[0]
        runs.append((first, second.token_ids, second.num_cached_tokens, recorded, caches))
    (first, second, cached, drafts, caches), (first_plain, second_plain, _, drafts_plain, caches_plain) = runs
    assert cached == 64  # every full block of the 64 computed positions, the one the final step completed too
    assert (first, second) == (first_plain, second_plain)
    assert drafts == drafts_plain and drafts
    for cache, cache_plain in zip(caches, caches_plain, strict=True):
        torch.testing.assert_close(cache, cache_plain, rtol=1e-3, atol=1e-4)  # float32 rounding


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("proposals", ["drafter", "replayed", None])
@pytest.mark.parametrize("max_tokens", [29, 45])
def test_a_follow_up_turn_finds_every_full_block_of_the_first_turn_in_the_prefix_cache(target, drafter, plain,
                                                                                       proposals, max_tokens,
                                                                                       async_scheduling):
    """The last full block of a finished request goes to the prefix cache whichever step filled it — a verification
    that accepted drafts into it, or a step without proposals whose drafter context was still pending — so the
    next turn (prompt, output and a new token) recomputes none of it; outputs are those of a run without either."""
    prompt = list(range(20, 40))
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    expected_first = plain.generate([prompt], params)[0].token_ids
    llm = LLM(str(target), progress=False, speculative_config=speculative(drafter) if proposals else None,
              async_scheduling=async_scheduling)  # True: plain decode steps run ahead (lookahead.py), as on CUDA
    if proposals == "replayed":  # the drafter runs, but the target's own continuation is proposed: long runs accepted
        _replay(llm.engine, {tuple(prompt): expected_first}, cycling_acceptance(K, K - 1, 2))
    first = llm.generate([prompt], params)[0].token_ids
    second = llm.generate([prompt + first + [7]], GREEDY)[0]
    computed = len(prompt) + len(first) - 1  # the last token was sampled, never an input
    block = llm.engine.kv.block_size
    assert second.num_cached_tokens == computed // block * block
    assert first == expected_first
    assert second.token_ids == plain.generate([prompt + first + [7]], GREEDY)[0].token_ids


@pytest.mark.parametrize("num_tokens", [29, 30])
def test_a_request_aborted_while_its_drafter_context_is_pending_leaves_its_full_blocks_in_the_prefix_cache(
        target, drafter, plain, num_tokens):
    """A stop the server decides (a stop string in the answer, P-HDR-8) aborts the request: its full blocks are
    cached as when it finishes, though steps without proposals (the adaptive policy's choice) left their drafter
    context pending."""
    engine = LLMEngine(EngineConfig(str(target), progress=False, speculative_config=speculative(drafter)))
    engine.speculator.policy.choose = lambda batch: 0
    prompt = list(range(20, 40))
    engine.add_request("first", prompt, SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
    output: list[int] = []
    while len(output) < num_tokens:
        output += [token for delta in engine.step() for token in delta.token_ids]
    computed = engine._seqs["first"][0].num_computed_tokens
    assert engine.speculator.proposer.first_pending(engine._seqs["first"][0]) < computed // 16 * 16
    engine.abort("first")
    follow_up = prompt + output + [7]
    engine.add_request("second", follow_up, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    deltas = [delta for _ in range(10) if engine.has_unfinished_requests for delta in engine.step()]
    assert deltas[0].num_cached_tokens == computed // 16 * 16 == 48
    assert [t for d in deltas for t in d.token_ids] == plain.generate([follow_up], SamplingParams(
        temperature=0, max_tokens=3, ignore_eos=True))[0].token_ids
    assert all(used == 0 for used, _ in engine.kv.usage().values())


@pytest.mark.parametrize("every", [3, 11])
def test_steps_the_policy_proposes_nothing_for_run_ahead_with_the_same_drafts_and_tokens(target, drafter, plain,
                                                                                        launches, every,
                                                                                        same_cpu_kernels):
    """With async scheduling a step without proposals runs ahead of the host (lookahead.py), its drafter context
    staged at launch: the drafts, the tokens and the drafter cache each drafting step reads equal synchronous
    stepping's. Both runs compute the same steps (the same sequences, rows and drafter forwards) with the same
    kernels (`same_cpu_kernels`), so the cache is compared bit for bit."""
    prompts = _prompts(5, seed=33)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    runs = {}
    for mode in (False, True):
        engine = LLMEngine(EngineConfig(str(target), progress=False, async_scheduling=mode,
                                        speculative_config=speculative(drafter)))
        spec = engine.speculator
        calls = itertools.count()
        spec.policy.choose = lambda batch, calls=calls: K if next(calls) % every == every - 1 else 0
        drafts, caches = _record_drafts(engine)
        runs[mode] = (_generate(engine, prompts, params), drafts, caches)
        assert spec.proposer.pending.num_pending == 0
        assert all(used == 0 for used, _ in engine.kv.usage().values())
    (tokens, drafts, caches), (tokens_ahead, drafts_ahead, caches_ahead) = runs[False], runs[True]
    assert tokens_ahead == tokens == [o.token_ids for o in plain.generate(prompts, params)]
    assert drafts_ahead == drafts and len(drafts) > 10
    for cache, cache_ahead in zip(caches, caches_ahead, strict=True):
        torch.testing.assert_close(cache_ahead, cache, rtol=0, atol=0)
    assert launches["rows"] > 50  # (the synchronous run launches nothing ahead)


def test_the_draft_policy_never_times_the_engine_idle_as_a_step(target, drafter, plain, monkeypatch):
    """A request that a stop id ends while its next step runs ahead (async scheduling, as on CUDA) leaves that step
    launched; read only when the next request came, it was timed from its launch, idle time included, and the adaptive
    policy took that for what a step without proposals costs (after an hour idle, 191 s a step here: speculation
    then won wherever it was compared). Here the clock moves only while the engine is idle."""
    now = [0.0]
    clock = types.SimpleNamespace(perf_counter=lambda: now[0])
    monkeypatch.setattr(llm_engine, "time", clock)
    monkeypatch.setattr(spec_decode, "time", clock)
    prompt = _prompts(1, seed=41)[0]
    greedy = plain.generate([prompt], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0].token_ids
    at = next(j for j in range(8, 20) if greedy[j] not in greedy[:j])
    engine = LLMEngine(EngineConfig(str(target), progress=False, async_scheduling=True,
                                    speculative_config=speculative(drafter, draft_policy="adaptive")))
    policy = engine.speculator.policy
    policy.choose = lambda batch: 0  # every step runs ahead
    params = SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[greedy[at]])
    assert _generate(engine, [prompt], params) == [greedy[: at + 1]]
    now[0] += 3600.0
    assert _generate(engine, [prompt], params) == [greedy[: at + 1]]
    assert policy.step_times(1) == {0: 0.0}


def test_allowed_token_ids_apply_to_every_verified_position(target, drafter):
    """vLLM's `allowed_token_ids` (every other id banned) under speculation, greedy: the proposals' mistakes are the
    target's unconstrained favourites, mostly outside the allowed ids; accepted there, they would pass the greedy
    comparison with plain decoding."""
    prompts = _prompts(3, seed=7)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, allowed_token_ids=list(range(100, 400, 7)))
    plain = LLMEngine(EngineConfig(str(target), progress=False))
    expected = _generate(plain, prompts, params)
    assert all(set(o) <= set(params.allowed_token_ids) for o in expected)
    favourites = {tuple(p): _favourites(plain, p, o) for p, o in zip(prompts, expected, strict=True)}
    assert sum(f not in params.allowed_token_ids for f in itertools.chain(*favourites.values())) > 10
    engine = LLMEngine(EngineConfig(str(target), progress=False, speculative_config=speculative(drafter)))
    _replay(engine, {tuple(p): o for p, o in zip(prompts, expected, strict=True)}, cycling_acceptance(2, 0, K),
            mistake=lambda seq, index, right: (favourites[tuple(seq.prompt_token_ids)] + [right + 1] * K)[index])
    assert _generate(engine, prompts, params) == expected
    stats = engine.speculator.stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_bad_words_inside_proposals_match_greedy_without(target, drafter, plain, async_scheduling):
    """Proposals of the free run, which holds the banned words: a position after proposed tokens that spell a word's
    first token bans its last (they count as generated), so the verified tokens are those of a run without
    speculation."""
    prompts = _prompts(4, seed=31)
    free = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    known = _continuations(plain, prompts, free)
    tokenizer = plain.get_tokenizer()
    words = []
    for tokens in known.values():  # from each run a word of two tokens, spelled as they are
        pairs = [tokens[j:j + 2] for j in range(4, len(tokens) - 1)
                 if tokenizer.decode(tokens[j:j + 2]).strip() == tokenizer.decode(tokens[j:j + 2])
                 and tokenizer.encode_text(tokenizer.decode(tokens[j:j + 2])) == tokens[j:j + 2]]
        words += [tokenizer.decode(pairs[0])] if pairs else []
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, bad_words=words, logprobs=1)
    llm = LLM(str(target), progress=False, async_scheduling=async_scheduling, speculative_config=speculative(drafter))
    _replay(llm.engine, known, lambda seq, k: k)  # the free run's tokens, proposed as they are
    expected = plain.generate(prompts, params)
    got = llm.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in expected]
    assert sum(o.outputs[0].token_ids != known[tuple(p)] for o, p in zip(expected, prompts, strict=True)) >= 3
    assert len(words) >= 3 and llm.engine.speculator.stats.acceptance_lengths[K + 1] > 0


@pytest.mark.parametrize("penalties", [dict(repetition_penalty=1.8), dict(presence_penalty=1.5),
                                       dict(frequency_penalty=1.2, presence_penalty=0.4, repetition_penalty=1.2)])
def test_penalties_the_drafter_ignores_are_applied_in_verification_so_greedy_matches_without(target, drafter, plain,
                                                                                             penalties):
    """The drafter proposes without penalties: proposals of the run without them (accepted in full where the
    penalties change nothing) are verified under the penalties, counting the proposed tokens before each position as
    generated, so the tokens are those of a penalized run without speculation."""
    prompts = _prompts(4, seed=17)
    free = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    known = _continuations(plain, prompts, free)
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, **penalties)
    llm = LLM(str(target), progress=False, speculative_config=speculative(drafter))
    _replay(llm.engine, known, lambda seq, k: k)  # the unpenalized run's tokens, proposed as they are
    expected = [o.outputs[0].token_ids for o in plain.generate(prompts, params)]
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == expected
    assert sum(e != known[tuple(p)] for e, p in zip(expected, prompts, strict=True)) >= 3  # the penalties count
    stats = llm.engine.speculator.stats
    assert stats.num_accepted_tokens > 0 and stats.acceptance_lengths[1] > 0  # accepted runs and rejections


# --- drafts under the request's masks ---------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_drafts_never_propose_what_the_request_masks(target, drafter, temperature):
    """The drafter's favourites — a padding row of the vocabulary, a stop id while min_tokens holds, a bad word of
    one token, the last token of a two-token bad word right after its first, an id logit_bias pushes down — are not
    proposed at the positions where sampling masks them. Greedy drafts take the best id left; sampled ones are
    drawn from, and hand verification, the softmax of the masked, biased logits."""
    engine = LLMEngine(EngineConfig(str(target), progress=False, speculative_config=speculative(drafter)))
    proposer = engine.speculator.proposer
    vocab, tokens = engine.model_config.text.vocab_size, engine.token_count
    assert tokens < vocab
    params = SamplingParams(temperature=temperature, seed=3, min_tokens=4, logit_bias={70: -10.0})
    seq = Sequence("r", [1, 2, 3], params, frozenset({40}), 100, generator=torch.Generator().manual_seed(3),
                   bad_word_ids=((50,), (60, 61)), output_token_ids=[7, 60])
    logits = torch.zeros(1, 4, vocab)
    for token, value in ((vocab - 1, 9.0), (40, 8.0), (50, 7.0), (61, 6.0), (70, 5.0), (80, 4.0)):
        logits[0, :, token] = value
    draft = proposer._choose(logits, [(seq, 4)])[0]
    masked = logits[0].clone()
    masked[:, 70] -= 10
    masked[:, tokens:] = masked[:, 50] = masked[0, 61] = float("-inf")
    masked[:2, 40] = float("-inf")  # two outputs before the draft: min_tokens=4 bans the stop id at its first two
    if temperature == 0:
        assert draft.token_ids == [80, 61, 40, 40] and draft.probs is None
        return
    torch.testing.assert_close(draft.probs, torch.softmax(masked, dim=-1))
    assert len(draft.token_ids) == 4 and all(draft.probs[j, t] > 0 for j, t in enumerate(draft.token_ids))


def test_a_position_the_masks_leave_no_id_ends_the_draft_before_it(target, drafter):
    """A position where the masks leave no id (here allowed_token_ids holds only the stop id, banned while
    min_tokens holds) proposes nothing, and nothing after it."""
    engine = LLMEngine(EngineConfig(str(target), progress=False, speculative_config=speculative(drafter)))
    params = SamplingParams(temperature=1.0, seed=1, min_tokens=3, allowed_token_ids=[40])
    seq = Sequence("r", [1, 2, 3], params, frozenset({40}), 100, generator=torch.Generator().manual_seed(1),
                   output_token_ids=[40])
    draft = engine.speculator.proposer._choose(torch.zeros(1, 4, engine.model_config.text.vocab_size), [(seq, 4)])[0]
    assert draft.token_ids == [] and draft.probs.shape[0] == 0


CONSTRAINTS = {"allowed_token_ids": dict(allowed_token_ids=list(range(100, 108))),
               "logit_bias": dict(logit_bias={i: 30.0 for i in range(100, 108)})}


@pytest.mark.parametrize("constraint", list(CONSTRAINTS))
def test_drafts_under_a_constraint_are_accepted_and_greedy_matches_without(target, drafter, constraint):
    """The real drafter's unconstrained favourites lie outside the eight ids the request keeps to: proposed as they
    were, none was accepted. Proposed under the request's mask, drafts keep to the eight ids, some are accepted,
    and greedy output is that of decoding without speculation."""
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, **CONSTRAINTS[constraint])
    prompts = _prompts(4, seed=9)
    expected = _generate(LLMEngine(EngineConfig(str(target), progress=False)), prompts, params)
    engine = LLMEngine(EngineConfig(str(target), progress=False, speculative_config=speculative(drafter)))
    drafts, _ = _record_drafts(engine)
    assert _generate(engine, prompts, params) == expected
    assert {t for d in drafts for t in d} <= set(range(100, 108))
    assert engine.speculator.stats.num_accepted_tokens > 0


@pytest.mark.parametrize("constraint", list(CONSTRAINTS))
def test_seeded_sampling_under_a_constraint_is_reproducible_with_drafts_accepted(target, drafter, constraint):
    params = SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True, seed=5, **CONSTRAINTS[constraint])
    prompts = _prompts(3, seed=2)
    runs, accepted = [], []
    for _ in range(2):
        llm = LLM(str(target), progress=False, speculative_config=speculative(drafter))
        runs.append([o.outputs[0].token_ids for o in llm.generate(prompts, params)])
        accepted.append(llm.engine.speculator.stats.num_accepted_tokens)
    assert runs[0] == runs[1] and all(set(r) <= set(range(100, 108)) for r in runs[0])
    assert accepted[0] == accepted[1] > 0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_drafts_under_a_grammar_keep_to_it_and_leave_its_matcher_as_it_was(target, drafter, temperature):
    """Structured output (a JSON object of one lower-case word): each proposal is masked by the grammar after the
    drafts before it, so every proposal is a run the grammar accepts from the sequence's state and some are accepted;
    the sequence's own matcher is walked by the verified tokens only (greedy: the output of decoding without
    speculation; sampled: seeded runs repeat)."""
    schema = {"type": "object", "properties": {"word": {"type": "string", "pattern": "^[a-z]{3,30}$"}},
              "required": ["word"], "additionalProperties": False}
    params = SamplingParams(temperature=temperature, seed=4, max_tokens=40,
                            structured_outputs=StructuredOutputsParams(json=schema))
    prompts = _prompts(3, seed=5)
    runs = []
    for _ in range(1 if temperature == 0 else 2):
        engine = LLMEngine(EngineConfig(str(target), progress=False, speculative_config=speculative(drafter)))
        refused = []
        inner = engine.speculator.proposer.propose

        def propose(context, requests, inner=inner, refused=refused):
            out = inner(context, requests)
            refused.extend(d.token_ids for (seq, _), d in zip(requests, out, strict=True)
                           if seq.controller.accepted_prefix(d.token_ids) < len(d.token_ids))
            return out

        engine.speculator.proposer.propose = propose
        runs.append(_generate(engine, prompts, params))
        assert refused == [] and engine.speculator.stats.num_accepted_tokens > 0
        assert all(isinstance(json.loads(engine.tokenizer.decode(r)), dict) for r in runs[-1])
    if temperature == 0:
        assert runs[0] == _generate(LLMEngine(EngineConfig(str(target), progress=False)), prompts, params)
    else:
        assert runs[0] == runs[1]
