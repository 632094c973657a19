"""Prompt scoring: `SamplingParams(prompt_logprobs=k)` and `max_tokens=0`, against the reference (float32).

Every prompt position's logits are computed even when the prompt spans several prefill chunks, and a prompt
whose blocks sit in the prefix cache is computed again (cached blocks carry no logits).
"""

from __future__ import annotations

import pytest
import torch
from oracle import reference_logits, reference_model

from glimmer import LLM, SamplingParams
from glimmer.tiny import TinySpec

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def checkpoint(make_tiny):
    return make_tiny(spec=TinySpec(sliding_window=16), seed=11)


@pytest.fixture(scope="module")
def reference(checkpoint):
    return reference_model(checkpoint)


def _prompt(n: int, seed: int = 3) -> list[int]:
    return torch.randint(0, 480, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _check_against_reference(reference, prompt, scored, k, token_count):
    """`token_count`: the tokenizer's ids; the vocabulary's padding rows are no alternative and take no rank."""
    expected = torch.log_softmax(reference_logits(reference, prompt), dim=-1)
    assert scored[0] is None  # nothing predicts the first token
    assert len(scored) == len(prompt)
    for position in range(1, len(prompt)):
        entry, row = scored[position], expected[position - 1]
        assert entry.token_id == prompt[position]
        assert abs(entry.logprob - row[prompt[position]].item()) < TOLERANCE
        assert entry.rank == int((row[:token_count] >= row[prompt[position]]).sum())
        top_values, top_ids = row[:token_count].topk(k)
        assert list(entry.top) == top_ids.tolist()
        for i, value in zip(top_ids.tolist(), top_values.tolist(), strict=True):
            assert abs(entry.top[i] - value) < TOLERANCE


@pytest.mark.parametrize("max_num_batched_tokens", [2048, 7])
def test_prompt_logprobs_match_the_reference_also_across_prefill_chunks(checkpoint, reference, max_num_batched_tokens):
    llm = LLM(str(checkpoint), progress=False, max_num_batched_tokens=max_num_batched_tokens)
    prompt = _prompt(40)
    output = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=4,
                                                   ignore_eos=True))[0]
    _check_against_reference(reference, prompt, output.prompt_logprobs, 4, llm.engine.token_count)
    assert len(output.token_ids) == 3
    # a generated token's logprob entry has its rank too: 1 for a greedy choice
    generated = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=3, logprobs=2, ignore_eos=True))[0]
    assert [entry.rank for entry in generated.outputs[0].logprobs] == [1, 1, 1]


def test_a_cached_prompt_is_computed_again_for_its_logprobs(checkpoint, reference):
    llm = LLM(str(checkpoint), progress=False, block_size=4)
    prompt = _prompt(33, seed=4)
    llm.generate([prompt], SamplingParams(temperature=0, max_tokens=2))
    assert llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1))[0].num_cached_tokens > 0
    scored = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=2))[0]
    assert scored.num_cached_tokens == 0
    _check_against_reference(reference, prompt, scored.prompt_logprobs, 2, llm.engine.token_count)


def test_max_tokens_zero_scores_the_prompt_and_generates_nothing(checkpoint, reference):
    llm = LLM(str(checkpoint), progress=False, max_model_len=40)
    prompt = _prompt(40, seed=5)  # fills the context: nothing would fit after it
    output = llm.generate([prompt], SamplingParams(max_tokens=0, prompt_logprobs=0))[0]
    assert (output.token_ids, output.text, output.finish_reason) == ([], "", "length")
    _check_against_reference(reference, prompt, output.prompt_logprobs, 0, llm.engine.token_count)
    assert llm.generate([prompt[:5]], SamplingParams(max_tokens=0))[0].prompt_logprobs is None


def test_requests_without_prompt_logprobs_have_none_and_still_use_the_prefix_cache(checkpoint):
    llm = LLM(str(checkpoint), progress=False, block_size=4)
    prompt = _prompt(20, seed=6)
    llm.generate([prompt], SamplingParams(max_tokens=1))
    again = llm.generate([prompt], SamplingParams(max_tokens=1))[0]
    assert again.prompt_logprobs is None and again.num_cached_tokens > 0
