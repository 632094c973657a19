"""Invariants over generated turns (hypothesis).

1. Streaming at any chunking equals one-shot (P-STREAM-1), and emitted text only grows (P-STREAM-2).
2. A turn rendered from structured messages by the template and parsed back returns the same reasoning,
   content and calls (the template and the parser speak the same protocol).
3. Arbitrary text never raises (P-STREAM-8), never leaks framing (P-CHAN-6), and calls are numbered densely
   with arguments that are JSON objects (P-ATEM-3, P-ATEM-4, P-VAL-4).
"""

import json
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protocol_support import parsed_key

from glimmer.protocol import OutputParser, ParsedOutput, builtin_template_source, parse_output, render_chat
from glimmer.protocol.tokens import FRAMING_MARKERS

PROPERTY_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "files.write",
            "description": "",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "body": {"type": "string"},
                    "count": {"type": "integer"},
                    "ratio": {"type": "number"},
                    "flag": {"type": "boolean"},
                    "options": {"type": "object"},
                    "items": {"type": "array"},
                    "maybe": {"type": ["string", "null"]},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    },
]

TRICKY_PIECES = [
    '<atem:parameter name="x">',
    "</atem:parameter>",
    "</atem:invoke>",
    "</atem:function_calls>",
    '<atem:invoke name="y">',
    "<atem:function_calls>",
    "<|message|>",
    "<|patch|>",
    "<|image|>",
    "<|eo",
    "<|start",
    "<|",
    "|>",
    "<",
    ">",
    '"',
    "'",
    "\n",
    " ",
    "\t",
    "to=",
    " to=user",
    "to=self",
    "null",
    "true",
    '{"a": 1}',
    "[1]",
    "é",
    "😀",
    "\u2028",
    "assistant",
    "\\",
]
STRUCTURAL_MARKERS = ("<|start|>", "<|eom|>", "<|eot|>", "<|end_of_text|>", "<|begin_of_text|>")
PLAIN_ALPHABET = st.characters(blacklist_categories=("Cs",), max_codepoint=0x1F64F)

tricky_text = st.lists(
    st.one_of(st.text(PLAIN_ALPHABET, max_size=6), st.sampled_from(TRICKY_PIECES)), max_size=10
).map("".join)

_SWITCH = re.compile(r"(?:^|\s)to=[^\s<]{1,64}<\|message\|>")
_LEGAL_CLOSER = re.compile(
    r'</atem:parameter>(?:\s{65}|\s*(?:<atem:parameter name="|</atem:invoke>|'
    r"</atem:function_calls>))"
)


def survives_as_channel_text(text: str) -> bool:
    """Reasoning/content text that framing leaves alone (no structure, no stray <|message|>)."""
    return (
        not any(marker in text for marker in STRUCTURAL_MARKERS)
        and "<|message|>" not in text
        and _SWITCH.search(text) is None
    )


def survives_as_string_value(text: str) -> bool:
    """A string value that stays one value: no structure, no switch, no legal closer inside."""
    return (
        not any(marker in text for marker in STRUCTURAL_MARKERS)
        and _SWITCH.search(text) is None
        and _LEGAL_CLOSER.search(text + "</atem:parameter>") is None
        and not (text + "</atem:parameter>").endswith("</atem:parameter></atem:parameter>")
    )


