"""Sampling parameters, the sampler, stop handling and seeds."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glimmer import LLM, SamplingParams
from glimmer.engine.sampler import SamplingRow, sample, seeded_generator
from glimmer.engine.sampling_params import (
    GREEDY_TEMPERATURE,
    MAX_TEMPERATURE,
    REPETITION_PENALTY_RANGE,
    StructuredOutputsParams,
)
from glimmer.engine.stop_strings import StopStringMatcher
from glimmer.errors import ConfigError, RequestError

# the engines here sample; which CPU kernels compute their logits is not what they check, so the kernels their load
# would time are fixed (conftest.py)
pytestmark = pytest.mark.usefixtures("same_cpu_kernels")


@pytest.fixture(scope="module")
def llm(tiny_checkpoint, same_cpu_kernels_in_module):
    return LLM(str(tiny_checkpoint), progress=False)


@pytest.mark.parametrize(
    ("field", "value"),
    [("temperature", -1), ("temperature", float("nan")), ("top_p", 0), ("top_p", 1.5), ("top_k", -2),
     ("min_p", 2), ("max_tokens", -1), ("max_tokens", 2.5), ("prompt_logprobs", 21), ("logprobs", 21),
     ("presence_penalty", 3),
     ("frequency_penalty", -2.5), ("repetition_penalty", 0), ("n", 0), ("seed", "x"), ("stop", [""]),
     ("stop_token_ids", [-1]), ("min_tokens", -1), ("cache_salt", ""), ("cache_salt", 7),
     ("temperature", 3.5e38), ("temperature", 1e300), ("repetition_penalty", 1e-39), ("repetition_penalty", 1e39),
     ("allowed_token_ids", []), ("allowed_token_ids", [-1]), ("allowed_token_ids", [2.0]), ("allowed_token_ids", 5)],
)
def test_invalid_sampling_params_name_the_field(field, value):
    with pytest.raises(RequestError) as err:
        SamplingParams(**{field: value})
    assert err.value.param == field and field in str(err.value)


def _row(**kwargs) -> SamplingRow:
    return SamplingRow(SamplingParams(**kwargs), [], [], torch.Generator().manual_seed(0))


def test_top_k_top_p_and_min_p_restrict_the_draw():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    for _ in range(50):
        assert sample(logits, [_row(top_k=2)]).token_ids[0] in (0, 1)
        assert sample(logits, [_row(top_p=0.7)]).token_ids[0] in (0, 1)
        assert sample(logits, [_row(min_p=0.5)]).token_ids[0] in (0, 1)
        assert sample(logits, [_row(top_p=0.1)]).token_ids[0] == 0


def test_a_top_k_far_beyond_the_vocabulary_keeps_every_token():
    """Issue 8: top_k = 2**63 overflowed int64 inside the sampler and stopped the engine."""
    logits = torch.log(torch.tensor([[0.25, 0.25, 0.25, 0.25]]))
    row = _row(top_k=2**63, top_p=0.99)
    seen = {sample(logits, [row]).token_ids[0] for _ in range(200)}
    assert seen == {0, 1, 2, 3}


def test_sampling_follows_the_distribution():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]]))
    row = _row(temperature=1.0)
    counts = [0, 0, 0]
    for _ in range(2000):
        counts[sample(logits, [row]).token_ids[0]] += 1
    assert abs(counts[0] / 2000 - 0.7) < 0.05 and abs(counts[2] / 2000 - 0.1) < 0.03


def test_penalties_change_the_greedy_choice():
    logits = torch.tensor([[2.0, 1.9, 0.0]])
    assert sample(logits, [_row(temperature=0)]).token_ids == [0]
    penalized = SamplingRow(SamplingParams(temperature=0, presence_penalty=0.5), [], [0], None)
    assert sample(logits, [penalized]).token_ids == [1]
    repeated = SamplingRow(SamplingParams(temperature=0, repetition_penalty=1.2), [0], [], None)
    assert sample(logits, [repeated]).token_ids == [1]


def test_banned_ids_exclude():
    logits = torch.tensor([[5.0, 1.0, 0.0, -1.0]])
    greedy = SamplingParams(temperature=0)
    assert sample(logits, [SamplingRow(greedy, [], [], None, banned_ids=(0,))]).token_ids == [1]


def _bitmask(allowed_per_row: list[list[int] | None], vocab: int) -> torch.Tensor:
    words = (vocab + 31) // 32
    bitmask = torch.zeros(len(allowed_per_row), words, dtype=torch.int64)
    for row, allowed in enumerate(allowed_per_row):
        for token in range(vocab) if allowed is None else allowed:
            bitmask[row, token // 32] |= 1 << (token % 32)
    # int32 words with the sign bit as bit 31, as llguidance writes them
    return torch.where(bitmask >= 2**31, bitmask - 2**32, bitmask).to(torch.int32)


def test_the_token_bitmask_constrains_its_rows_only():
    vocab = 70  # three words, the last one partial; ids 31, 32 and 63 sit at word edges and on the sign bit
    logits = torch.zeros(3, vocab)
    logits[:, 5] = 9.0
    bitmask = _bitmask([[31, 63], None, [32]], vocab)
    greedy = SamplingParams(temperature=0)
    rows = [SamplingRow(greedy, [], [], None) for _ in range(3)]
    assert sample(logits, rows, bitmask).token_ids == [31, 5, 32]
    seeded = [SamplingRow(SamplingParams(temperature=1.0), [], [], torch.Generator().manual_seed(i)) for i in range(3)]
    for _ in range(20):
        drawn = sample(logits, seeded, bitmask).token_ids
        assert drawn[0] in (31, 63) and drawn[2] == 32


def test_logprobs_are_the_raw_distribution():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    result = sample(logits, [_row(temperature=0.5, logprobs=2)])
    expected = torch.log_softmax(logits, -1)[0]
    entry = result.logprobs[0]
    assert math.isclose(entry.logprob, expected[entry.token_id].item(), abs_tol=1e-6)
    assert list(entry.top) == [2, 1]


def test_a_seed_gives_the_same_tokens_whatever_shares_the_batch(llm):
    params = SamplingParams(temperature=1.0, max_tokens=24, seed=1234, ignore_eos=True)
    alone = llm.generate(["hello there"], params)[0].token_ids
    crowd = llm.generate(["other", "hello there", "more text"],
                         [SamplingParams(temperature=1.0, max_tokens=24), params, SamplingParams(temperature=0.7)])
    assert crowd[1].token_ids == alone
    assert llm.generate(["hello there"], SamplingParams(temperature=1.0, max_tokens=24, seed=99,
                                                        ignore_eos=True))[0].token_ids != alone


def test_rows_sharing_a_generator_draw_in_one_call_and_a_seeded_row_from_its_own():
    from glimmer.engine.sampler import draw

    probs = torch.softmax(torch.randn(5, 300, generator=torch.Generator().manual_seed(3)), dim=-1)
    shared, seeded = torch.Generator().manual_seed(11), torch.Generator().manual_seed(12)
    tokens = draw(probs, [shared, seeded, shared, shared, shared]).tolist()
    noise = torch.empty_like(probs).exponential_(generator=torch.Generator().manual_seed(11))  # the whole tensor
    expected = (probs / noise).argmax(dim=-1).tolist()
    assert [tokens[i] for i in (0, 2, 3, 4)] == [expected[i] for i in (0, 2, 3, 4)]
    assert tokens[1] == draw(probs[1:2], [torch.Generator().manual_seed(12)]).item()
    # rows that each have their own generator: one call per row, as a row drawn alone
    own = [torch.Generator().manual_seed(20 + i) for i in range(3)]
    assert draw(probs[:3], own).tolist() == [
        draw(probs[i:i + 1], [torch.Generator().manual_seed(20 + i)]).item() for i in range(3)]


def test_an_exponential_draw_of_zero_never_picks_a_filtered_token(monkeypatch):
    """The race argmax(p / E) with E ~ Exp(1) meets E == 0 about once in 2**53 draws: p / 0 was NaN for a token
    filtered out (p = 0), which argmax takes as the largest. A zero draw is the dtype's smallest normal number now;
    every other draw, and so every seeded result, stays what it was."""
    from glimmer.engine.sampler import draw

    exponential = torch.Tensor.exponential_
    zero_at: list[int] = []

    def with_zeros(self, *args, **kwargs):
        exponential(self, *args, **kwargs)
        self.view(-1)[zero_at] = 0.0
        return self

    probs = torch.tensor([[0.0, 0.2, 0.5, 0.3], [0.1, 0.0, 0.0, 0.9]])
    seeded = [torch.Generator().manual_seed(5), torch.Generator().manual_seed(6)]
    unforced = draw(probs, seeded).tolist()
    monkeypatch.setattr(torch.Tensor, "exponential_", with_zeros)
    zero_at[:] = [0]  # each row's first element: row 0's token 0 is filtered out, row 1's is not
    seeded = [torch.Generator().manual_seed(5), torch.Generator().manual_seed(6)]
    first, second = draw(probs, seeded).tolist()
    assert first == unforced[0]  # was token 0, of probability 0
    assert second == 0  # a zero draw wins the race for a token of non-zero probability, as E -> 0 does
    zero_at[:] = [1, 2]  # two filtered tokens of row 1 (each row is drawn from its own generator)
    assert draw(probs[1:], [torch.Generator().manual_seed(6)]).item() == unforced[1]


def test_unseeded_requests_share_the_engine_generator_reproducibly_and_siblings_differ(tiny_checkpoint,
                                                                                     same_cpu_kernels):
    params = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True, n=2)
    runs = [LLM(str(tiny_checkpoint), seed=7, progress=False).generate(["hello there", "more"], params)
            for _ in range(2)]
    first, second = ([[c.token_ids for c in out.outputs] for out in run] for run in runs)
    assert first == second  # the same engine seed and the same schedule: the same tokens
    assert all(siblings[0] != siblings[1] for siblings in first)
    # the shared generator is not the stream of a request seeded with the engine's seed
    unseeded, seeded = LLM(str(tiny_checkpoint), seed=7, progress=False).generate(
        ["hello there"] * 2, [SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True),
                              SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True, seed=7)])
    assert unseeded.token_ids != seeded.token_ids


def test_cpu_seeds_below_2_to_the_32_keep_their_stream_and_those_beyond_get_streams_of_their_own():
    """torch's CPU generator keeps a seed's low 32 bits only: 5, 5 + 2**32 and 5 + 2**63 drew the same tokens."""
    cpu = torch.device("cpu")
    for seed in (0, 5, 2**32 - 1):
        assert torch.equal(seeded_generator(cpu, seed).get_state(), torch.Generator().manual_seed(seed).get_state())
    seeds = (5, 5 + 2**32, 5 + 2**63, 5 - 2**32, -(2**63), 2**64 - 1, 2**32)
    streams = {tuple(torch.rand(4, generator=seeded_generator(cpu, seed)).tolist()) for seed in seeds}
    assert len(streams) == len(seeds)
    again = torch.rand(4, generator=seeded_generator(cpu, 5 + 2**63)).tolist()
    assert again == torch.rand(4, generator=seeded_generator(cpu, 5 + 2**63)).tolist()


def test_seeds_that_differ_by_2_to_the_32_give_different_tokens(llm):
    def tokens(seed: int) -> list[int]:
        params = SamplingParams(temperature=1.0, max_tokens=16, seed=seed, ignore_eos=True)
        return llm.generate(["hello there"], params)[0].outputs[0].token_ids

    streams = [tuple(tokens(seed)) for seed in (5, 5 + 2**32, 5 + 2**63)]
    assert len(set(streams)) == 3
    assert tokens(5 + 2**32) == list(streams[1])


def test_engine_seeds_that_differ_by_2_to_the_32_give_unseeded_requests_different_tokens(tiny_checkpoint):
    params = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    runs = [LLM(str(tiny_checkpoint), seed=seed, progress=False).generate(["hello there"], params)[0].token_ids
            for seed in (7, 7 + 2**32)]
    assert runs[0] != runs[1]


def test_stop_token_ids_and_max_tokens_set_the_finish_reason(llm):
    free = llm.generate(["abc"], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 12
    stop_at = free.token_ids[5]
    stopped = llm.generate(["abc"], SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop_at],
                                                   ignore_eos=True))[0]
    first = free.token_ids.index(stop_at)
    assert stopped.finish_reason == "stop" and stopped.stop_reason == stop_at
    assert stopped.token_ids == free.token_ids[: first + 1]


def test_stop_token_ids_outside_the_vocabulary_are_refused(llm):
    vocab = llm.engine.model_config.text.vocab_size
    with pytest.raises(RequestError) as err:
        llm.generate(["abc"], SamplingParams(max_tokens=2, stop_token_ids=[3, vocab]))
    assert err.value.param == "stop_token_ids" and str(vocab) in str(err.value)
    assert not llm.engine.has_unfinished_requests


def test_min_tokens_holds_off_stop_ids(llm):
    free = llm.generate(["abc"], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    stop_at = free.token_ids[0]
    held = llm.generate(["abc"], SamplingParams(temperature=0, max_tokens=12, min_tokens=4,
                                                stop_token_ids=[stop_at], ignore_eos=True))[0]
    assert len(held.token_ids) >= 4 and stop_at not in held.token_ids[:4]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_min_tokens_holds_off_the_checkpoints_stop_ids_under_ignore_eos_too_as_vllm(llm, temperature):
    """vLLM's min_tokens bans every stop id of the request and the checkpoint (its `all_stop_token_ids`) until
    min_tokens tokens were generated, ignore_eos or not; under ignore_eos the checkpoint's stop ids (pushed up by a
    bias here) were sampled from the first token on. After min_tokens they are ordinary tokens, sampled again."""
    stop_ids = sorted(llm.engine.generation_defaults.stop_token_ids)
    pushed = SamplingParams(temperature=temperature, seed=0, max_tokens=6, min_tokens=4, ignore_eos=True,
                            logit_bias={t: 100.0 for t in stop_ids})
    tokens = llm.generate(["abc"], pushed)[0].outputs[0].token_ids
    assert len(tokens) == 6 and not set(tokens[:4]) & set(stop_ids) and set(tokens[4:]) <= set(stop_ids)


def test_min_tokens_holds_off_stop_strings(llm):
    """As vLLM: stop strings are looked for after the min_tokens-th token (a stop string in the first token's
    text used to end a min_tokens=4 request after one token)."""
    free = llm.generate(["abc"], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    needle = llm.get_tokenizer().decode(free.token_ids[:1])
    assert needle and free.text.startswith(needle)
    cut = llm.generate(["abc"], SamplingParams(temperature=0, max_tokens=12, stop=[needle], ignore_eos=True))[0]
    assert cut.text == "" and cut.finish_reason == "stop"
    held = llm.generate(["abc"], SamplingParams(temperature=0, max_tokens=12, min_tokens=4, stop=[needle],
                                                ignore_eos=True))[0]
    assert len(held.token_ids) >= 4 and held.token_ids[:4] == free.token_ids[:4]
    assert held.text.startswith(llm.get_tokenizer().decode(free.token_ids[:3]))


@pytest.mark.parametrize("k", [2, 3])
def test_a_stop_string_ending_in_the_min_tokens_th_token_does_not_count(llm, k):
    """As vLLM's V1 engine (and as a stop id, banned until then): a stop string counts only if it ends in a token
    after the first min_tokens; one ending in the min_tokens-th token is text (it used to end the request)."""
    free = llm.generate(["abc"], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    needle = llm.get_tokenizer().decode(free.token_ids[:k])  # the text up to the end of the k-th token, once
    assert needle and free.text.startswith(needle) and needle not in free.text[1:]
    armed = llm.generate(["abc"], SamplingParams(temperature=0, max_tokens=12, min_tokens=k - 1, stop=[needle],
                                                 ignore_eos=True))[0]
    assert (armed.text, armed.finish_reason, len(armed.token_ids)) == ("", "stop", k)
    held = llm.generate(["abc"], SamplingParams(temperature=0, max_tokens=12, min_tokens=k, stop=[needle],
                                                ignore_eos=True))[0]
    assert (held.text, held.finish_reason, held.stop_reason) == (free.text, "length", None)


def test_a_stop_string_counts_only_if_it_ends_in_armed_text():
    matcher = StopStringMatcher(["END"])
    assert matcher.feed("END", armed=False) == ("END", None)
    assert matcher.feed("xEN", armed=False) == ("x", None)  # held: it could start a stop string
    assert matcher.feed("D!END") == ("", "END")


def test_a_stop_string_held_from_unarmed_text_does_not_count_later():
    """A stop string that ended in unarmed text and is held back as the start of a longer one stays text when the
    next armed text comes (it ended the request there, as if it had ended in that token)."""
    matcher = StopStringMatcher(["ab", "abcd"])
    assert matcher.feed("xab", armed=False) == ("x", None)
    assert matcher.feed("x yy ") == ("abx yy ", None)
    assert matcher.feed("ab") == ("", "ab")
    alone = StopStringMatcher(["abcd", "ab"])
    assert alone.feed("ab", armed=False) == ("", None)
    assert alone.feed("cd") == ("", "abcd")  # a longer one ending in armed text counts


@pytest.mark.parametrize("include", [False, True])
def test_a_stop_string_completed_by_the_replacement_of_unfinished_bytes_ends_as_a_stop(llm, include):
    """Bytes left incomplete at the end read as U+FFFD, as `decode` reads them; when that completes a stop string, the
    text is cut there and the output says the stop string ended it (it said length, with no stop_reason)."""
    tokenizer = llm.get_tokenizer().tokenizer
    lead_byte = next(i for i in range(tokenizer.vocab_size) if tokenizer.token_bytes(i) == b"\xe6")
    stop = "\ufffd\ufffd"
    assert tokenizer.decode([lead_byte] * 2) == stop
    out = llm.generate(["abc"], SamplingParams(temperature=0, max_tokens=2, logit_bias={lead_byte: 100}, stop=[stop],
                                               include_stop_str_in_output=include))[0]
    assert out.token_ids == [lead_byte] * 2
    assert (out.text, out.finish_reason, out.stop_reason) == (stop if include else "", "stop", stop)


def test_stop_strings_cut_the_text_and_end_generation(llm):
    free = llm.generate(["abc"], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0]
    needle = free.text[10:13]
    stopped = llm.generate(["abc"], SamplingParams(temperature=0, max_tokens=30, stop=[needle],
                                                   ignore_eos=True))[0]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == needle
    assert stopped.text == free.text[: free.text.index(needle)]


def test_n_completions_are_independent(llm):
    out = llm.generate(["abc"], SamplingParams(temperature=1.0, max_tokens=10, n=3, seed=5, ignore_eos=True))[0]
    assert len(out.outputs) == 3 and all(len(o.token_ids) == 10 for o in out.outputs)
    assert len({tuple(o.token_ids) for o in out.outputs}) > 1


def test_text_prompt_gets_exactly_one_bos(llm):
    tokenizer = llm.get_tokenizer()
    plain = llm.generate(["hello"], SamplingParams(max_tokens=1))[0].prompt_token_ids
    rendered = llm.generate([tokenizer.bos_token + "hello"], SamplingParams(max_tokens=1))[0].prompt_token_ids
    assert plain == rendered and plain.count(tokenizer.bos_token_id) == 1 and plain[0] == tokenizer.bos_token_id


def test_stop_string_matcher_holds_back_only_possible_prefixes():
    matcher = StopStringMatcher(["END", "xyz"])
    assert matcher.feed("hello E") == ("hello ", None)
    assert matcher.feed("N") == ("", None)
    assert matcher.feed("D tail") == ("", "END")
    other = StopStringMatcher(["END"])
    assert other.feed("hello EN") == ("hello ", None)
    assert other.feed("X") == ("ENX", None)
    assert other.flush() == ""
    tail = StopStringMatcher(["END"])
    tail.feed("abc E")
    assert tail.flush() == "E"
    included = StopStringMatcher(["END"], include_in_output=True)
    assert included.feed("abcEND") == ("abcEND", "END")


def _stop_reference(text: str, stop: list[str], include: bool) -> tuple[str, str | None]:
    """The text cut at the stop string that ends first, of those ending at one place the longest (as matching after
    each character finds)."""
    for end in range(1, len(text) + 1):
        ending = [s for s in stop if s and text[:end].endswith(s)]
        if ending:
            longest = max(ending, key=len)
            return text[:end] if include else text[:end - len(longest)], longest
    return text, None


def _fed(stop: list[str], include: bool, pieces: list[str]) -> tuple[str, str | None]:
    matcher = StopStringMatcher(stop, include_in_output=include)
    released = ""
    for piece in pieces:
        text, matched = matcher.feed(piece)
        released += text
        if matched is not None:
            return released, matched
    return released + matcher.flush(), None


@pytest.mark.parametrize(("stop", "pieces", "expected"), [
    (["bc", "abcd"], ["xabcd"], ("xa", "bc")),  # overlapping: "bc" ends first, wherever the tokens split
    (["bc", "abcd"], ["xa", "b", "cd"], ("xa", "bc")),
    (["abcd", "bc"], ["xabcd"], ("xa", "bc")),  # the list's order does not matter
    (["ab", "abc"], ["xabc"], ("x", "ab")),  # a prefix of another ends first
    (["abc", "bc"], ["xab", "c"], ("x", "abc")),  # both end at "c": the longer, which starts first
    (["abc", "bc"], ["xabc"], ("x", "abc")),
    (["lo w", "wor"], ["hel", "lo ", "wo", "rld"], ("hel", "lo w")),  # spans three tokens
])
def test_overlapping_stop_strings_cut_where_the_first_to_end_begins_however_the_text_is_split(stop, pieces, expected):
    """Glimmer's rule: the stop string that ends first, of those ending at one place the longest. It is what
    matching after each character finds, so a text cuts the same streamed or whole, token by token or in one piece
    (vLLM takes the first of its list among those the last token completed; OpenAI does not say)."""
    assert _fed(stop, False, pieces) == expected
    assert _fed(stop, True, pieces) == (expected[0] + expected[1], expected[1])


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet="abc ", max_size=14), stop=st.lists(st.text(alphabet="abc", min_size=1, max_size=4),
                                                                  min_size=1, max_size=4),
       cuts=st.lists(st.integers(min_value=0, max_value=14), max_size=6), include=st.booleans())
def test_a_stop_string_cuts_the_same_text_however_it_is_split(text, stop, cuts, include):
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    pieces = [text[i:j] for i, j in itertools.pairwise(bounds)]
    assert _fed(stop, include, pieces) == _fed(stop, include, list(text)) == _stop_reference(text, stop, include)


def test_llm_chat_cuts_an_answer_at_the_stop_string_that_ends_first():
    """LLM.chat's cut of an answer read so far follows the matcher's rule: with ["bc", "abcd"] it cut "xabcd" at
    "abcd" (the earliest to start) where the text had come letter by letter."""
    from glimmer.engine.llm import _cut_at_stop

    assert _cut_at_stop("xabcd!", ["bc", "abcd"], False) == ("xa", "bc", 2)
    assert _cut_at_stop("xabcd!", ["abcd", "bc"], True) == ("xabc", "bc", 2)
    assert _cut_at_stop("abc", ["abc", "bc"], False) == (None, "abc", 0)


def test_top_k_candidates_filter_exactly_as_a_full_sort(monkeypatch):
    """topk over the candidates gives the same kept set and values as sorting the whole vocabulary."""
    import glimmer.engine.sampler as sampler

    logits = torch.randn((4, 3000), generator=torch.Generator().manual_seed(1)) * 3
    rows = [_row(top_k=k, top_p=p, min_p=m) for k, p, m in ((5, 1.0, 0.0), (50, 0.8, 0.0), (900, 0.95, 0.05),
                                                            (1, 0.5, 0.0))]
    fast = sampler._filter(logits, rows)
    monkeypatch.setattr(sampler, "MAX_TOPK_CANDIDATES", 0)
    assert torch.equal(fast, sampler._filter(logits, rows))
def test_skip_special_tokens_leaves_them_out_of_the_text_only(llm):
    tokenizer = llm.get_tokenizer()
    specials = set(tokenizer.tokenizer.all_special_ids)  # every token flagged special, not only the named ones
    params = dict(temperature=1.0, seed=3, max_tokens=30, ignore_eos=True)
    kept = llm.generate(["Hello"], SamplingParams(**params))[0]
    assert specials & set(kept.token_ids)  # the random model emits some
    skipped = llm.generate(["Hello"], SamplingParams(**params, skip_special_tokens=True))[0]
    assert skipped.token_ids == kept.token_ids
    assert kept.text == tokenizer.decode(kept.token_ids)
    assert skipped.text == tokenizer.decode([t for t in kept.token_ids if t not in specials])


def _with_generation_config(checkpoint, tmp_path, **fields):
    import json
    import shutil

    copy = tmp_path / "model"
    shutil.copytree(checkpoint, copy)
    config = json.loads((copy / "generation_config.json").read_text())
    (copy / "generation_config.json").write_text(json.dumps({**config, **fields}))
    return copy


def test_llm_defaults_come_from_generation_config_unless_vllm_style_is_asked(tiny_checkpoint, tmp_path):
    model = _with_generation_config(tiny_checkpoint, tmp_path, temperature=0.0, top_k=7, top_p=0.5)
    auto = LLM(str(model), progress=False)
    assert (auto.get_default_sampling_params().temperature, auto.get_default_sampling_params().top_k) == (0.0, 7)
    greedy = auto.generate(["Hi"], SamplingParams(temperature=0, top_k=7, top_p=0.5))[0].token_ids
    assert auto.generate(["Hi"])[0].token_ids == greedy
    plain = LLM(str(model), progress=False, generation_config="vllm").get_default_sampling_params()
    assert (plain.temperature, plain.top_k, plain.top_p) == (1.0, 0, 1.0)
    assert (plain.min_p, plain.repetition_penalty, plain.max_tokens) == (0.0, 1.0, 16)
    with pytest.raises(ConfigError, match="generation_config"):
        LLM(str(model), progress=False, generation_config="hf")


def test_llm_takes_min_p_repetition_penalty_and_max_new_tokens_from_generation_config(tiny_checkpoint, tmp_path):
    """vLLM's "auto" set: max_new_tokens is the default max_tokens (clamped at the context's end, as `LLM` clamps
    any max_tokens), min_p and repetition_penalty the defaults of their fields."""
    model = _with_generation_config(tiny_checkpoint, tmp_path, temperature=0.0, min_p=0.1, repetition_penalty=1.2,
                                    max_new_tokens=5)
    llm = LLM(str(model), progress=False, max_model_len=64)
    defaults = llm.get_default_sampling_params()
    assert (defaults.min_p, defaults.repetition_penalty, defaults.max_tokens) == (0.1, 1.2, 5)
    out = llm.generate(["Hi"], SamplingParams(**{**vars(defaults), "ignore_eos": True}))[0].outputs[0]
    assert len(out.token_ids) == 5 and out.finish_reason == "length"
    explicit = SamplingParams(temperature=0, min_p=0.1, repetition_penalty=1.2, max_tokens=5)
    assert llm.generate(["Hi"])[0].outputs[0].token_ids == llm.generate(["Hi"], explicit)[0].outputs[0].token_ids


def test_a_checkpoint_repetition_penalty_is_warned_of_where_requests_take_it(tiny_checkpoint, tmp_path, caplog):
    """The engine warned that "requests that leave it out are penalized" under LLM(generation_config="vllm") too,
    where no call takes the checkpoint's penalty; `LLM` says which of its calls do, the server its requests."""
    from glimmer.engine.async_engine import AsyncEngine
    from glimmer.engine.llm_engine import EngineConfig

    model = _with_generation_config(tiny_checkpoint, tmp_path, repetition_penalty=1.2)
    with caplog.at_level("WARNING"):
        LLM(str(model), progress=False, generation_config="vllm")
    assert "repetition_penalty" not in caplog.text
    with caplog.at_level("WARNING"):
        LLM(str(model), progress=False)
    assert "repetition_penalty=1.2: generate and chat calls without SamplingParams are penalized" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        engine = AsyncEngine(EngineConfig(model=str(model), progress=False, kv_cache_memory=8 << 20))
    engine.shutdown()
    assert "repetition_penalty=1.2: requests that leave it out are penalized" in caplog.text
    # the engine of glimmer serve, run-batch and an in-process glimmer chat, which sends no repetition_penalty: its fix
    # read "send repetition_penalty 1 (or serve with --generation-config vllm)"
    assert "; start with --generation-config vllm, or send repetition_penalty 1 in each request" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):  # a server's requests take no checkpoint default under --generation-config vllm
        engine = AsyncEngine(EngineConfig(model=str(model), progress=False, kv_cache_memory=8 << 20),
                             generation_config="vllm")
    engine.shutdown()
    assert "repetition_penalty" not in caplog.text


