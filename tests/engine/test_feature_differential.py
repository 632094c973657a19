"""Differential safety net: the same seeded requests, over random combinations of the request features, through
plain decoding and DFlash speculative decoding, batched and one at a time.

Greedy requests must give the same token ids, text, finish and stop reasons and logprobs with speculation as
without (issue 10). Seeded sampled requests are compared within one engine only (batched against alone): the
rejection sampler draws its uniforms and its residual samples from the request's generator in an order plain
decoding does not, so a seeded run with speculation follows the target distribution (test_spec_decode.py checks it
statistically) without repeating plain decoding's tokens; vLLM's seeded requests behave the same. Proposals come
from `ReplayProposer` replaying the plain run with mistakes on a schedule, so full, partial and zero acceptance all
happen (a random tiny drafter agrees with a random tiny target too rarely).

Logprobs: the token, its rank and the top ids must match; the values may differ by float32 rounding (a verification
computes k + 1 positions in one forward, a batch has other matmul shapes), within 1e-4.
"""

from __future__ import annotations

import random

import pytest
import torch
from spec_support import DRAFTER, TARGET, K, record_drafts

from glimmer import LLM, SamplingParams
from glimmer.engine.proposers import ReplayProposer, cycling_acceptance
from glimmer.engine.sampling_params import StructuredOutputsParams
from glimmer.tiny import write_tiny_drafter

CASES = 10
LOGPROB_TOLERANCE = 1e-4
SCHEMA = {"type": "object", "properties": {"word": {"type": "string", "pattern": "^[a-z]{2,12}$"}},
          "required": ["word"], "additionalProperties": False}


@pytest.fixture(scope="module")
def checkpoints(make_tiny, tmp_path_factory):
    """test_spec_decode.py's target and drafter: (target, drafter) directories."""
    target = make_tiny(spec=TARGET, seed=21)
    return target, write_tiny_drafter(tmp_path_factory.mktemp("drafter"), target, seed=5, spec=DRAFTER)


@pytest.fixture(scope="module")
def plain(checkpoints, same_cpu_kernels_in_module):
    return LLM(str(checkpoints[0]), progress=False, enable_prefix_caching=False)


@pytest.fixture(scope="module")
def speculating(checkpoints, same_cpu_kernels_in_module):
    """An engine with the drafter whose proposals replay `known` (prompt -> the plain run's first output), right
    K, 0, 2 or 1 tokens of K at a time per sequence; `known` is filled by each test before it runs."""
    target, drafter = checkpoints
    llm = LLM(str(target), progress=False, enable_prefix_caching=False,
              speculative_config={"method": "dflash", "model": str(drafter), "draft_policy": "always"})
    known: dict[tuple[int, ...], list[int]] = {}
    spec = llm.engine.speculator
    spec.proposer = ReplayProposer(lambda seq: known.get(tuple(seq.prompt_token_ids)),
                                   cycling_acceptance(K, 0, 2, 1),
                                   llm.engine.model_config.text.vocab_size, K, inner=spec.proposer)
    llm.known = known
    return llm


def _prompts(count: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 480, (int(n),), generator=generator).tolist()
            for n in torch.randint(4, 60, (count,), generator=generator)]