json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    st.text(PLAIN_ALPHABET, max_size=5),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(PLAIN_ALPHABET, max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
string_values = tricky_text.filter(survives_as_string_value)

ARGUMENT_STRATEGIES = {
    "path": string_values,
    "body": string_values,
    "count": st.integers(-(10**9), 10**9),
    "ratio": st.floats(allow_nan=False, allow_infinity=False, width=64),
    "flag": st.booleans(),
    "options": st.dictionaries(st.text(PLAIN_ALPHABET, max_size=5), json_values, max_size=3),
    "items": st.lists(json_values, max_size=4),
    # P-VAL-1: in a string|null parameter the exact text "null" is null, so the string "null" cannot round-trip
    "maybe": st.one_of(st.none(), string_values.filter(lambda text: text != "null")),
}


@st.composite
def tool_calls(draw):
    name = draw(st.sampled_from(["files.write", "lookup"]))
    if name == "lookup":
        arguments = draw(st.fixed_dictionaries({}, optional={"query": string_values}))
    else:
        keys = draw(st.lists(st.sampled_from(sorted(ARGUMENT_STRATEGIES)), unique=True, max_size=5))
        arguments = {key: draw(ARGUMENT_STRATEGIES[key]) for key in keys}
    return {"id": "c", "type": "function", "function": {"name": name, "arguments": arguments}}


channel_text = tricky_text.filter(survives_as_channel_text)


@st.composite
def assistant_turns(draw):
    """(messages of one assistant turn, expected reasoning, content, calls)."""
    messages, reasoning_blocks, expected_calls = [], [], []
    for _ in range(draw(st.integers(0, 2))):
        reasoning = draw(channel_text)
        calls = draw(st.lists(tool_calls(), min_size=1, max_size=3))
        messages.append({"role": "assistant", "reasoning_content": reasoning, "tool_calls": calls})
        reasoning_blocks.append(reasoning)
        expected_calls += [(call["function"]["name"], call["function"]["arguments"]) for call in calls]
    reasoning = draw(channel_text)
    content = draw(channel_text)
    messages.append({"role": "assistant", "reasoning_content": reasoning, "content": content})
    reasoning_blocks.append(reasoning)
    expected_reasoning = "\n".join(block for block in reasoning_blocks if block) or None
    return messages, expected_reasoning, content or None, expected_calls


def completion_of(messages) -> str:
    """What the model would have generated: the rendered turn after the prompt's `<|start|>assistant`."""
    rendered = render_chat(
        [{"role": "user", "content": "go"}, *messages],
        tools=TOOLS,
        template=builtin_template_source(),
        add_generation_prompt=False,
        current_date="2026-01-01",
    )
    turn_start = rendered.index("<|start|>user<|message|>go<|eot|>") + len(
        "<|start|>user<|message|>go<|eot|>"
    )
    assert rendered.startswith("<|start|>assistant", turn_start)
    return rendered[turn_start + len("<|start|>assistant") :]


def parse_chunked(text, chunk_sizes, tools=TOOLS):
    parser = OutputParser(tools)
    deltas, position, index = [], 0, 0
    while position < len(text):
        size = chunk_sizes[index % len(chunk_sizes)] if chunk_sizes else len(text)
        deltas.append(parser.feed(text[position : position + size]))
        position += size
        index += 1
    deltas.append(parser.finish())
    return deltas


@PROPERTY_SETTINGS
@given(assistant_turns())
def test_a_rendered_turn_parses_back_to_its_messages(turn):
    messages, reasoning, content, expected_calls = turn
    result = parse_output(completion_of(messages), TOOLS)
    assert result.reasoning == reasoning
    assert result.content == content
    assert [(call.name, json.loads(call.arguments)) for call in result.tool_calls] == expected_calls


GRAMMAR_PIECES = [
    "<|start|>",
    "<|message|>",
    "<|eom|>",
    "<|eot|>",
    "<|end_of_text|>",
    "<|begin_of_text|>",
    "<|eo",
    "<|start",
    " to=self",
    " to=user",
    " to=files.write",
    " to=lookup.lookup",
    "to=lookup",
    " to=",
    "assistant",
    "<atem:function_calls>",
    "</atem:function_calls>",
    '<atem:invoke name="files.write">',
    '<atem:invoke name="lookup.query">',
    '<atem:invoke name="files.write<|message|>',
    '<atem:parameter name="count">',
    '<atem:parameter name="body">',
    '<atem:parameter name="options">',
    "</atem:parameter>",
    "</atem:invoke>",
    "12",
    '{"k": [1]}',
    "NaN",
    " ",
    "\n",
    "x" * 70,
]
raw_turns = st.lists(
    st.one_of(st.sampled_from(GRAMMAR_PIECES), st.text(PLAIN_ALPHABET, max_size=6)), max_size=40
).map("".join)


@PROPERTY_SETTINGS
@given(
    st.one_of(raw_turns, assistant_turns().map(lambda turn: completion_of(turn[0]))),
    st.lists(st.integers(1, 12), min_size=1, max_size=8),
)
def test_streaming_at_any_chunking_equals_one_shot(text, chunk_sizes):
    one_shot = ParsedOutput.from_deltas(parse_chunked(text, []))
    deltas = parse_chunked(text, chunk_sizes)
    assert parsed_key(ParsedOutput.from_deltas(deltas)) == parsed_key(one_shot)
    by_character = ParsedOutput.from_deltas(parse_chunked(text, [1]))
    assert parsed_key(by_character) == parsed_key(one_shot)


@PROPERTY_SETTINGS
@given(
    st.one_of(raw_turns, st.text(), st.binary(max_size=200).map(lambda data: data.decode("latin-1"))),
    st.lists(st.integers(1, 6), min_size=1, max_size=4),
    st.booleans(),
)
def test_arbitrary_text_never_raises_never_leaks_framing_and_numbers_calls_densely(
    text, chunk_sizes, with_tools
):
    deltas = parse_chunked(text, chunk_sizes, TOOLS if with_tools else None)
    result = ParsedOutput.from_deltas(deltas)
    for field in (result.reasoning or "", result.content or ""):
        assert not any(marker in field for marker in FRAMING_MARKERS)
    starts = [piece for delta in deltas for piece in delta.tool_calls if piece.is_start]
    assert [piece.index for piece in starts] == list(range(len(starts)))
    assert len({piece.id for piece in starts}) == len(starts)
    for call in result.tool_calls:
        assert isinstance(json.loads(call.arguments, parse_constant=_refuse), dict)
    if not with_tools:
        assert result.tool_calls == []


def _refuse(name):
    raise AssertionError(f"{name} is not JSON")
