"""`LLM.generate` against the reference's greedy `generate` and logprobs (float32, tiny random models)."""

from __future__ import annotations

import pytest
import torch
from oracle import reference_greedy, reference_logits, reference_model

from glimmer import LLM, SamplingParams
from glimmer.tiny import TinySpec

NEW_TOKENS = 72


@pytest.fixture(scope="module")
def checkpoint(make_tiny):
    # window 16 so prompt + generation crosses it several times
    return make_tiny(spec=TinySpec(sliding_window=16), seed=11)


@pytest.fixture(scope="module")
def llm(checkpoint):
    return LLM(str(checkpoint), progress=False)


@pytest.fixture(scope="module")
def reference(checkpoint):
    return reference_model(checkpoint)


def _prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(5)
    return [torch.randint(0, 480, (n,), generator=generator).tolist() for n in (3, 40, 17, 1, 25)]


def test_batched_greedy_generation_matches_reference_token_for_token(llm, reference):
    prompts = _prompts()
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True))
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output.token_ids == reference_greedy(reference, prompt, NEW_TOKENS, llm.engine.token_count)
        assert output.finish_reason == "length"


def test_padding_rows_of_the_vocabulary_are_never_sampled_but_keep_their_raw_logprobs(llm, reference):
    """This random model's argmax falls on a logit row past the tokenizer's ids (its vocabulary is padded to a
    multiple): such a row is no token, so Glimmer never samples it, greedy or not, while the logprobs stay those
    of the reference's whole distribution."""
    tokens = llm.engine.token_count
    vocab = llm.engine.model_config.text.vocab_size
    assert tokens < vocab
    prompts = _prompts()
    # the case this test is about occurs (the reference's unmasked greedy run of each prompt, up to the first that
    # shows it)
    assert any(t >= tokens for prompt in prompts for t in reference_greedy(reference, prompt, NEW_TOKENS))
    for params in (SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True),
                   SamplingParams(temperature=50.0, max_tokens=NEW_TOKENS, ignore_eos=True, seed=3)):
        for output in llm.generate(prompts, params):
            assert max(output.token_ids) < tokens
    prompt = prompts[1]
    output = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8, logprobs=0, ignore_eos=True))[0]
    expected = torch.log_softmax(reference_logits(reference, prompt + output.token_ids), dim=-1)
    for step, entry in enumerate(output.logprobs):
        assert abs(entry.logprob - expected[len(prompt) - 1 + step][entry.token_id].item()) < 1e-4


def test_logprobs_match_reference(llm, reference):
    prompt = _prompts()[1]
    output = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=20, logprobs=5, ignore_eos=True))[0]
    full = prompt + output.token_ids
    expected = torch.log_softmax(reference_logits(reference, full), dim=-1)
    assert len(output.logprobs) == 20
    for step, entry in enumerate(output.logprobs):
        row = expected[len(prompt) - 1 + step]
        assert entry.token_id == output.token_ids[step]
        assert abs(entry.logprob - row[entry.token_id].item()) < 1e-4
        # the alternatives are among the tokenizer's ids: the vocabulary's padding rows are no token
        top_values, top_ids = row[: llm.engine.token_count].topk(5)
        assert list(entry.top) == top_ids.tolist()
        assert entry.rank == int((row[: llm.engine.token_count] >= row[entry.token_id]).sum())
        assert max(abs(entry.top[i] - v) for i, v in zip(top_ids.tolist(), top_values.tolist(), strict=True)) < 1e-4


def test_generation_is_identical_one_at_a_time_and_batched(llm):
    prompts = _prompts()
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    batched = [o.token_ids for o in llm.generate(prompts, params)]
    single = [llm.generate([p], params)[0].token_ids for p in prompts]
    assert batched == single


def _penalized_reference_greedy(reference, prompt: list[int], max_new_tokens: int, token_count: int,
                                params: SamplingParams, swapped: bool = False,
                                until_it_leaves: list[int] | None = None) -> list[int]:
    """Greedy decoding of the reference's logits moved as vLLM (and OpenAI) define it, written out plainly: the
    logit bias first; the repetition penalty over every id of the prompt and the output (a positive logit divided,
    a negative one multiplied); the frequency and presence penalties over the output's ids only, by their count.
    `swapped`: the wrong reading, which ids count swapped (the repetition penalty over the output's, the frequency
    and presence penalties over the prompt's too). `until_it_leaves`: the run ends at its first token that differs
    from that list's, whose later tokens cannot make it equal."""
    output: list[int] = []
    for step in range(max_new_tokens):
        if until_it_leaves is not None and output != until_it_leaves[:step]:
            break
        logits = reference_logits(reference, prompt + output)[-1].clone()
        for token_id, bias in (params.logit_bias or {}).items():
            logits[token_id] += bias
        for token_id in set(output) if swapped else set(prompt) | set(output):
            value = logits[token_id]
            logits[token_id] = value / params.repetition_penalty if value > 0 else value * params.repetition_penalty
        counted = prompt + output if swapped else output
        for token_id in set(counted):
            logits[token_id] -= params.frequency_penalty * counted.count(token_id) + params.presence_penalty
        output.append(int(logits[:token_count].argmax()))
    return output


@pytest.fixture(scope="module")
def penalty_prompt(llm, reference) -> list[int]:
    """A prompt that ends with its own greedy continuation, so that the ids it holds are ones the model would
    choose."""
    prompt = _prompts()[2]
    return prompt + reference_greedy(reference, prompt, 12, llm.engine.token_count)


@pytest.mark.parametrize("penalties", [
    {"repetition_penalty": 1.8}, {"repetition_penalty": 0.6}, {"presence_penalty": 1.5},
    {"frequency_penalty": 0.9}, {"presence_penalty": -1.0, "frequency_penalty": -0.5},
    {"repetition_penalty": 1.3, "presence_penalty": 0.7, "frequency_penalty": 0.4, "logit_bias": {5: 6.0, 77: -3.0}}])
def test_greedy_penalties_and_logit_bias_move_the_reference_logits_as_vllm_defines_them(llm, reference, penalty_prompt,
                                                                                        penalties):
    """Which ids count is what these check: the prompt's only for the repetition penalty; raw logprobs stay the
    reference's own distribution whatever moved the logits the token was chosen from."""
    tokens = llm.engine.token_count
    prompt = penalty_prompt
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=0, **penalties)
    output = llm.generate([prompt], params)[0]
    assert output.token_ids == _penalized_reference_greedy(reference, prompt, 24, tokens, params)
    # this case tells the two readings apart, so the check above could fail
    assert output.token_ids != _penalized_reference_greedy(reference, prompt, 24, tokens, params, swapped=True,
                                                           until_it_leaves=output.token_ids)
    expected = torch.log_softmax(reference_logits(reference, prompt + output.token_ids), dim=-1)
    for step, entry in enumerate(output.logprobs):
        assert abs(entry.logprob - expected[len(prompt) - 1 + step][entry.token_id].item()) < 1e-4
