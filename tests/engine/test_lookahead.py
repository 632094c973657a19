"""Lookahead (async scheduling): a plain decode step is launched before the host reads the tokens of the one
running; outputs equal synchronous stepping's (glimmer/engine/lookahead.py)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from glimmer import LLM, SamplingParams
from glimmer.tiny import TinySpec


@pytest.fixture(scope="module")
def engines(tiny_checkpoint):
    return {mode: LLM(str(tiny_checkpoint), progress=False, async_scheduling=mode) for mode in (False, True)}


def _prompts(count: int, seed: int = 11) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 480, (int(n),), generator=generator).tolist()
            for n in torch.randint(3, 50, (count,), generator=generator)]


def _outputs(results) -> list[list[tuple]]:
    """Tokens, text, finish and stop reasons, and the ids of the logprobs (their values: `_logprob_values`)."""
    return [[(o.token_ids, o.text, o.finish_reason, o.stop_reason,
              [(lp.token_id, list(lp.top)) for lp in o.logprobs or []]) for o in r.outputs]
            for r in results]


def _logprob_values(results) -> list[float]:
    return [value for r in results for o in r.outputs for lp in o.logprobs or []
            for value in (lp.logprob, *lp.top.values())]


def _same_outputs(got, expected) -> None:
    """Equal outputs; logprobs to 1e-5 (the synchronous and the lookahead engine lay out the same rows in
    different batches, and the CPU's products need not round alike: MKL's dense product picks its kernel by the
    row count, a few float32 ulps apart)."""
    assert _outputs(got) == _outputs(expected)
    torch.testing.assert_close(_logprob_values(got), _logprob_values(expected), rtol=0, atol=1e-5)


def _idle(llm: LLM) -> None:
    engine = llm.engine
    assert not engine.has_unfinished_requests
    assert engine._launched is None  # no step left running ahead, holding its sequences and logits
    assert all(used == 0 for used, _ in engine.kv.usage().values())
    assert all(seq.num_pending_tokens == 0 for seqs in engine._seqs.values() for seq in seqs)


def test_steps_run_ahead_with_the_outputs_of_synchronous_steps(engines, launches):
    prompts = _prompts(8)
    free = engines[False].generate(prompts, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    # a stop id allowed from exactly min_tokens on: the first token of the free run not seen before it
    greedy5 = free[5].outputs[0].token_ids
    at = next(j for j in range(4, 40) if greedy5[j] not in greedy5[:j])
    stops = [[r.outputs[0].text[10:13]] if len(r.outputs[0].text) > 16 else [] for r in free]
    params = [
        SamplingParams(temperature=0, max_tokens=40, stop=stops[0], logprobs=3),
        SamplingParams(temperature=0.8, seed=1, top_k=30, top_p=0.9, max_tokens=33, ignore_eos=True, logprobs=0),
        SamplingParams(temperature=1.0, seed=2, n=2, min_p=0.05, max_tokens=29, stop=stops[2]),
        SamplingParams(temperature=0, max_tokens=1),
        SamplingParams(temperature=0, max_tokens=2),
        # the stop id is banned below min_tokens: the count includes the token still on the device
        SamplingParams(temperature=0, max_tokens=40, min_tokens=at, stop_token_ids=[greedy5[at]]),
        SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[free[6].outputs[0].token_ids[12]]),
        SamplingParams(temperature=0, max_tokens=37, stop=stops[7] + ["zz"], include_stop_str_in_output=True),
    ]
    sync = engines[False].generate(prompts, params)
    ahead = engines[True].generate(prompts, params)
    _same_outputs(ahead, sync)
    assert launches["steps"] > 20 and launches["rows"] > 100
    assert launches["rows_past_max_tokens"] == 0
    assert len(ahead[0].outputs[0].logprobs) == len(ahead[0].outputs[0].token_ids)
    assert all(len(lp.top) == 3 for lp in ahead[0].outputs[0].logprobs)
    # banned below min_tokens (never chosen there anyway), allowed and chosen at exactly min_tokens
    assert sync[5].outputs[0].token_ids == greedy5[: at + 1] and sync[5].outputs[0].finish_reason == "stop"
    assert len(sync[6].outputs[0].token_ids) == 13  # ended by its stop id mid-way
    assert sum(o.finish_reason == "stop" and isinstance(o.stop_reason, str) for r in sync for o in r.outputs) >= 2
    for llm in engines.values():
        _idle(llm)


def test_requests_that_arrive_while_steps_run_ahead_join_and_hit_the_prefix_cache(engines, launches):
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    first, joining = _prompts(3, seed=21), _prompts(2, seed=22)
    reference = engines[False].generate(first + joining, params)
    engine = engines[True].engine
    tokens: dict[str, list[int]] = {}
    for i, prompt in enumerate(first):
        engine.add_request(f"early-{i}", prompt, params)
    steps = 0
    while engine.has_unfinished_requests:
        if steps == 8:  # mid-way: the early ones run ahead when these arrive
            assert engine._launched is not None
            for i, prompt in enumerate(joining):
                engine.add_request(f"late-{i}", prompt, params)
        for delta in engine.step():
            tokens.setdefault(delta.request_id, []).extend(delta.token_ids)
        steps += 1
    names = [f"early-{i}" for i in range(3)] + [f"late-{i}" for i in range(2)]
    assert [tokens[name] for name in names] == [r.outputs[0].token_ids for r in reference]
    # prompts extending the early ones with what they generated: their blocks were written by steps run ahead
    extended = [p + r.outputs[0].token_ids[:20] + [7, 8, 9] for p, r in zip(first, reference[:3], strict=True)]
    hits = engines[True].generate(extended, params)
    _same_outputs(hits, engines[False].generate(extended, params))
    assert all(r.num_cached_tokens > len(p) for r, p in zip(hits, first, strict=True))
    assert launches["steps"] > 20
    _idle(engines[True])


@pytest.mark.parametrize("penalties", [{}, {"frequency_penalty": -1.0, "presence_penalty": 0.5}])
def test_abort_while_a_step_runs_ahead(engines, launches, penalties):
    """With penalties too (their step runs ahead counting the token on its way): the dropped request's blocks come
    back and the other's tokens are those of the synchronous engine."""
    engine = engines[True].engine
    prompts = _prompts(2, seed=31)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, **penalties)
    reference = engines[False].generate([prompts[0]], params)[0].outputs[0].token_ids
    engine.add_request("keep", prompts[0], params)
    engine.add_request("drop", prompts[1], params)
    tokens: dict[str, list[int]] = {"keep": [], "drop": []}
    for _ in range(4):
        for delta in engine.step():
            tokens[delta.request_id].extend(delta.token_ids)
    assert engine._launched is not None and len(engine._launched.step.seqs) == 2
    assert [d.finish_reason for d in engine.abort("drop")] == ["abort"]
    while engine.has_unfinished_requests:
        for delta in engine.step():
            assert delta.request_id == "keep"  # the aborted request's row in the running step is dropped
            tokens[delta.request_id].extend(delta.token_ids)
    assert tokens["keep"] == reference
    assert 0 < len(tokens["drop"]) < 12
    _idle(engines[True])