def test_the_start_up_log_names_the_checkpoint_defaults_requests_take(tiny_checkpoint, tmp_path, caplog):
    """vLLM logs the defaults its generation config overrides ("Default sampling parameters have been overridden by
    the model's Hugging Face generation config"); Glimmer said nothing unless a repetition_penalty was set, so a
    server whose requests all sampled at the checkpoint's temperature 0.6 looked like one at OpenAI's 1."""
    from glimmer.engine.async_engine import AsyncEngine
    from glimmer.engine.llm_engine import EngineConfig

    model = _with_generation_config(tiny_checkpoint, tmp_path, temperature=0.6, top_k=20, max_new_tokens=7)
    with caplog.at_level("INFO"):
        LLM(str(model), progress=False)
    assert ("generate and chat calls without SamplingParams take the checkpoint's sampling defaults: "
            "temperature=0.6, top_k=20, max_tokens=7 (LLM(..., generation_config='vllm') for vLLM's plain defaults)"
            ) in caplog.text
    caplog.clear()
    with caplog.at_level("INFO"):  # the engine of glimmer serve, run-batch and an in-process glimmer chat
        engine = AsyncEngine(EngineConfig(model=str(model), progress=False, kv_cache_memory=8 << 20))
    engine.shutdown()
    # completions keep OpenAI's max_tokens of 16 (README): the line said all requests that leave it out take 7
    assert ("requests that leave them out take the checkpoint's sampling defaults: temperature=0.6, top_k=20, "
            "max_tokens=7 in chat and Responses requests (completions keep OpenAI's 16 unless they send max_tokens: "
            "null) (--generation-config vllm for OpenAI's defaults)") in caplog.text
    caplog.clear()
    with caplog.at_level("INFO"):  # under --generation-config vllm no request takes them: nothing is said
        engine = AsyncEngine(EngineConfig(model=str(model), progress=False, kv_cache_memory=8 << 20),
                             generation_config="vllm")
    engine.shutdown()
    assert "sampling defaults" not in caplog.text