def _greedy_cases(plain: LLM, seed: int) -> list[tuple[list[int], SamplingParams, str]]:
    """CASES random combinations of the features, each on a prompt of its own, with stop strings, stop ids and bad
    words taken from the prompt's free greedy run so that they are met (overlapping stop strings among them)."""
    rng = random.Random(seed)
    prompts = _prompts(CASES, seed)
    free = plain.generate(prompts, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    tokenizer = plain.get_tokenizer()
    cases = []
    for prompt, run in zip(prompts, free, strict=True):
        tokens, text = run.outputs[0].token_ids, run.outputs[0].text
        options: dict = {"temperature": 0, "max_tokens": rng.choice([1, 7, 24, 40]), "ignore_eos": rng.random() < 0.7}
        chosen = []
        # a grammar is refused beside min_tokens and bad_words (it decides the end, it could force a banned token)
        structured = rng.random() < 0.25
        if structured:
            options |= {"structured_outputs": StructuredOutputsParams(json=SCHEMA), "max_tokens": 40}
            chosen.append("json-schema")
        if rng.random() < 0.5 and len(text) > 12:
            start = rng.randrange(2, len(text) - 8)
            # two stops that overlap: the one that ends first in the text wins
            options["stop"] = [text[start:start + 5], text[start + 2:start + 4]]
            options["include_stop_str_in_output"] = rng.random() < 0.5
            chosen.append("stop-strings" + ("+included" if options["include_stop_str_in_output"] else ""))
        if rng.random() < 0.4:
            options["stop_token_ids"] = [tokens[rng.randrange(3, 30)]]
            chosen.append("stop-ids")
        if rng.random() < 0.4 and not structured:
            options["min_tokens"] = min(rng.randrange(1, 12), options["max_tokens"])
            chosen.append("min-tokens")
        if rng.random() < 0.4:
            options |= {"repetition_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.3}
            chosen.append("penalties")
        if rng.random() < 0.3 and not structured:
            word = tokenizer.decode(tokens[rng.randrange(2, 20):][:2])
            if word.strip():
                options["bad_words"] = [word.strip()]
                chosen.append("bad-words")
        if rng.random() < 0.6:
            options["logprobs"] = rng.choice([0, 2, 5])
            chosen.append("logprobs")
        if rng.random() < 0.3:
            options["prompt_logprobs"] = rng.choice([0, 3])
            chosen.append("prompt-logprobs")
        if rng.random() < 0.25:
            options["skip_special_tokens"] = False
            chosen.append("special-tokens-kept")
        if rng.random() < 0.25:
            options["n"] = 2
            chosen.append("n=2")
        cases.append((prompt, SamplingParams(**options), "+".join(chosen) or "plain"))
    return cases


def _assert_logprobs_match(got, expected, where: str) -> None:
    assert (got is None) == (expected is None), where
    if got is None:
        return
    assert len(got) == len(expected), where
    for mine, theirs in zip(got, expected, strict=True):
        assert (mine is None) == (theirs is None), where
        if mine is None:
            continue
        assert (mine.token_id, mine.rank, list(mine.top)) == (theirs.token_id, theirs.rank, list(theirs.top)), where
        assert abs(mine.logprob - theirs.logprob) < LOGPROB_TOLERANCE, where
        for top_id, logprob in mine.top.items():
            assert abs(logprob - theirs.top[top_id]) < LOGPROB_TOLERANCE, where


def _assert_same(got, expected, where: str) -> None:
    """Two RequestOutputs of the same request: every completion's tokens, text, finish, stop and logprobs."""
    assert len(got.outputs) == len(expected.outputs), where
    for mine, theirs in zip(got.outputs, expected.outputs, strict=True):
        assert (mine.token_ids, mine.text, mine.finish_reason, mine.stop_reason) == (
            theirs.token_ids, theirs.text, theirs.finish_reason, theirs.stop_reason), where
        _assert_logprobs_match(mine.logprobs, theirs.logprobs, where)
    _assert_logprobs_match(got.prompt_logprobs, expected.prompt_logprobs, where)


@pytest.mark.parametrize("seed", [3, 8, 19])
def test_greedy_feature_combinations_match_with_speculation_and_batched_as_alone(plain, speculating, seed):
    cases = _greedy_cases(plain, seed)
    prompts = [prompt for prompt, _, _ in cases]
    params = [p for _, p, _ in cases]
    alone = [plain.generate([prompt], p)[0] for prompt, p in zip(prompts, params, strict=True)]
    speculating.known |= {tuple(prompt): out.outputs[0].token_ids for prompt, out in zip(prompts, alone, strict=True)}
    accepted_before = speculating.engine.speculator.stats.num_accepted_tokens
    runs = {"plain-batched": plain.generate(prompts, params),
            "spec-batched": speculating.generate(prompts, params),
            "spec-alone": [speculating.generate([prompt], p)[0] for prompt, p in zip(prompts, params, strict=True)]}
    for name, outputs in runs.items():
        for (_, _, features), got, expected in zip(cases, outputs, alone, strict=True):
            _assert_same(got, expected, f"{name}: {features}")
    assert speculating.engine.speculator.stats.num_accepted_tokens > accepted_before
    finishes = {o.finish_reason for out in alone for o in out.outputs}
    assert finishes == {"stop", "length"}  # both ends are exercised


def test_seeded_sampled_requests_repeat_batched_as_alone_with_and_without_speculation(plain, speculating):
    """Seeded sampling (n = 2, top-p, penalties, logprobs, a stop id, a JSON schema): each engine gives a request
    the same completions batched as alone. Across the two engines only greedy output is compared (module docstring)."""
    kinds = [dict(n=2, top_p=0.9, logprobs=2), dict(repetition_penalty=1.4, presence_penalty=0.6, min_tokens=3),
             dict(top_k=8, stop_token_ids=[40, 41, 42], ignore_eos=False),
             dict(structured_outputs=StructuredOutputsParams(json=SCHEMA), max_tokens=30), dict(min_p=0.05, n=2)]
    prompts = _prompts(len(kinds), seed=11)
    params = [SamplingParams(**{"temperature": 0.9, "max_tokens": 16, "ignore_eos": True, "seed": 50 + i, **kind})
              for i, kind in enumerate(kinds)]
    plain_alone = [plain.generate([prompt], p)[0] for prompt, p in zip(prompts, params, strict=True)]
    speculating.known |= {tuple(prompt): out.outputs[0].token_ids
                          for prompt, out in zip(prompts, plain_alone, strict=True)}
    spec_alone = [speculating.generate([prompt], p)[0] for prompt, p in zip(prompts, params, strict=True)]
    accepted_before = speculating.engine.speculator.stats.num_accepted_tokens
    for engine, alone in ((plain, plain_alone), (speculating, spec_alone)):
        for kind, got, expected in zip(kinds, engine.generate(prompts, params), alone, strict=True):
            _assert_same(got, expected, f"{engine is speculating}: {kind}")
    assert speculating.engine.speculator.stats.num_accepted_tokens > accepted_before


def test_tool_calls_through_chat_match_with_speculation_batched_and_alone(plain, speculating):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Oslo", "Rome"]}}, "required": ["city"]}}}]
    conversations = [[{"role": "user", "content": question}] for question in ("Weather in Oslo?", "And Rome?")]
    params = SamplingParams(temperature=0, max_tokens=60, logprobs=1)
    # no reasoning, one call and a bounded value: a random model would write on, before and after its call (P-REQ-4)
    kwargs = {"tools": tools, "tool_choice": "required", "chat_template_kwargs": {"current_date": "2026-01-01"},
              "thinking_token_budget": 0, "parallel_tool_calls": False}
    expected = [plain.chat(messages, params, **kwargs)[0] for messages in conversations]
    speculating.known |= {tuple(out.prompt_token_ids): out.outputs[0].token_ids for out in expected}
    drafts = record_drafts(speculating.engine)
    for got in (speculating.chat(conversations, params, **kwargs),
                [speculating.chat(messages, params, **kwargs)[0] for messages in conversations],
                plain.chat(conversations, params, **kwargs)):
        for mine, theirs in zip(got, expected, strict=True):
            _assert_same(mine.output, theirs.output, "chat with tools")
            # call ids are random per reply, as OpenAI's are
            calls = [[(c.name, c.arguments) for c in out.tool_calls] for out in (mine, theirs)]
            assert calls[0] == calls[1]
            assert (mine.content, mine.finish_reason) == (theirs.content, theirs.finish_reason)
    assert drafts and [(o.finish_reason, len(o.tool_calls)) for o in expected] == [("tool_calls", 1)] * 2


def test_a_continued_assistant_prefix_matches_with_speculation_batched_and_alone(plain, speculating):
    """An assistant message with "prefix": true, continued (continue_final_message), under a stop string, n = 2 and
    logprobs: the same continuation with speculation as without, batched as alone."""
    conversations = [[{"role": "user", "content": question}, {"role": "assistant", "content": start, "prefix": True}]
                     for question, start in (("Name a city.", "The city is"), ("Count to three.", "One, two"))]
    params = SamplingParams(temperature=0, max_tokens=24, n=2, logprobs=2, stop=["\n\n"])
    kwargs = {"continue_final_message": True, "add_generation_prompt": False,
              "chat_template_kwargs": {"current_date": "2026-01-01"}}
    expected = [plain.chat(messages, params, **kwargs)[0] for messages in conversations]
    speculating.known |= {tuple(out.prompt_token_ids): out.outputs[0].token_ids for out in expected}
    accepted_before = speculating.engine.speculator.stats.num_accepted_tokens
    for got in (speculating.chat(conversations, params, **kwargs),
                [speculating.chat(messages, params, **kwargs)[0] for messages in conversations]):
        for mine, theirs in zip(got, expected, strict=True):
            _assert_same(mine.output, theirs.output, "assistant prefix")
            assert (mine.content, mine.finish_reason) == (theirs.content, theirs.finish_reason)
    assert speculating.engine.speculator.stats.num_accepted_tokens > accepted_before
