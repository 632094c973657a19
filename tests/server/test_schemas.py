"""The request schemas (`glimmer/server/schemas.py`): how much work a bad body costs before its 400."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, ValidationError

from glimmer.engine.sampling_params import (
    ALLOWED_TOKEN_IDS_SIZE_RULE,
    BAD_WORDS_SIZE_RULE,
    LOGIT_BIAS_SIZE_RULE,
    MAX_ALLOWED_TOKEN_IDS,
    MAX_BAD_WORDS,
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_STOP_TOKEN_IDS,
)
from glimmer.errors import RequestError
from glimmer.server.responses_schemas import ResponsesRequest
from glimmer.server.schemas import ChatCompletionRequest, CompletionRequest, parse_body
from glimmer.server.settings import MAX_STOP_STRINGS
from glimmer.server.tokenize import DetokenizeRequest

MANY = 10_000
USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("model", "body", "first"), [
    (ChatCompletionRequest, {"messages": [1] * MANY}, ("messages", 0)),
    (ChatCompletionRequest, {"messages": USER, "stop_token_ids": [-1] * MANY}, ("stop_token_ids", 0)),
    (ChatCompletionRequest, {"messages": USER, **{f"k{i}": 1 for i in range(MANY)}}, ("k0",)),
    (ChatCompletionRequest, {"messages": USER, "stream_options": {f"k{i}": 1 for i in range(MANY)}},
     ("stream_options", "k0")),
    (ChatCompletionRequest, {"messages": USER, "logit_bias": {str(i): "x" for i in range(MANY)}}, ("logit_bias", "0")),
    (CompletionRequest, {"prompt": [[[]]] * MANY}, ("prompt", "str")),
    (ResponsesRequest, {"input": [1] * MANY}, ("input", "str")),
    (ResponsesRequest, {"input": "hi", "metadata": {str(i): 1 for i in range(MANY)}}, ("metadata", "0")),
    (DetokenizeRequest, {"tokens": [1.5] * MANY}, ("tokens", 0)),
])
def test_validation_stops_at_the_first_bad_entry_of_a_list_a_dict_or_the_unknown_fields(model: type[BaseModel],
                                                                                        body: dict, first: tuple):
    """An error per bad entry, each turned into a dict for the 400 that names only the first, cost seconds of the
    event loop for a 4 MB body: a union (`prompt`, `input`) tries each of its shapes to the end."""
    with pytest.raises(ValidationError) as caught:
        model.model_validate_json(json.dumps(body))
    assert caught.value.error_count() <= 4  # at most one per shape of a union
    assert caught.value.errors()[0]["loc"] == first


@pytest.mark.parametrize(("model", "prompt"), [(ChatCompletionRequest, {"messages": USER}),
                                               (CompletionRequest, {"prompt": "hi"})])
def test_stop_token_ids_past_their_cap_are_refused_by_the_schema_before_the_ids_past_it_are_validated(
        model: type[BaseModel], prompt: dict):
    """SamplingParams refused them, but only once the schema had validated every id on the event loop (1.9 million
    of a 4 MB body: about a second); the schema holds the cap, so the ids past it are never checked (the bad one here
    would be named otherwise)."""
    body = {**prompt, "stop_token_ids": [5] * MAX_STOP_TOKEN_IDS + [-1] * MANY}
    with pytest.raises(RequestError) as caught:
        parse_body(model, json.dumps(body).encode())
    assert caught.value.param == "stop_token_ids"
    assert str(caught.value) == f"stop_token_ids: must be a list of at most {MAX_STOP_TOKEN_IDS} token ids"
    taken = parse_body(model, json.dumps({**prompt, "stop_token_ids": [5] * MAX_STOP_TOKEN_IDS}).encode())
    assert len(taken.stop_token_ids) == MAX_STOP_TOKEN_IDS


@pytest.mark.parametrize(("field", "cap", "good", "bad", "rule"), [
    ("allowed_token_ids", MAX_ALLOWED_TOKEN_IDS, 5, -1, ALLOWED_TOKEN_IDS_SIZE_RULE),
    ("bad_words", MAX_BAD_WORDS, "qq", 1, BAD_WORDS_SIZE_RULE),
    ("logit_bias", MAX_LOGIT_BIAS_ENTRIES, 1.0, "x", LOGIT_BIAS_SIZE_RULE),
])
def test_a_list_or_dict_past_its_cap_is_refused_by_the_schema_before_the_entries_past_it_are_validated(
        field: str, cap: int, good, bad, rule: str):
    """SamplingParams refused 2 million allowed_token_ids or 370,000 logit_bias entries by their count, but only once
    the schema had validated each on the event loop (0.6 to 0.9 s); the schema holds the cap, so the entries past it
    are never checked (the bad one here would be named otherwise), and the refusal is worded as SamplingParams'."""
    def sized(count: int, *tail):
        values = [good] * count + list(tail)
        return {str(i): value for i, value in enumerate(values)} if field == "logit_bias" else values

    prompt = {"prompt": "hi"}
    with pytest.raises(RequestError) as caught:
        parse_body(CompletionRequest, json.dumps({**prompt, field: sized(cap, good, bad)}).encode())
    assert caught.value.param == field
    assert str(caught.value) == f"{field}: {rule}"
    taken = parse_body(CompletionRequest, json.dumps({**prompt, field: sized(cap)}).encode())
    assert len(getattr(taken, field)) == cap


def test_a_stop_list_past_its_cap_is_refused_by_the_schema_before_the_strings_past_it_are_validated():
    """The server refused more than MAX_STOP_STRINGS stop strings, but only once the schema had validated each (a
    4 MB body holds 500,000); the schema holds the cap, so the strings past it are never checked (the number here
    would be named otherwise), and the refusal is the server's own, not the union's "a string or a list"."""
    body = {"prompt": "hi", "stop": ["x"] * (MAX_STOP_STRINGS + 1) + [1]}
    with pytest.raises(RequestError) as caught:
        parse_body(CompletionRequest, json.dumps(body).encode())
    assert caught.value.param == "stop"
    assert str(caught.value) == f"stop: at most {MAX_STOP_STRINGS} stop strings are allowed"
    taken = parse_body(CompletionRequest, json.dumps({**body, "stop": ["x"] * MAX_STOP_STRINGS}).encode())
    assert len(taken.stop) == MAX_STOP_STRINGS