def test_min_p_filters_before_top_p_as_vllm_does():
    """vLLM: temperature → min-p → top-k → top-p, top-p on what min-p left. Probabilities 0.4, 0.3, 0.15, 0.1,
    0.05: min_p 0.3 keeps the first three (0.15 is 0.375 of the top), renormalized 0.47, 0.35, 0.18; top_p 0.75
    then drops the third (0.82 comes before it). Top-p on the raw probabilities would have kept it (0.7 before)."""
    from glimmer.engine.sampler import sampling_probs

    logits = torch.tensor([[0.4, 0.3, 0.15, 0.1, 0.05]]).log()
    probs = sampling_probs(logits, [_row(temperature=1.0, min_p=0.3, top_p=0.75)])
    kept = (probs[0] > 0).nonzero().flatten().tolist()
    assert kept == [0, 1]
    assert probs[0, :2].tolist() == pytest.approx([0.4 / 0.7, 0.3 / 0.7])
    only_min_p = sampling_probs(logits, [_row(temperature=1.0, min_p=0.3)])
    assert (only_min_p[0] > 0).nonzero().flatten().tolist() == [0, 1, 2]


@pytest.mark.parametrize("penalty", REPETITION_PENALTY_RANGE)
@pytest.mark.parametrize("temperature", [GREEDY_TEMPERATURE, 1.0, MAX_TEMPERATURE])
def test_the_extreme_temperatures_and_repetition_penalties_allowed_keep_the_distribution_finite(penalty, temperature):
    """Outside these bounds float32 overflowed: the logits became inf or NaN and every draw was token 0."""
    from glimmer.engine.sampler import constrain, sampling_probs

    logits = torch.tensor([[29.0, 30.0, 0.0, -5.0, -1e4]])
    row = SamplingRow(SamplingParams(temperature=temperature, repetition_penalty=penalty), [0, 1, 2, 3, 4], [],
                      torch.Generator().manual_seed(0))
    probs = sampling_probs(constrain(logits, [row]), [row])
    assert torch.isfinite(probs).all() and probs.sum().item() == pytest.approx(1.0)
    if temperature == GREEDY_TEMPERATURE and penalty < 1:
        assert probs[0].argmax().item() == 1


