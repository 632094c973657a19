"""The server's per-choice reader (glimmer/server/choice_stream.py) on deltas coalesced for a slow client."""

from __future__ import annotations

import pytest

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
    (2,600 entries against 2,500 tokens, where the non-streamed response had 2,500; P-API-4). The stop string's own
    tokens are the answer's (as in vLLM); the header's are not."""
    choice = ChoiceStream(0, None, stop=["STOP"], single_call=False)
    choice.feed(_coalesced([" to=user<|message|>", "Hi ", "ST", "OP", " and", " more"]))
    assert choice.finish_reason == "stop" and choice.stop_reason == "STOP"
    assert [entry.token_id for entry in choice.new_content_logprobs] == [101, 102, 103]
    assert choice.new_content_logprobs == choice.content_logprobs and choice.num_tokens == 4


def test_each_delta_reports_the_logprobs_of_the_answer_tokens_it_decided():
    choice = ChoiceStream(0, None, stop=[], single_call=False)
    choice.feed(_coalesced([" to=user<|message|>", "Hi"]))
    assert [entry.token_id for entry in choice.new_content_logprobs] == [101]
    choice.feed(StepDelta("r", 0, [7], " there ", logprobs=[TokenLogprobs(7, -0.5, {})]))
    assert choice.new_content_logprobs == []  # its trailing space may start a headerless switch (P-STREAM-3)
    choice.feed(StepDelta("r", 0, [8], "<|eot|>", logprobs=[TokenLogprobs(8, -0.1, {})], finish_reason="stop"))
    assert [entry.token_id for entry in choice.new_content_logprobs] == [7]
    assert [entry.token_id for entry in choice.content_logprobs] == [101, 7]


def test_a_hidden_special_token_has_no_answer_logprob():
    choice = ChoiceStream(0, None, stop=[], single_call=False, hidden_tokens={9})
    # the engine leaves a hidden token out of the text (`hidden_token_ids`)
    for token_id, text in [(100, " to=user<|message|>"), (101, "Hi"), (9, ""), (102, "!")]:
        choice.feed(StepDelta("r", 0, [token_id], text, logprobs=[TokenLogprobs(token_id, -0.1, {})]))
    choice.feed(StepDelta("r", 0, [8], "<|eot|>", logprobs=[TokenLogprobs(8, -0.1, {})], finish_reason="stop"))
    assert [entry.token_id for entry in choice.content_logprobs] == [101, 102]


def test_a_coalesced_delta_releases_each_tokens_logprobs_with_the_text_it_decided():
    """A slow client's stream sent every entry of a coalesced delta with its first piece of text; each now goes with
    the events of the token that decided its text, as a fast client's stream sends it (README: each token's entry
    comes in the chunk that carries its text)."""
    choice = ChoiceStream(0, None, stop=[], single_call=False)
    released = choice.feed(_coalesced([" to=user<|message|>", "Hi", " there", "!"]))
    steps = [("".join(text for kind, text in step.events if kind == "content"),
              [entry.token_id for entry in step.logprobs]) for step in released]
    assert steps == [("", []), ("Hi", [101]), (" there", [102]), ("!", [103])]
    assert [entry.token_id for entry in choice.new_content_logprobs] == [101, 102, 103]


def _fed_one_token_a_step(choice: ChoiceStream, pieces: list[str], finish_reason: str = "length") -> None:
    for i, text in enumerate(pieces):
        last = i == len(pieces) - 1
        choice.feed(StepDelta("r", 0, [100 + i], text, logprobs=[TokenLogprobs(100 + i, -0.1, {})],
                              finish_reason=finish_reason if last else None))
        if choice.done:
            return


@pytest.mark.parametrize("include_stop", [False, True])
def test_tokens_after_a_stop_string_in_text_the_parser_held_back_have_no_answer_logprob(include_stop):
    """Audit: ' to' may start a headerless switch (P-HDR-7), so the parser holds it and releases it with ' the'; the
    stop string 'to' ends in ' to', yet ' the' was listed in `logprobs.content` after an answer of 'Go '. As in vLLM,
    the answer's tokens end with the one that ends the stop string."""
    choice = ChoiceStream(0, None, stop=["to"], single_call=False, include_stop=include_stop)
    _fed_one_token_a_step(choice, [" to=user<|message|>", "Go", " to", " the", " end"])
    assert choice.finish_reason == "stop" and choice.stop_reason == "to"
    assert [entry.token_id for entry in choice.content_logprobs] == [101, 102]


def test_a_stop_string_in_an_unframed_reply_released_at_its_end_ends_it_with_stop():
    """Audit: a reply without a header is held until the parser knows it is no header (P-HDR-3), here the engine's
    end at max_tokens; the stop string found then cut the answer to 'Go to the ' but the choice said `length`, with
    the logprobs of every token."""
    choice = ChoiceStream(0, None, stop=["end"], single_call=False)
    _fed_one_token_a_step(choice, ["Go", " to", " the", " end", " now", "."])
    assert choice.finish_reason == "stop" and choice.stop_reason == "end"
    assert [entry.token_id for entry in choice.content_logprobs] == [100, 101, 102, 103]


@pytest.mark.parametrize(("pieces", "content"), [
    # ' to' (the 3rd token) may start a headerless switch: held, it came out with ' the', past min_tokens
    ([" to=user<|message|>", "Go", " to", " the", " end", "."], "Go to the end."),
    ([" to=user<|message|>", "Go", " to", " the", " to", "p"], "Go to the "),  # the 5th token's counts
    ([" to=user<|message|>", "Go", " t", "o the", " to", "p"], "Go "),  # it ends in the 4th
])
def test_min_tokens_holds_off_a_stop_string_ending_in_its_tokens_though_the_parser_held_its_text(pieces, content):
    """Audit: stop strings were looked for in all the answer text a step released once more than min_tokens tokens
    were generated, so text the parser had held back from the min_tokens-th token or before counted (README: a stop
    string counts if it ends in a token after the min_tokens-th, as in vLLM and `LLM.chat`)."""
    choice = ChoiceStream(0, None, stop=["to"], single_call=False, min_tokens=3)
    released = []
    for i, text in enumerate(pieces):
        released += choice.feed(StepDelta("r", 0, [100 + i], text, logprobs=[TokenLogprobs(100 + i, -0.1, {})],
                                          finish_reason="length" if i == len(pieces) - 1 else None))
        if choice.done:
            break
    assert "".join(text for step in released for kind, text in step.events if kind == "content") == content
    assert choice.finish_reason == ("length" if content.endswith(".") else "stop")
