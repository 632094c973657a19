"""The pure-text OpenAI mapping (protocol.md §6: P-API-1..5)."""

import json
import re

import pytest
from protocol_support import CALENDAR_TOOLS, atem, tool_message

from glimmer.protocol import (
    ContentTokens,
    OutputParser,
    ParsedOutput,
    ToolCall,
    assistant_message,
    count_reasoning_tokens,
    finish_reason,
    parse_output,
    stream_delta_objects,
)

TURN = (
    " to=self<|message|>Check the calendar.<|eom|>"
    + tool_message("calendar.lookup", atem("calendar.lookup", {"day": "Friday", "limit": "3"}))
    + "<|eom|><|start|>assistant to=user<|message|>One event.<|eot|>"
)


def test_message_carries_reasoning_in_both_fields_content_and_tool_calls():
    """P-API-1."""
    output = parse_output(TURN, CALENDAR_TOOLS)
    message = assistant_message(output)
    call_id = output.tool_calls[0].id
    assert message == {
        "role": "assistant",
        "content": "One event.",
        "reasoning_content": "Check the calendar.",
        "reasoning": "Check the calendar.",
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": "calendar.lookup", "arguments": '{"day": "Friday", "limit": 3}'},
            }
        ],
    }


def test_empty_fields_are_null_and_tool_calls_omitted():
    message = assistant_message(ParsedOutput(None, None, []))
    assert message == {"role": "assistant", "content": None, "reasoning_content": None, "reasoning": None}


def test_include_reasoning_false_nulls_the_reasoning():
    message = assistant_message(
        ParsedOutput("r", "c", [ToolCall("call_1", "f", "{}")]), include_reasoning=False
    )
    assert message["reasoning_content"] is None and message["reasoning"] is None
    assert message["tool_calls"][0]["function"] == {"name": "f", "arguments": "{}"}


@pytest.mark.parametrize(
    ("has_tool_calls", "length_limited", "reason"),
    [(False, False, "stop"), (True, False, "tool_calls"), (True, True, "length"), (False, True, "length")],
)
def test_finish_reason(has_tool_calls, length_limited, reason):
    """P-API-2: `length` wins even with calls, then `tool_calls`, then `stop`."""
    assert finish_reason(has_tool_calls=has_tool_calls, length_limited=length_limited) == reason


def test_stream_delta_objects_follow_openai_shapes_in_wire_order():
    """P-API-3."""
    parser = OutputParser(CALENDAR_TOOLS)
    objects = stream_delta_objects(parser.feed(TURN)) + stream_delta_objects(parser.finish())
    assert objects[0] == {"reasoning_content": "Check the calendar.", "reasoning": "Check the calendar."}
    start = objects[1]["tool_calls"][0]
    assert start["index"] == 0 and start["type"] == "function" and start["id"].startswith("call_")
    assert start["function"] == {"name": "calendar.lookup", "arguments": '{"day": "Friday"'}
    assert objects[2] == {"tool_calls": [{"index": 0, "function": {"arguments": ', "limit": 3'}}]}
    assert objects[3] == {"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}
    assert objects[4] == {"content": "One event."}
    assert stream_delta_objects(parser.feed(""), include_reasoning=False) == []


def test_streamed_fields_concatenate_to_the_non_streaming_response_ids_aside():
    """P-API-4."""
    parser = OutputParser(CALENDAR_TOOLS)
    objects = []
    for character in TURN:
        objects += stream_delta_objects(parser.feed(character))
    objects += stream_delta_objects(parser.finish())
    reasoning = "".join(item.get("reasoning_content", "") for item in objects)
    content = "".join(item.get("content", "") for item in objects)
    arguments: dict[int, str] = {}
    names: dict[int, str] = {}
    for item in objects:
        for piece in item.get("tool_calls", []):
            arguments[piece["index"]] = arguments.get(piece["index"], "") + piece["function"]["arguments"]
            if "name" in piece["function"]:
                names[piece["index"]] = piece["function"]["name"]
    message = assistant_message(parse_output(TURN, CALENDAR_TOOLS))
    assert reasoning == message["reasoning_content"] and content == message["content"]
    assert [(names[index], arguments[index]) for index in sorted(arguments)] == [
        (call["function"]["name"], call["function"]["arguments"]) for call in message["tool_calls"]
    ]
    assert json.loads(arguments[0]) == {"day": "Friday", "limit": 3}


def test_reasoning_token_count_counts_tokens_overlapping_reasoning_spans():
    """P-API-5."""
    spans = [(0, 10), (20, 30)]
    tokens = [(0, 3), (3, 10), (10, 15), (15, 21), (21, 25), (25, 30), (30, 31), (31, 31)]
    assert count_reasoning_tokens(tokens, spans) == 5
    assert count_reasoning_tokens([(5, 5), (10, 10)], spans) == 1
    assert count_reasoning_tokens(tokens, []) == 0


def _answer_tokens(text, tokens):
    """(step, token) for each token ContentTokens picks when `text`, split into `tokens`, is fed one token at a time:
    step is the feed after which it was decided (len(tokens): at the end)."""
    assert "".join(tokens) == text
    parser = OutputParser(CALENDAR_TOOLS)
    answer = ContentTokens(parser)
    picked = []
    offset = 0
    for step, token in enumerate(tokens):
        answer.add((offset, offset + len(token)), token)
        offset += len(token)
        parser.feed(token)
        picked += [(step, decided) for decided in answer.decided()]
    parser.finish()
    picked += [(len(tokens), decided) for decided in answer.decided(final=True)]
    return picked


@pytest.mark.parametrize("split", [r"<\|[a-z_]+\|>|\s?\w+|\W", r"(?s)."], ids=["words", "characters"])
def test_content_tokens_are_the_answer_tokens_and_spell_the_content(split):
    """Chat `logprobs.content` lists the message content's tokens: no reasoning, header, tool-call or terminator."""
    for text in (TURN, " to=user<|message|>Hi to=x stays text<|eom|>\n <|start|>assistant to=user<|message|>!<|eot|>"):
        tokens = re.findall(split, text)
        picked = _answer_tokens(text, tokens)
        assert "".join(token for _, token in picked) == parse_output(text, CALENDAR_TOOLS).content
        assert all(token not in ("<|message|>", "<|eot|>", "<|eom|>") for _, token in picked)


def test_a_content_token_is_decided_once_its_text_cannot_become_framing():
    """P-STREAM-3: `Hi` is answer text at once; ` to` may open a headerless switch and waits for the next token."""
    picked = _answer_tokens(" to=user<|message|>Hi to=x now<|eot|>", [" to", "=user", "<|message|>", "Hi", " to",
                                                                       "=x", " now", "<|eot|>"])
    assert picked == [(3, "Hi"), (6, " to"), (6, "=x"), (6, " now")]


def test_a_token_still_holding_a_partial_character_counts_with_the_character_it_starts():
    parser = OutputParser()
    answer = ContentTokens(parser)
    parser.feed(" to=user<|message|>")
    answer.add((19, 19), "first byte of é")  # released no text yet
    answer.add((19, 20), "second byte")
    parser.feed("é")
    parser.finish()
    assert answer.decided(final=True) == ["first byte of é", "second byte"]