def test_a_json_schema_format_without_a_schema_allows_any_json_and_a_null_schema_is_the_same():
    """OpenAI's chat API makes `json_schema.schema` optional; null is the field left out (README: null fields)."""
    from glimmer.engine.sampling_params import StructuredOutputsParams

    absent = StructuredOutputsParams.from_response_format({"type": "json_schema", "json_schema": {"name": "x"}})
    null = StructuredOutputsParams.from_response_format({"type": "json_schema",
                                                         "json_schema": {"name": "x", "schema": None}})
    assert absent == null and absent.json == {}
    with pytest.raises(RequestError, match="json_schema.schema: must be a JSON schema object"):
        StructuredOutputsParams.from_response_format({"type": "json_schema", "json_schema": {"name": "x", "schema": 3}})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_plain_greedy_rows_take_the_in_place_argmax_and_choose_what_the_float32_path_chooses(monkeypatch, dtype):
    from glimmer.engine import sampler

    generator = torch.Generator().manual_seed(3)
    logits = (torch.randn(5, 300, generator=generator) * 4).to(dtype)
    logits[0, 7] = logits[0, 250] = logits[0].max() + 1  # a tie: the first index wins on both paths
    logits[1, 290] = logits[1].max() + 1  # the best logit of row 1 sits in the padding rows, never a token
    logits[2, 100] = float("nan")  # NaN is the largest on both paths too
    rows = [SamplingRow(SamplingParams(temperature=0), [], [], None, token_count=280) for _ in range(5)]
    calls = []
    real = sampler.greedy_tokens
    monkeypatch.setattr(sampler, "greedy_tokens", lambda *args: calls.append(1) or real(*args))
    fast = sample(logits, rows).token_ids
    assert calls == [1] and fast[0] == 7 and fast[1] < 280 and fast[2] == 100
    # the general path: float32, the padding rows filled with -inf, then argmax
    general = sampler.choose_tokens(logits.float(), rows).tolist()
    assert fast == general
    # anything else a row asks for leaves the fast path
    for other in (SamplingParams(temperature=0, logprobs=2), SamplingParams(temperature=0, presence_penalty=0.5),
                  SamplingParams(temperature=0, logit_bias={3: 1.0}), SamplingParams(temperature=0.7)):
        calls.clear()
        sample(logits, [*rows[:4], SamplingRow(other, [], [1], torch.Generator().manual_seed(0))])
        assert calls == []
    sample(logits, [SamplingRow(SamplingParams(temperature=0), [], [], None, banned_ids=(7,))] * 5)
    sample(logits, rows, _bitmask([None] * 5, 300))
    assert calls == []


