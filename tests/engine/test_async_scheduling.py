"""Async scheduling: a step's text is made while the next step runs (coalesced deltas: test_delta_coalescing.py)."""

from __future__ import annotations

import pytest
import torch

from glimmer import LLM, SamplingParams
from glimmer.engine.llm_engine import StepError


@pytest.fixture(scope="module")
def engines(tiny_checkpoint, same_cpu_kernels_in_module):
    # outputs are compared exactly, logprobs included: both engines compute with the same CPU kernels
    return {mode: LLM(str(tiny_checkpoint), progress=False, async_scheduling=mode) for mode in (False, True)}


def _prompts(count: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(5)
    return [torch.randint(1, 480, (int(n),), generator=generator).tolist()
            for n in torch.randint(3, 40, (count,), generator=generator)]


def _outputs(results) -> list[list[tuple]]:
    return [[(o.token_ids, o.text, o.finish_reason, o.stop_reason,
              [(lp.token_id, lp.logprob, lp.top) for lp in o.logprobs or []]) for o in r.outputs]
            for r in results]


def test_async_scheduling_on_and_off_give_identical_outputs(engines):
    prompts = _prompts(8)
    free_running = engines[False].generate(prompts, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    # stop strings that occur mid-way through the free-running texts, so they end those completions early
    stops = [[r.text[12:15]] if len(r.text) > 20 else [] for r in free_running]
    params = [
        SamplingParams(temperature=0, max_tokens=30, stop=stops[0]),
        SamplingParams(temperature=0, max_tokens=30, stop=stops[1], include_stop_str_in_output=True, logprobs=2),
        SamplingParams(temperature=0.9, seed=3, n=2, max_tokens=25, stop=stops[2]),
        SamplingParams(temperature=0, max_tokens=7),
        SamplingParams(temperature=1.0, seed=4, top_k=20, min_tokens=5, max_tokens=20, repetition_penalty=1.3,
                       presence_penalty=0.5),
        SamplingParams(temperature=0, max_tokens=0),
        SamplingParams(temperature=0, max_tokens=18, stop_token_ids=[free_running[6].token_ids[9]]),
        SamplingParams(temperature=0, max_tokens=30, stop=stops[7] + ["zzz"], ignore_eos=True),
    ]
    sync = engines[False].generate(prompts, params)
    overlapped = engines[True].generate(prompts, params)
    assert _outputs(overlapped) == _outputs(sync)
    # the stop strings and the stop id did end completions early, so the dropped-token path ran
    assert sum(o.stop_reason in (s[0] if s else None for s in stops) for r in sync for o in r.outputs) >= 3
    assert sync[6].outputs[0].stop_reason == free_running[6].token_ids[9]
    for llm in engines.values():
        assert not llm.engine.has_unfinished_requests
        assert all(used == 0 for used, _ in llm.engine.kv.usage().values())


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_max_tokens_0_samples_nothing_when_its_last_step_computes_one_token(engines, async_scheduling):
    """A one-token prompt, and a prompt whose prefix-cache hit leaves one token to compute: a one-token step, which
    must not run ahead (it sampled a token when it did)."""
    llm = engines[async_scheduling]
    prompt = list(range(100, 133))  # 33 tokens: sent again, 32 come from the cache
    cached = []
    for request in ([7], prompt, prompt):
        result = llm.generate([request], SamplingParams(max_tokens=0))[0]
        (output,) = result.outputs
        assert output.token_ids == [] and output.text == "" and output.finish_reason == "length"
        cached.append(result.num_cached_tokens)
    assert cached[1:] == [0, 32]
    assert not llm.engine.has_unfinished_requests


def test_async_scheduling_releases_a_steps_text_during_the_next_step(engines):
    prompt = _prompts(1)[0]
    released = {}
    for mode, llm in engines.items():
        engine = llm.engine
        engine.add_request(f"lag-{mode}", prompt, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
        per_step = []
        while engine.has_unfinished_requests:
            per_step.append([d.token_ids for d in engine.step()])
        released[mode] = per_step
    assert [len(deltas) for deltas in released[False]] == [1, 1, 1]
    # the same tokens, one step later: the first step yields nothing, a last step only releases text
    assert released[True] == [[]] + released[False]


def test_abort_keeps_other_requests_pending_text(engines):
    engine = engines[True].engine
    prompts = _prompts(2)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    reference = engines[False].generate([prompts[1]], params)[0].token_ids
    engine.add_request("keep", prompts[1], params)
    engine.add_request("drop", prompts[0], params)
    tokens: dict[str, list[int]] = {"keep": [], "drop": []}
    for _ in range(3):
        for delta in engine.step():
            tokens[delta.request_id].extend(delta.token_ids)
    aborted = engine.abort("drop")
    assert [d.finish_reason for d in aborted] == ["abort"]
    while engine.has_unfinished_requests:
        for delta in engine.step():
            assert delta.request_id == "keep"  # the aborted request's unreleased token is dropped
            tokens[delta.request_id].extend(delta.token_ids)
    assert tokens["keep"] == reference


def test_a_failing_step_still_delivers_the_text_it_released(engines, monkeypatch):
    engine = engines[True].engine
    prompts = _prompts(2)
    engine.add_request("short", prompts[0], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    engine.add_request("long", prompts[1], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert engine.step() == []  # both sampled; "short" finished by length, its text not released yet

    def broken_sampler(*args, **kwargs):
        raise RuntimeError("sampler failed")

    monkeypatch.setattr("glimmer.engine.llm_engine.sample", broken_sampler)
    monkeypatch.setattr("glimmer.engine.llm_engine.sample_on_device", broken_sampler)  # a step launched ahead
    with pytest.raises(StepError) as failure:
        engine.step()
    assert failure.value.whole_batch and failure.value.request_ids == ["long"]
    assert [(d.request_id, d.finish_reason) for d in failure.value.deltas] == [("short", "length")]
    engine.abort("long")
    assert not engine.has_unfinished_requests
