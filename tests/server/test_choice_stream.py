"""The server's per-choice reader (glimmer/server/choice_stream.py) on deltas coalesced for a slow client."""

from __future__ import annotations

from glimmer.engine.outputs import StepDelta
from glimmer.engine.sampler import TokenLogprobs
from glimmer.server.choice_stream import ChoiceStream


def _coalesced(pieces: list[str]) -> StepDelta:
    """One delta holding one token per piece, as a slow client's stream merges them."""
    merged = None
    for i, text in enumerate(pieces):
        step = StepDelta("r", 0, [100 + i], text, logprobs=[TokenLogprobs(100 + i, -0.1 * i, {})])
        merged = step if merged is None else merged.merged(step)
    return merged


def test_a_choice_ended_by_a_stop_string_reports_only_the_logprobs_it_read():
    """Audit: a slow client's stream carried logprobs of tokens after the stop string that ended the choice
    (2,600 entries against 2,500 tokens, where the non-streamed response had 2,500; P-API-4)."""
    choice = ChoiceStream(0, None, stop=["STOP"], single_call=False)
    choice.feed(_coalesced([" to=user<|message|>", "Hi ", "ST", "OP", " and", " more"]))
    assert choice.finish_reason == "stop" and choice.stop_reason == "STOP"
    assert [entry.token_id for entry in choice.fed_logprobs] == [100, 101, 102, 103]
    assert choice.fed_logprobs == choice.logprobs and choice.num_tokens == 4


def test_every_delta_reports_the_logprobs_of_its_own_tokens():
    choice = ChoiceStream(0, None, stop=[], single_call=False)
    choice.feed(_coalesced([" to=user<|message|>", "Hi"]))
    assert [entry.token_id for entry in choice.fed_logprobs] == [100, 101]
    choice.feed(StepDelta("r", 0, [7], " there", logprobs=[TokenLogprobs(7, -0.5, {})]))
    assert [entry.token_id for entry in choice.fed_logprobs] == [7]
    assert len(choice.logprobs) == 3