def test_logprob_alternatives_and_ranks_come_from_the_tokenizers_ids_only():
    """The vocabulary's padding rows (columns from token_count on) keep their mass in the raw distribution but are
    never an alternative and never counted in a rank, for sampled and for scored tokens."""
    from glimmer.engine.sampler import scored_token_logprobs

    logits = torch.tensor([[0.0, 2.0, 1.0, 9.0, 8.0], [3.0, 0.5, 1.0, 7.0, 0.0]])  # columns 3 and 4: padding
    raw = torch.log_softmax(logits, dim=-1)
    rows = [SamplingRow(SamplingParams(temperature=0, logprobs=3), [], [], None, token_count=3) for _ in range(2)]
    result = sample(logits, rows)
    assert result.token_ids == [1, 0]  # never a padding row
    first, second = result.logprobs
    assert list(first.top) == [1, 2, 0] and first.rank == 1 and first.logprob == pytest.approx(raw[0, 1].item())
    assert list(second.top) == [0, 2, 1] and second.rank == 1
    scored = scored_token_logprobs(logits, [2, 1], 5, token_count=3)
    assert [entry.rank for entry in scored] == [2, 3]
    assert [list(entry.top) for entry in scored] == [[1, 2, 0], [0, 2, 1]]
    assert scored[0].logprob == pytest.approx(raw[0, 2].item())  # the raw distribution, padding mass included
    assert scored_token_logprobs(logits, [2, 1], 1)[0].rank == 4  # without a token count every column counts


def test_a_token_tied_with_others_sits_at_its_rank_among_the_alternatives():
    """Tokens of equal logprob (a bf16 logit row has many; a softcap saturates to them): the token's rank is vLLM's,
    the number of tokens at least as likely, itself included (vllm/v1/sample/ops/logprobs.py counts `x >= value`),
    whichever of its equals it is, and it sits last among its equals in the alternatives, which topk placed in any
    order or where topk kept it though its rank is past k (it was 1 + the tokens more likely, first among equals)."""
    from glimmer.engine.outputs import PositionLogprobs
    from glimmer.engine.sampler import scored_token_logprobs

    logits = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0, 0.0],    # four tied for the first place
                           [5.0, 1.0, 1.0, 1.0, 1.0, 0.0]])   # four tied for the second
    for forced, k in itertools.product(([3, 4], [0, 1], [1, 2]), (1, 2, 3, 4, 5)):
        # the bias forces a token of each tie; logprobs stay the model's
        rows = [SamplingRow(SamplingParams(temperature=0, logprobs=k, logit_bias={t: 50.0}), [], [], None)
                for t in forced]
        sampled = sample(logits, rows)
        scored = scored_token_logprobs(logits, forced, k)
        assert sampled.token_ids == forced
        assert [entry.rank for entry in sampled.logprobs] == [entry.rank for entry in scored] == [4, 5]
        for entries in (sampled.logprobs, scored):
            for entry in entries:
                alternatives = list(entry.top)
                assert len(alternatives) == k
                assert alternatives[entry.rank - 1] == entry.token_id if entry.rank <= k else (
                    entry.token_id not in alternatives)
                values = list(entry.top.values())
                assert values == sorted(values, reverse=True)  # still the k most likely, in order
                as_dict = PositionLogprobs(entry, SimpleNamespace(decode=str))  # vLLM's dict of the position
                assert as_dict[entry.token_id].rank == entry.rank
                assert [as_dict[t].rank for t in alternatives] == list(range(1, k + 1))  # the place of each


def _penalized_by_rows(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """The penalties row by row, as vLLM defines them: repetition on every id of the prompt and the output (divide
    a positive logit, multiply the others), then frequency × count and presence of each output id."""
    out = logits.clone()
    vocab = logits.shape[1]
    for i, row in enumerate(rows):
        p = row.params
        seen = {t for t in [*row.prompt_ids, *row.output_ids] if 0 <= t < vocab}
        if p.repetition_penalty != 1 and seen:
            index = torch.tensor(sorted(seen))
            values, rp = out[i, index], torch.tensor(p.repetition_penalty, dtype=logits.dtype)
            out[i, index] = torch.where(values > 0, values / rp, values * rp)
        counts = torch.zeros(vocab)
        for t in row.output_ids:
            if 0 <= t < vocab:
                counts[t] += 1
        if p.frequency_penalty or p.presence_penalty:
            out[i] -= torch.tensor(p.frequency_penalty) * counts + torch.tensor(p.presence_penalty) * (counts > 0)
    return out


def test_penalties_of_a_whole_batch_equal_the_penalties_row_by_row():
    """The batched penalties (one gather and scatter of every row's touched ids) give each row exactly its own
    penalties; rows without any stay untouched; ids outside the vocabulary (a drafter's, a tokenizer's extra)
    count nowhere."""
    from glimmer.engine.sampler import _apply_penalties

    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(6, 50, generator=generator) * 3
    rows = [
        SamplingRow(SamplingParams(repetition_penalty=1.3), [1, 2, 2, 40, 77], [3, 3, 9], None),
        SamplingRow(SamplingParams(), [1, 2], [3], None),
        SamplingRow(SamplingParams(frequency_penalty=0.7), [5], [5, 6, 6, 6, 49], None),
        SamplingRow(SamplingParams(presence_penalty=-1.1, repetition_penalty=0.8), [], [0, 0, 60], None),
        SamplingRow(SamplingParams(frequency_penalty=0.2, presence_penalty=0.4, repetition_penalty=1.5),
                    list(range(0, 50, 3)), [7, 8, 7], None),
        SamplingRow(SamplingParams(repetition_penalty=1.2), [], [], None),
    ]
    batched = logits.clone()
    _apply_penalties(batched, rows)
    assert torch.equal(batched, _penalized_by_rows(logits, rows))
    assert torch.equal(batched[1], logits[1]) and torch.equal(batched[5], logits[5])
    # a subset of the batch, and the cached prompt array, give the same rows
    subset = logits[[0, 2]].clone()
    rows[0].prompt_ids_array = None
    _apply_penalties(subset, [rows[0], rows[2]])
    assert torch.equal(subset, batched[[0, 2]])


@pytest.mark.parametrize("pairs", [1 << 22, 1, 25])
def test_penalties_touch_only_their_ids_and_give_them_the_bits_of_the_whole_row_arithmetic(monkeypatch, pairs):
    """Random rows of every penalty mix (negative ones included), repeated ids, -inf, ±0.0 and integer logits:
    each touched logit equals, bit for bit, what penalizing the whole row gives (repetition on every logit it
    reads, then minus frequency × count + presence on every logit); every other logit keeps its bits, where the
    whole-row arithmetic would turn a -0.0 into +0.0 when both penalties are negative. The same in runs of rows
    of at most `pairs` touched ids (a row alone, or a few together)."""
    from glimmer.engine import sampler
    from glimmer.engine.sampler import _apply_penalties

    monkeypatch.setattr(sampler, "PENALTY_PAIRS", pairs)
    runs = []
    penalize = sampler._penalize
    monkeypatch.setattr(sampler, "_penalize", lambda logits, rows, index, pending: (
        runs.append(index), penalize(logits, rows, index, pending)))

    generator = torch.Generator().manual_seed(17)
    vocab, count = 64, 40
    logits = (torch.randn(count, vocab, generator=generator) * 3).round()
    logits[logits == 0] = -0.0
    logits[logits.abs() > 5] = float("-inf")
    mixes = [dict(repetition_penalty=1.3), dict(frequency_penalty=-0.5, presence_penalty=-0.25),
             dict(repetition_penalty=0.7, frequency_penalty=1.5, presence_penalty=0.5), dict(presence_penalty=2.0)]
    ids = lambda n: torch.randint(0, 20, (n,), generator=generator).tolist()  # noqa: E731  (repeats)
    rows = [SamplingRow(SamplingParams(**mixes[i % len(mixes)]), ids(i % 9), ids(i % 11), None) for i in range(count)]
    pending = torch.randint(0, 20, (count,), generator=generator)
    penalized = logits.clone()
    _apply_penalties(penalized, rows, pending)
    whole = logits.clone()
    for i, row in enumerate(rows):
        p, outputs = row.params, [*row.output_ids, int(pending[i])]
        counts = torch.bincount(torch.tensor(outputs), minlength=vocab).float()
        seen = torch.zeros(vocab, dtype=torch.bool)
        seen[[*row.prompt_ids, *outputs]] = True
        rp = torch.tensor(p.repetition_penalty)
        scaled = torch.where(whole[i] > 0, whole[i] / rp, whole[i] * rp)
        if p.repetition_penalty != 1:
            whole[i] = torch.where(seen, scaled, whole[i])
        whole[i] -= counts * p.frequency_penalty + (counts > 0).float() * p.presence_penalty
        touched = seen if p.repetition_penalty != 1 else counts > 0
        assert torch.equal(penalized[i][touched].view(torch.int32), whole[i][touched].view(torch.int32))
        assert torch.equal(penalized[i][~touched].view(torch.int32), logits[i][~touched].view(torch.int32))
    assert torch.equal(penalized, whole)  # as values: only zeros' signs may differ
    flipped = (penalized.view(torch.int32) != whole.view(torch.int32))
    assert flipped.any() and (whole[flipped] == 0).all()  # the case the docstring names does occur here
    assert [i for run in runs for i in run] == list(range(count))
    if pairs > 1000:
        assert len(runs) == 1
    elif pairs == 1:
        assert len(runs) == count  # each row past the limit alone
    else:
        assert 1 < len(runs) < count


def test_kept_penalty_ids_follow_their_growing_list_and_leave_proposed_tokens_out():
    """`PenaltyIds` copies only the ids appended since its last call, grows past any length, returns tokens proposed
    past the committed list without keeping them, and keeps one device copy of the prompt's ids in the vocabulary."""
    from glimmer.engine.sampler import PenaltyIds

    committed: list[int] = []
    kept = PenaltyIds(committed)
    assert kept.outputs(committed).tolist() == []
    for step in range(300):
        committed.extend([step % 17, step])
        if step % 7 == 0:
            proposed = [*committed, 999, 998]
            assert kept.outputs(proposed).tolist() == proposed  # the proposed tail, then not kept:
        assert kept.outputs(committed).tolist() == committed
    prompt = np.array([5, -1, 70, 3, 100, 5], dtype=np.int64)
    on = kept.prompt_on(prompt, 70, torch.device("cpu"))
    assert on.tolist() == [5, 3, 5] and kept.prompt_on(prompt, 70, torch.device("cpu")) is on
    assert kept.prompt_on(prompt, 101, torch.device("cpu")).tolist() == [5, 70, 3, 100, 5]


def test_penalties_from_kept_ids_equal_penalties_from_the_lists_over_many_steps():
    """Rows whose ids are kept across steps (`PenaltyIds`: the prompt on the device once, the outputs appended)
    are penalized exactly as rows made from the lists, step after step as their outputs grow, verification's
    proposed tokens included."""
    from glimmer.engine.sampler import PenaltyIds, _apply_penalties

    generator = torch.Generator().manual_seed(31)
    vocab = 80
    params = [SamplingParams(repetition_penalty=1.4), SamplingParams(frequency_penalty=0.6, presence_penalty=0.2),
              SamplingParams(repetition_penalty=0.8, frequency_penalty=-0.3), SamplingParams(),
              SamplingParams(repetition_penalty=1.2, presence_penalty=1.0)]
    prompts = [torch.randint(-3, vocab + 5, (n,), generator=generator).tolist() for n in (9, 0, 30, 4, 15)]
    outputs: list[list[int]] = [[] for _ in params]
    kept = [PenaltyIds(o) for o in outputs]
    for step in range(12):
        for o in outputs:
            o.append(int(torch.randint(0, vocab, (), generator=generator)))
        proposed = [[1, 2]] * len(outputs) if step % 3 == 0 else [[]] * len(outputs)
        logits = torch.randn(len(params), vocab, generator=generator) * 2
        by_lists, by_kept = logits.clone(), logits.clone()
        _apply_penalties(by_lists, [SamplingRow(p, pr, o + x, None) for p, pr, o, x in
                                    zip(params, prompts, outputs, proposed, strict=True)])
        _apply_penalties(by_kept, [SamplingRow(p, pr, o + x, None, penalty_ids=k) for p, pr, o, x, k in
                                   zip(params, prompts, outputs, proposed, kept, strict=True)])
        assert torch.equal(by_lists.view(torch.int32), by_kept.view(torch.int32)), step


def test_an_engines_penalized_requests_keep_their_ids_while_running_and_drop_them_when_done(tiny_checkpoint,
                                                                                          monkeypatch):
    """Through `LLM.generate`: penalized greedy requests choose the same tokens with their ids kept across steps
    as with the ids made from the lists every step, and a finished sequence holds none."""
    from glimmer.engine import llm_engine

    llm = LLM(str(tiny_checkpoint), max_num_seqs=4)
    prompts = [[5, 9, 11, 13, 5, 9], [7, 7, 8], [20, 21, 22, 23, 24, 25, 26]]
    params = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, **p) for p in
              (dict(repetition_penalty=1.5), dict(frequency_penalty=0.8, presence_penalty=0.4),
               dict(repetition_penalty=0.9, presence_penalty=1.0))]
    seen, made = [], []
    original = llm.engine.scheduler.finish

    class Kept(llm_engine.PenaltyIds):
        def outputs(self, ids):
            made.append(self)
            return super().outputs(ids)

    monkeypatch.setattr(llm_engine, "PenaltyIds", Kept)

    def finish(seq):
        original(seq)
        seen.append(seq.penalty_ids)

    monkeypatch.setattr(llm.engine.scheduler, "finish", finish)
    kept = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]
    assert len(seen) == 3 and all(ids is None for ids in seen)
    assert len(set(made)) == 3 and len(made) >= 3 * 11  # one kept set a sequence, read every penalized step
    monkeypatch.setattr(llm_engine, "PenaltyIds", lambda committed: None)
    from_lists = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]
    assert kept == from_lists and all(len(t) == 12 for t in kept)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_constraints_change_only_the_samplers_own_widened_copy(dtype):
    """A 16-bit model's logits are widened to a float32 copy that the constraints then change in place; float32
    logits are the caller's, so they are copied first: the caller's logits stay as they were, and the tokens are
    those of constraining a copy."""
    from glimmer.engine.sampler import choose_tokens, constrain

    generator = torch.Generator().manual_seed(41)
    logits = (torch.randn(4, 60, generator=generator) * 3).to(dtype)
    before = logits.clone()
    rows = [SamplingRow(SamplingParams(temperature=0, repetition_penalty=1.5, presence_penalty=2.0), [1, 2], [3, 3],
                        None, banned_ids=(4,), token_count=50) for _ in range(4)]
    tokens = choose_tokens(logits, rows)
    assert torch.equal(logits, before)
    assert torch.equal(tokens, constrain(logits.float().clone(), rows).argmax(dim=-1))
    assert all(t < 50 and t != 4 for t in tokens.tolist())


