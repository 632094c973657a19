"""The fewest tokens of a forced call (engine/call_length.py), counted with the embedded model's tokenizer."""

from __future__ import annotations

import pytest

from glimmer.default_model import default_model_dir
from glimmer.engine import call_length
from glimmer.engine.call_length import fewest_call_tokens, fewest_tokens
from glimmer.engine.tokenizer import Tokenizer
from glimmer.protocol.turn_grammar import shortest_kept_calls

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
UNITS = {"type": "object", "properties": {"units": {"type": "string"}, "city": {"type": "string"}},
         "required": ["city"]}


def _tool(name: str, parameters: dict | None = None) -> dict:
    return {"type": "function", "function": {"name": name, **({"parameters": parameters} if parameters else {})}}


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_dir(default_model_dir())


def test_the_shortest_call_writes_the_first_parameter_with_an_empty_value_or_closes_an_empty_invoke():
    """P-ATEM-4: a call is kept once one parameter is complete, or its invoke closed: an optional parameter declared
    before the first required one may come first."""
    opener = '<atem:function_calls>\n<atem:invoke name="{}">\n'
    city = '<atem:parameter name="city"></atem:parameter>'
    assert shortest_kept_calls(_tool("get_weather", CITY)) == [
        (" to=get_weather", "<|message|>", opener.format("get_weather") + city)]
    assert [pieces[2].removeprefix(opener.format("f")) for pieces in shortest_kept_calls(_tool("f", UNITS))] == [
        '<atem:parameter name="units"></atem:parameter>', city]
    assert [pieces[2] for pieces in shortest_kept_calls(_tool("now"))] == [opener.format("now") + "</atem:invoke>"]


def test_the_fewest_tokens_of_a_call_are_its_header_the_message_token_and_its_tags(tokenizer):
    weather = _tool("get_weather", CITY)
    (pieces,) = shortest_kept_calls(weather)
    canonical = len(tokenizer.encode(" to=get_weather")) + 1 + len(tokenizer.encode(pieces[2]))
    assert fewest_call_tokens([weather], tokenizer) == canonical
    # the fewest of several allowed tools is the shortest one's
    assert fewest_call_tokens([weather, _tool("now")], tokenizer) == fewest_call_tokens([_tool("now")], tokenizer)
    assert fewest_call_tokens([_tool("now")], tokenizer) < canonical


def test_fewest_tokens_never_exceed_the_tokenizer_s_own_encoding(tokenizer):
    for text in ("Hello there, how are you?", '<atem:parameter name="a_long_parameter_name">', " to=x", "\n\n\t  "):
        assert 1 <= fewest_tokens(text, tokenizer) <= len(tokenizer.encode(text))


def test_a_text_no_split_of_the_vocabulary_spells_counts_as_one_token(tokenizer, monkeypatch):
    """A vocabulary without every byte may spell no split of a call's text (a tool name's character): the count
    stays a lower bound (one token) instead of failing the request."""
    entries, longest = call_length._text_tokens(tokenizer)
    call_length.fewest_tokens.cache_clear()
    monkeypatch.setattr(call_length, "_text_tokens", lambda _: (entries - {"é".encode()[:1]}, longest))
    assert fewest_tokens("é", tokenizer) is None
    assert fewest_call_tokens([_tool("café")], tokenizer) == 3  # its header, <|message|>, its tags
    call_length.fewest_tokens.cache_clear()


def test_a_tool_no_call_of_which_can_be_written_has_no_fewest_tokens(tokenizer):
    """A required parameter's name holding `"` cannot be written in a call's tag (the turn grammar refuses it,
    naming it): the count left it out, and min() of no calls raised ValueError."""
    quoted = _tool("f", {"type": "object", "properties": {'say "hi"': {"type": "string"}}, "required": ['say "hi"']})
    assert shortest_kept_calls(quoted) == []
    assert fewest_call_tokens([quoted], tokenizer) == 0
    assert fewest_call_tokens([quoted, _tool("now")], tokenizer) == fewest_call_tokens([_tool("now")], tokenizer)
