"""The completion rules alone: which ids stop a sequence, the token-level stops, min_tokens, the generation budget."""

from __future__ import annotations

import pytest

from glimmer.engine import completion_rules as rules
from glimmer.engine.sampling_params import SamplingParams
from glimmer.engine.sequence import Sequence
from glimmer.errors import ContextLengthError, RequestError

EOS, EOT, SPECIAL = 1, 2, 3  # the tokenizer's EOS, the checkpoint's other stop id, another special token
CHECKPOINT_STOPS = (EOS, EOT)


def _appended(token: int, params: SamplingParams, max_total_tokens: int = 10, outputs: int = 1) -> Sequence:
    """A sequence of a 4-token prompt, `token` the last of its `outputs` output tokens."""
    return Sequence("r", [50, 51, 52, 53], params, rules.stop_token_ids(params, CHECKPOINT_STOPS), max_total_tokens,
                    output_token_ids=[60] * (outputs - 1) + [token])


def test_a_sequence_stops_at_its_own_stop_ids_and_the_checkpoints():
    assert rules.stop_token_ids(SamplingParams(stop_token_ids=[7]), CHECKPOINT_STOPS) == {7, EOS, EOT}


def test_ignore_eos_leaves_only_the_requests_own_stop_ids():
    assert rules.stop_token_ids(SamplingParams(stop_token_ids=[7, EOS], ignore_eos=True), CHECKPOINT_STOPS) == {7, EOS}
    assert rules.stop_token_ids(SamplingParams(ignore_eos=True), CHECKPOINT_STOPS) == frozenset()


def test_the_text_of_the_requests_own_stop_ids_is_left_out_but_special_tokens_stay():
    """P-TOK-3: a special token stays in the text whatever ended the turn."""
    assert rules.silent_stop_ids(SamplingParams(stop_token_ids=[7, SPECIAL]), [EOS, EOT, SPECIAL]) == {7}
    assert rules.silent_stop_ids(SamplingParams(stop_token_ids=[7], include_stop_str_in_output=True), []) == frozenset()


def test_the_tokenizers_eos_stops_without_a_stop_reason():
    assert rules.token_stop(_appended(EOS, SamplingParams()), EOS, EOS, False) == ("stop", None)


def test_the_checkpoints_other_stop_ids_and_the_requests_stop_with_their_id():
    assert rules.token_stop(_appended(EOT, SamplingParams()), EOT, EOS, False) == ("stop", EOT)
    assert rules.token_stop(_appended(7, SamplingParams(stop_token_ids=[7])), 7, EOS, False) == ("stop", 7)


def test_eos_named_as_a_stop_id_under_ignore_eos_stops_with_its_id():
    """ignore_eos made it the caller's stop id, so vLLM reports it as one."""
    params = SamplingParams(stop_token_ids=[EOS], ignore_eos=True)
    assert rules.token_stop(_appended(EOS, params), EOS, EOS, False) == ("stop", EOS)
    assert rules.token_stop(_appended(EOT, SamplingParams(ignore_eos=True)), EOT, EOS, False) is None


def test_the_length_limit_ends_a_sequence_at_its_last_token():
    params = SamplingParams()
    assert rules.token_stop(_appended(9, params, max_total_tokens=6, outputs=1), 9, EOS, False) is None
    assert rules.token_stop(_appended(9, params, max_total_tokens=6, outputs=2), 9, EOS, False) == ("length", None)


def test_a_stop_id_or_the_grammars_end_at_the_length_limit_is_a_stop():
    params = SamplingParams()
    assert rules.token_stop(_appended(EOT, params, max_total_tokens=5), EOT, EOS, False) == ("stop", EOT)
    assert rules.token_stop(_appended(9, params, max_total_tokens=5), 9, EOS, True) == ("stop", None)


def test_a_token_that_ends_nothing_goes_on():
    assert rules.token_stop(_appended(9, SamplingParams()), 9, EOS, False) is None


def test_min_tokens_bans_the_stop_ids_until_that_many_tokens():
    assert [rules.bans_stop_ids(n, 3) for n in range(5)] == [True, True, True, False, False]
    assert not rules.bans_stop_ids(0, 0)


def test_a_stop_string_counts_only_in_a_token_after_the_min_tokens_th():
    assert [rules.stop_strings_armed(n, 2) for n in range(1, 5)] == [False, False, True, True]
    assert rules.stop_strings_armed(1, 0)


def test_the_budget_is_max_tokens_or_the_room_the_context_leaves():
    assert rules.generation_budget(16, 10, SamplingParams(max_tokens=4)) == 4
    assert rules.generation_budget(16, 10, SamplingParams(max_tokens=None)) == 6
    assert rules.generation_budget(16, 16, SamplingParams(max_tokens=0)) == 0


def test_a_budget_past_the_context_is_refused_unless_clamped():
    with pytest.raises(ContextLengthError) as refused:
        rules.generation_budget(16, 10, SamplingParams(max_tokens=7))
    assert refused.value.param == "max_tokens"
    assert rules.generation_budget(16, 10, SamplingParams(max_tokens=7), clamp_max_tokens=True) == 6


def test_a_prompt_that_leaves_no_room_is_refused():
    for prompt_len in (16, 17):
        with pytest.raises(ContextLengthError) as refused:
            rules.generation_budget(16, prompt_len, SamplingParams(max_tokens=None))
        assert refused.value.param == "messages"


def test_min_tokens_past_the_budget_is_refused_naming_min_tokens():
    with pytest.raises(RequestError, match="min_tokens: 7 is more than this request can generate") as refused:
        rules.generation_budget(16, 10, SamplingParams(max_tokens=None, min_tokens=7))
    assert refused.value.param == "min_tokens"


def test_min_tokens_past_the_room_ends_the_output_at_the_context_when_clamped():
    """vLLM's offline LLM: its length limit ends a request before min_tokens is looked at (v1 `check_stop`)."""
    assert rules.generation_budget(16, 10, SamplingParams(max_tokens=None, min_tokens=7), clamp_max_tokens=True) == 6
    assert rules.generation_budget(16, 10, SamplingParams(max_tokens=8, min_tokens=7), clamp_max_tokens=True) == 6