def test_a_pending_token_counts_as_the_last_output_token():
    """lookahead.py: a step launched ahead samples before the host appended the token on its way."""
    from glimmer.engine.sampler import _apply_penalties

    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(6))
    params = [SamplingParams(frequency_penalty=0.9, presence_penalty=0.3), SamplingParams(),
              SamplingParams(repetition_penalty=1.4)]
    outputs, pending = [[4, 4], [1], []], [4, 1, 17]
    ahead = logits.clone()
    _apply_penalties(ahead, [SamplingRow(p, [9], o, None) for p, o in zip(params, outputs, strict=True)],
                     torch.tensor(pending))
    appended = logits.clone()
    _apply_penalties(appended, [SamplingRow(p, [9], [*o, t], None)
                                for p, o, t in zip(params, outputs, pending, strict=True)])
    assert torch.equal(ahead, appended)
    assert not torch.equal(ahead[0], logits[0]) and torch.equal(ahead[1], logits[1])


def test_top_p_keeps_the_shortest_run_that_reaches_it_and_every_token_tied_with_its_last():
    """Probabilities 0.4, 0.2, 0.2, 0.1, 0.1: top_p 0.5 needs the first two, and the third ties with the second,
    so it stays too, whatever order a sort gave the ties; top_p 0.4 needs only the first; 0.95 all five."""
    from glimmer.engine.sampler import sampling_probs

    logits = torch.tensor([[0.2, 0.4, 0.1, 0.2, 0.1]]).log()
    kept = lambda **kw: (sampling_probs(logits, [_row(temperature=1.0, **kw)])[0] > 0).nonzero().flatten().tolist()
    assert kept(top_p=0.5) == [0, 1, 3]
    assert kept(top_p=0.4) == [1]
    assert kept(top_p=0.95) == [0, 1, 2, 3, 4]
    # top-k keeps the ties at its k-th logit (vLLM's top-k does too)
    assert kept(top_k=2) == [0, 1, 3]
    # top-p on what top-k kept, renormalized (0.5, 0.25, 0.25)
    assert kept(top_k=2, top_p=0.45) == [1]
    assert kept(top_k=2, top_p=0.6) == [0, 1, 3]


def test_filters_are_the_same_for_a_row_whatever_shares_its_batch_and_whatever_orders_it():
    """A row's kept set does not depend on its neighbours (which decide between candidates and a full sort, and
    the candidates' width), nor on sorting the 16-bit model logits (`keys`) rather than the float32 ones."""
    from glimmer.engine import sampler

    generator = torch.Generator().manual_seed(8)
    raw = (torch.randn(5, 3000, generator=generator) * 2).to(torch.bfloat16)
    raw[:, 100:140] = raw[:, 7:8]  # ties
    temps = torch.tensor([0.7, 1.0, 1.3, 0.5, 1.0])
    scaled = raw.float() / temps[:, None]
    rows = [_row(temperature=t, **kw) for t, kw in zip(temps.tolist(), (
        dict(top_p=0.9), dict(top_k=40, top_p=0.8), dict(min_p=0.05, top_p=0.7), dict(top_k=2000), dict(top_p=0.3)),
        strict=True)]
    whole = sampler._filter(scaled, rows)
    assert torch.equal(whole, sampler._filter(scaled, rows, keys=raw))
    for i, row in enumerate(rows):
        assert torch.equal(whole[i:i + 1], sampler._filter(scaled[i:i + 1], [row])), i
    kept = (whole > float("-inf")).sum(dim=-1).tolist()
    assert 1 < kept[1] < kept[0] < 3000 and kept[3] >= 2000