@pytest.mark.parametrize("ending", ["stop id", "abort"])
def test_a_step_run_ahead_past_the_end_of_the_last_request_is_read_before_the_engine_is_idle(engines, ending):
    """The step launched ahead for a request that a stop id ends, or that is aborted, while it runs is read before the
    engine says no work is left: an idle engine kept it, and with it the request's sequence and the step's logits,
    until the next request came."""
    prompt = _prompts(1, seed=51)[0]
    free = engines[False].generate([prompt], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    greedy = free[0].outputs[0].token_ids
    at = next(j for j in range(4, 20) if greedy[j] not in greedy[:j])
    engine = engines[True].engine
    stop = [greedy[at]] if ending == "stop id" else []
    engine.add_request("last", prompt, SamplingParams(temperature=0, max_tokens=20, stop_token_ids=stop,
                                                      ignore_eos=not stop))
    seq = weakref.ref(engine._seqs["last"][0])
    tokens = []
    while engine.has_unfinished_requests:
        tokens += [token for delta in engine.step() for token in delta.token_ids]
        if ending == "abort" and len(tokens) == at and "last" in engine._seqs:
            assert engine._launched is not None
            engine.abort("last")
    assert tokens == greedy[: at + 1 if stop else at]
    _idle(engines[True])
    gc.collect()
    assert seq() is None


def test_penalized_steps_run_ahead_and_count_the_token_on_its_way(engines, launches, monkeypatch):
    """Penalties need every output token, and a step run ahead samples before the host has the one on its way:
    it counts that token on the device (`pending`). The outputs equal the synchronous engine's; without the
    pending token they would not (negative penalties reward the last token, which only the pending one is)."""
    import glimmer.engine.sampler as sampler

    prompts = _prompts(3, seed=41)
    sampled = SamplingParams(temperature=1.0, seed=3, max_tokens=24, repetition_penalty=1.3, ignore_eos=True)
    greedy = SamplingParams(temperature=0, max_tokens=24, frequency_penalty=-1.5, presence_penalty=-0.5, logprobs=1,
                            ignore_eos=True)
    plain = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    references = {}
    for name, params in (("sampled", sampled), ("greedy", greedy), ("mixed", [greedy, plain, sampled])):
        references[name] = engines[False].generate(prompts, params)
        _same_outputs(engines[True].generate(prompts, params), references[name])
    assert launches["steps"] > 20
    counted = sampler._apply_penalties
    monkeypatch.setattr(sampler, "_apply_penalties", lambda logits, rows, pending=None: counted(logits, rows))
    unaware = engines[True].generate(prompts, greedy)
    assert [r.outputs[0].token_ids for r in unaware] != [r.outputs[0].token_ids for r in references["greedy"]]
    _idle(engines[True])


def test_a_step_run_ahead_that_finds_the_kv_pools_short_lets_the_scheduler_preempt(make_tiny, launches,
                                                                                   same_cpu_kernels):
    """Two sequences outgrow a 12-block full-attention pool with nothing waiting: the step planned ahead cannot
    get its blocks, so the running step is read first and the scheduler preempts; outputs are unchanged."""
    checkpoint = make_tiny(spec=TinySpec(sliding_window=16), seed=21)
    prompts = [list(range(100, 160)), list(range(200, 255))]
    params = SamplingParams(temperature=0, max_tokens=70, ignore_eos=True)
    outputs = {}
    refused_ahead = []
    for mode in (False, True):
        llm = LLM(str(checkpoint), progress=False, async_scheduling=mode, kv_cache_memory=200_000, max_num_seqs=2,
                  max_num_batched_tokens=32, max_model_len=160)
        engine = llm.engine
        assert engine.kv_layout.num_pages == 24
        plan, allocate = engine._successor, engine.kv.try_allocate
        planning = []

        def try_allocate(seq, n, allocate=allocate, planning=planning):
            granted = allocate(seq, n)
            if planning and not granted:
                refused_ahead.append(seq.request_id)
            return granted

        def successor(launched, plan=plan, planning=planning):
            planning.append(True)
            try:
                return plan(launched)
            finally:
                planning.clear()

        engine.kv.try_allocate, engine._successor = try_allocate, successor
        outputs[mode] = [o.token_ids for o in llm.generate(prompts, params)]
        assert engine.scheduler.num_preemptions > 0
        _idle(llm)
    assert outputs[True] == outputs[False]
    assert refused_ahead and launches["steps"] > 20


def test_image_prompts_decode_ahead_with_the_outputs_of_synchronous_steps(make_tiny, launches):
    from PIL import Image

    checkpoint = make_tiny(vision=True, seed=17)
    pixels = torch.Generator().manual_seed(3)
    images = [Image.fromarray(torch.randint(0, 256, (h, 120, 3), generator=pixels, dtype=torch.uint8).numpy())
              for h in (90, 60)]
    prompts = [{"prompt": "<|begin_of_text|>Look: <|patch|> What is it?", "multi_modal_data": {"image": image}}
               for image in images] + [[5, 6, 7] * 5]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    sync, ahead = (LLM(str(checkpoint), progress=False, async_scheduling=mode).generate(prompts, params)
                   for mode in (False, True))
    _same_outputs(ahead, sync)
    assert launches["steps"] > 10