def _exact_kept(scaled: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, float]:
    """The float64 reference of a row's kept set (min-p, top-k, then top-p on what those left, ties kept), and
    how far from top_p the cumulative mass around its threshold lies (where float32 rounding could decide)."""
    x = scaled.double()
    floor = float("-inf")
    if params.min_p > 0:
        floor = float(scaled.max() + torch.log(torch.tensor(params.min_p, dtype=torch.float32)))
    ordered = x.sort(descending=True).values
    if 0 < params.top_k < len(x):
        floor = max(floor, float(ordered[params.top_k - 1]))
    margin = math.inf
    if params.top_p < 1:
        kept = ordered[ordered >= floor]
        mass = torch.softmax(kept, dim=0).cumsum(dim=0)
        last = min(int((mass < params.top_p).sum()), len(kept) - 1)
        floor = max(floor, float(kept[last]))
        margin = min(abs(float(mass[last]) - params.top_p), abs(float(mass[last - 1]) - params.top_p) if last else 1)
    return x >= floor, margin


def _assert_counted_and_sorted_keep_the_exact_sets(scaled: torch.Tensor, keys: torch.Tensor,
                                                  rows: list[SamplingRow]) -> None:
    """Counted (`keys` given) and sorted, every row keeps the float64 reference's set, wherever float32 rounding
    cannot decide (only in the tail of top_p 0.9999: at most a tenth of the rows)."""
    from glimmer.engine import sampler

    counted = sampler._filter(scaled, rows, keys=keys) > float("-inf")
    sorted_ = sampler._filter(scaled, rows) > float("-inf")
    close = 0
    for i, row in enumerate(rows):
        exact, margin = _exact_kept(scaled[i], row.params)
        close += margin < 1e-6
        assert margin < 1e-6 or (torch.equal(counted[i], exact) and torch.equal(sorted_[i], exact)), (i, row.params)
    assert close <= len(rows) // 10


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_thresholds_counted_from_16_bit_logits_are_the_exact_ones(dtype):
    """Without a sort (`_thresholds_by_count`, taken where `keys` are given and a top-p or a top-k over 1,024
    needs more than the top candidates): every row's kept set equals the float64 reference's, ties and -inf
    (ruled-out) tokens included, as the float32 sort's does, wherever float32 rounding cannot decide."""

    generator = torch.Generator().manual_seed(1)
    count, width = 300, 5000
    raw = (torch.randn(count, width, generator=generator) * torch.rand(count, 1, generator=generator) * 6).to(dtype)
    raw[:, 100:300] = raw[:, 7:8]  # ties
    temps = torch.rand(count, generator=generator) * 1.5 + 0.05
    scaled = (raw.float() / temps[:, None]).masked_fill(torch.rand(count, width, generator=generator) < 0.1,
                                                       float("-inf"))
    choices = [dict(top_p=p) for p in (0.1, 0.5, 0.9, 0.999, 0.9999)] + [
        dict(top_k=2000), dict(top_k=4999, top_p=0.95), dict(top_k=1025, min_p=0.01), dict(min_p=0.1, top_p=0.9),
        dict(top_k=3, top_p=0.99)]
    rows = [_row(temperature=float(temps[i]), **choices[i % len(choices)]) for i in range(count)]
    _assert_counted_and_sorted_keep_the_exact_sets(scaled, raw, rows)


def test_a_rows_way_to_its_thresholds_depends_on_the_row_alone():
    """Counting (16-bit logits no penalty or bias changed, with a top-p or a top-k over 1,024) or an order (the
    rest): chosen per row, so neighbours with penalties, or without a top-k, change neither its kept set nor a
    seeded row's tokens. A long tail makes the two ways differ: 202,047 tokens 12 below one, top_p just under its
    exact probability 0.44615 keep that one token alone; a float32 softmax summed along the row misplaces it."""
    from glimmer.engine import sampler
    from glimmer.engine.sampler import choose_tokens

    vocab = 202_048
    raw = torch.full((1, vocab), -12.0)
    raw[0, 0] = 0.0
    raw = raw.to(torch.bfloat16)

    def seeded(seed: int, **fields) -> SamplingRow:
        return SamplingRow(SamplingParams(temperature=1.0, seed=seed, **fields), [], [],
                           torch.Generator().manual_seed(seed))

    neighbours = [SamplingRow(SamplingParams(temperature=1.0, repetition_penalty=1.1), [5], [], None),
                  _row(temperature=1.0, top_p=0.9), _row(temperature=1.0, top_k=3000)]
    for seed in range(1, 5):
        alone = choose_tokens(raw, [seeded(seed, top_p=0.446)]).tolist()
        assert alone == [0]
        for neighbour in neighbours:
            crowd = choose_tokens(torch.cat([raw, raw]), [seeded(seed, top_p=0.446), neighbour]).tolist()
            assert crowd[0] == 0, (seed, neighbour.params)
    generator = torch.Generator().manual_seed(4)
    for trial in range(300):  # a top-k under 1,024 with a top-p: counted alone and beside a top-p-only row
        keys = (torch.randn(1, 8000, generator=generator) * 1.5).to(torch.bfloat16)
        # top_p at a float32 cumulative sum of the top candidates: where the ways of summing disagree
        kept = torch.softmax(keys.float().masked_fill(keys.float() < keys.float().topk(1000).values[:, -1:],
                                                      float("-inf")), dim=-1)
        top_p = float(kept.gather(1, keys.float().topk(1000).indices).cumsum(dim=-1)[0, 20 + 3 * (trial % 300)])
        row = _row(temperature=1.0, top_k=1000, top_p=top_p)
        alone = sampler._filter(keys.float(), [row], keys=keys)
        both = sampler._filter(torch.cat([keys.float()] * 2), [row, _row(temperature=1.0, top_p=0.9)],
                               keys=torch.cat([keys, keys]))
        assert torch.equal(alone[0], both[0]), trial


def _penalized_rows(count: int, width: int, temps: torch.Tensor, generator: torch.Generator) -> list[SamplingRow]:
    """Rows with penalties and logit biases of every kind (and some with none), prompts and outputs drawn from
    the first 300 ids (repeats included), beside top-p, top-k and min-p."""
    assert count % 10 == 0 and count % 9 == 0  # every bias, penalty and filter meets every other
    penalties = [dict(repetition_penalty=1.3), dict(frequency_penalty=1.0), dict(presence_penalty=0.5),
                 dict(frequency_penalty=-0.5, presence_penalty=0.25, repetition_penalty=0.8), dict(),
                 dict(repetition_penalty=1.1, frequency_penalty=0.5)]
    filters = [dict(top_p=p) for p in (0.1, 0.5, 0.9, 0.999)] + [
        dict(top_k=1500), dict(top_k=width - 1, top_p=0.95), dict(min_p=0.01, top_p=0.8), dict(top_k=5, top_p=0.99),
        dict(top_k=3, top_p=0.999)]
    rows = []
    for i in range(count):
        ids = lambda n: torch.randint(0, 300, (n,), generator=generator).tolist()  # noqa: E731
        # some biases lift a token among the few largest: a top-k's k-th logit is then a moved one
        lift = 8.0 if i % 10 == 0 else 0.0
        bias = {int(t): float(b) + lift for t, b in zip(ids(3), torch.randn(3, generator=generator) * 2, strict=True)}
        fields = {**penalties[i % len(penalties)], **filters[i % len(filters)]}
        if i % 5 == 0:
            fields["logit_bias"] = bias
        rows.append(SamplingRow(SamplingParams(temperature=float(temps[i]), **fields), ids(40 + i % 7),
                                ids(i % 23), None))
    return rows


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_thresholds_of_penalized_and_biased_rows_counted_with_their_moved_logits_are_the_exact_ones(dtype):
    """Rows whose penalties and logit bias moved some logits off their 16-bit values count the rest and merge the
    moved ones in: every kept set equals the float64 reference's, as the float32 sort's does, wherever float32
    rounding cannot decide. Integer logits make a penalty land some exactly on another token's value (ties
    between a moved logit and a counted one)."""
    from glimmer.engine import sampler
    from glimmer.engine.sampler import constrain

    generator = torch.Generator().manual_seed(11)
    count, width = 270, 5000
    raw = torch.randn(count, width, generator=generator) * torch.rand(count, 1, generator=generator) * 6
    raw[::3] = raw[::3].round()  # integers: a penalty of 1 or 0.5 lands on another token's value
    raw = raw.to(dtype)
    raw[:, 400:600] = raw[:, 7:8]  # ties
    temps = torch.rand(count, generator=generator) * 1.5 + 0.05
    rows = _penalized_rows(count, width, temps, generator)
    scaled = constrain(raw.float(), rows) / temps[:, None]
    assert sampler.MAX_MOVED >= max(sampler.moved_bound(r) for r in rows) > 0
    _assert_counted_and_sorted_keep_the_exact_sets(scaled, raw, rows)
    moved = (scaled != raw.float() / temps[:, None]) & (scaled > float("-inf"))
    assert moved.sum(dim=-1).min() == 0 and moved.sum(dim=-1).max() > 30


def test_moved_logits_come_apart_from_the_counts_and_are_bounded_by_the_rows_penalized_ids():
    """The moved logits of a row (penalized or biased, not -inf or NaN) come back sorted, the counts hold the
    rest; the bound a row declares is never below the logits its penalties and bias moved."""
    from glimmer.engine import sampler
    from glimmer.engine.sampler import constrain
    from glimmer.model.kernels.pattern_counts import pattern_counts_and_moved, pattern_counts_torch

    generator = torch.Generator().manual_seed(12)
    count, width = 90, 3000
    raw = (torch.randn(count, width, generator=generator) * 3).to(torch.bfloat16)
    raw[3, 10:20] = float("nan")
    temps = torch.rand(count, generator=generator) + 0.3
    rows = _penalized_rows(count, width, temps, generator)
    rows[3].banned_ids = (1, 2, 3)
    scaled = constrain(raw.float(), rows) / temps[:, None]
    capacity = max(sampler.moved_bound(r) for r in rows)
    counts, moved = pattern_counts_and_moved(raw, scaled, temps, capacity)
    own = raw.float() / temps[:, None]
    is_moved = (scaled != own) & (scaled > float("-inf")) & ~scaled.isnan()
    for i, row in enumerate(rows):
        values = scaled[i][is_moved[i]].sort(descending=True).values
        assert is_moved[i].sum() <= sampler.moved_bound(row)
        assert torch.equal(moved[i, :len(values)], values) and (moved[i, len(values):] == float("-inf")).all()
    assert torch.equal(counts, pattern_counts_torch(raw, scaled.masked_fill(is_moved, float("-inf"))))
    assert scaled[3, 10:20].isnan().all() and counts[3].sum() == (scaled[3] > float("-inf")).sum() - is_moved[3].sum()


def test_a_moved_logit_between_counted_ones_can_be_the_top_k_or_top_p_threshold():
    """Logits 5, 4, 3, 2, 1 and zeros; a bias of 3.01 moves a zero between 4 and 3, above the 16-bit value 3 that
    a token holds: top-k 3 keeps 5, 4 and it, and a top-p whose mass the first three reach keeps the same three
    (a threshold at the moved logit, not at the counted 3 below it), as the sort does."""
    from glimmer.engine import sampler
    from glimmer.engine.sampler import constrain

    raw = torch.zeros(1, 2000)
    raw[0, :5] = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0])
    raw = raw.to(torch.bfloat16)
    moved_id = 100
    x = raw.float().clone()
    x[0, moved_id] = 3.01
    mass = torch.softmax(x[0], dim=0)
    top3 = float(mass[0] + mass[1] + mass[moved_id])
    for fields in (dict(top_k=3, top_p=0.9999), dict(top_p=top3 - 1e-4), dict(top_k=3, min_p=1e-9, top_p=0.9999)):
        row = SamplingRow(SamplingParams(temperature=1.0, logit_bias={moved_id: 3.01}, **fields), [], [], None)
        scaled = constrain(raw.float(), [row])
        kept = sampler._filter(scaled, [row], keys=raw) > float("-inf")
        assert sorted(torch.nonzero(kept[0]).flatten().tolist()) == [0, 1, moved_id], fields
        assert torch.equal(kept, sampler._filter(scaled, [row]) > float("-inf"))
    # moved logits far above every counted one (probabilities 0.88 and 0.12): the mass is taken from the largest
    # of them (no overflow), and top-p 0.95 keeps both
    row = SamplingRow(SamplingParams(temperature=0.5, logit_bias={moved_id: 100.0, moved_id + 1: 99.0}, top_p=0.95),
                      [], [], None)
    scaled = constrain(raw.float(), [row]) / 0.5
    kept = sampler._filter(scaled, [row], keys=raw) > float("-inf")
    assert torch.nonzero(kept[0]).flatten().tolist() == [moved_id, moved_id + 1]


def test_a_penalized_rows_kept_set_is_the_same_alone_and_beside_rows_of_other_ways_and_bounds():
    from glimmer.engine import sampler
    from glimmer.engine.sampler import constrain

    generator = torch.Generator().manual_seed(13)
    width = 4000
    raw = (torch.randn(4, width, generator=generator) * 2).to(torch.bfloat16)
    rows = [SamplingRow(SamplingParams(temperature=0.8, top_p=0.9, presence_penalty=1.0), [5, 6], [7, 7, 8], None),
            SamplingRow(SamplingParams(temperature=0.8, top_p=0.9, repetition_penalty=1.2),
                        torch.randint(0, width, (900,), generator=generator).tolist(), [1, 2], None),
            _row(temperature=0.8, top_p=0.9), _row(temperature=0.8, top_k=30)]
    scaled = constrain(raw.float(), rows) / 0.8
    whole = sampler._filter(scaled, rows, keys=raw)
    for i, row in enumerate(rows):
        assert torch.equal(whole[i:i + 1], sampler._filter(scaled[i:i + 1], [row], keys=raw[i:i + 1])), i
    assert torch.equal(whole, sampler._filter(scaled, rows))  # as the float32 sort keeps them


def test_logits_no_penalty_was_applied_to_are_counted_as_they_are_whatever_the_rows_ask(monkeypatch):
    """The drafter's proposals (`sampling_probs(..., moved=False)`) apply no penalty or bias: their rows count the
    16-bit logits without taking any apart, and keep what the same rows without penalties keep."""
    from glimmer.engine import sampler
    from glimmer.model.kernels import pattern_counts

    generator = torch.Generator().manual_seed(21)
    raw = (torch.randn(6, 3000, generator=generator) * 2).to(torch.bfloat16)
    asks = [dict(top_p=0.9, repetition_penalty=1.2), dict(top_p=0.5, frequency_penalty=0.5, logit_bias={3: 2.0}),
            dict(top_k=1500, presence_penalty=1.0), dict(top_p=0.95, logit_bias={9: -1.0}),
            dict(top_k=20, top_p=0.8, repetition_penalty=2),
            dict(min_p=0.05, top_p=0.7, presence_penalty=-1.0)]
    penalized = [SamplingRow(SamplingParams(temperature=0.7, **a), list(range(40)), [1, 2, 2], None) for a in asks]
    plain = [SamplingRow(SamplingParams(temperature=0.7, **{k: v for k, v in a.items() if k in
                                                            ("top_p", "top_k", "min_p")}), [], [], None) for a in asks]
    expected = sampler.sampling_probs(raw.float(), plain, raw)
    assert all(sampler.moved_bound(r) > 0 for r in penalized)
    monkeypatch.setattr(pattern_counts, "pattern_counts_and_moved", None)  # a row taking moved logits apart fails
    monkeypatch.setattr(sampler, "pattern_counts_and_moved", None)
    assert torch.equal(sampler.sampling_probs(raw.float(), penalized, raw, moved=False), expected)
    with pytest.raises(TypeError):
        sampler.sampling_probs(raw.float(), penalized, raw)


@pytest.mark.parametrize("width", [1, 5, 1023, 1024, 1025, 3000])
def test_chunked_cumulative_sums_match_a_plain_cumsum(width):
    from glimmer.model.kernels.pattern_counts import chunked_cumsum

    values = torch.rand(3, width, generator=torch.Generator().manual_seed(width), dtype=torch.float64)
    assert torch.allclose(chunked_cumsum(values), values.cumsum(dim=-1), rtol=1e-12, atol=0)
    assert chunked_cumsum(values).shape == (3, width)


def test_allowed_token_ids_are_checked_against_the_vocabulary_the_stop_ids_and_a_grammar(llm):
    """vLLM's `allowed_token_ids`: NumPy ids and a tuple taken as the ids they hold; ids past the vocabulary, only stop
    ids under min_tokens (nothing could be sampled), a grammar beside them, and `LLM.chat` (whose framing tokens
    they would ban) are refused naming the field."""
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, allowed_token_ids=(np.int64(40), 41, 300))
    assert params.allowed_token_ids == [40, 41, 300] and type(params.allowed_token_ids[0]) is int
    assert set(llm.generate([[1, 10, 11]], params)[0].outputs[0].token_ids) <= {40, 41, 300}
    stop_ids = llm.engine.generation_defaults.stop_token_ids
    cases = [
        SamplingParams(max_tokens=2, allowed_token_ids=[5, 10**6]),
        SamplingParams(max_tokens=4, min_tokens=2, allowed_token_ids=list(stop_ids)),
        SamplingParams(max_tokens=4, allowed_token_ids=[5], structured_outputs=None),
    ]
    cases[2].structured_outputs = StructuredOutputsParams(regex="[a-z]+")
    for bad in cases:
        with pytest.raises(RequestError) as refused:
            llm.generate([[1, 10, 11]], bad)
        assert refused.value.param == "allowed_token_ids"
    with pytest.raises(RequestError, match="framing tokens") as refused:
        llm.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=2, allowed_token_ids=[5]))
    assert refused.value.param == "allowed_token_ids"
