"""Helpers shared by the protocol tests (importable because conftest.py puts this folder on sys.path).

`parse_all_ways` is the workhorse of the parser tests: every shape a test pins is parsed one-shot, one
character at a time, in fixed-size chunks and in random chunkings, and must come out the same every way
(P-STREAM-1), so each unit test doubles as a streaming test.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Mapping
from typing import Any

from glimmer.protocol import OutputParser, ParsedOutput, parse_output
from glimmer.protocol.tokens import FRAMING_MARKERS

CALENDAR_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "calendar.lookup",
            "description": "Events on a day.",
            "parameters": {
                "type": "object",
                "properties": {"day": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["day"],
            },
        },
    },
    {
        "name": "lookup",
        "description": "A bare (unwrapped) tool without namespace.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
    },
]


def parsed_key(result: ParsedOutput) -> tuple:
    """What must agree between parses: everything but the call ids."""
    return result.reasoning, result.content, [(call.name, call.arguments) for call in result.tool_calls]


def parse_in_chunks(
    text: str, sizes: Iterable[int], tools: Any = None, **parser_options: Any
) -> ParsedOutput:
    parser = OutputParser(tools, **parser_options)
    deltas = []
    position = 0
    sizes = iter(sizes)
    while position < len(text):
        size = next(sizes)
        deltas.append(parser.feed(text[position : position + size]))
        position += size
    deltas.append(parser.finish())
    return ParsedOutput.from_deltas(deltas)


def _random_sizes(seed: int) -> Iterable[int]:
    generator = random.Random(seed)
    while True:
        yield generator.randint(1, 9)


def _constant(size: int) -> Iterable[int]:
    while True:
        yield size


def parse_all_ways(text: str, tools: Any = None, **parser_options: Any) -> ParsedOutput:
    """The one-shot parse of `text`, after checking that every chunking gives the same result."""
    parser = OutputParser(tools, **parser_options)
    one_shot = ParsedOutput.from_deltas([parser.feed(text), parser.finish()])
    assert parsed_key(one_shot) == parsed_key(parse_output(text, tools, **parser_options))
    chunkings = [_constant(size) for size in (1, 2, 3, 4, 7, 16)] + [_random_sizes(seed) for seed in range(4)]
    for sizes in chunkings:
        streamed = parse_in_chunks(text, sizes, tools, **parser_options)
        assert parsed_key(streamed) == parsed_key(one_shot), f"chunking changed the result of {text!r}"
    for call in one_shot.tool_calls:
        assert isinstance(json.loads(call.arguments), dict)
    for field in (one_shot.reasoning or "", one_shot.content or ""):
        assert not any(marker in field for marker in FRAMING_MARKERS), field
    return one_shot


def calls(result: ParsedOutput) -> list[tuple[str, dict]]:
    return [(call.name, json.loads(call.arguments)) for call in result.tool_calls]


def tool_message(recipient: str, body: str, *, first: bool = False) -> str:
    """A tool-channel message as the model writes it (`first`: the bare turn-start header)."""
    header = f" to={recipient}" if first else f"<|start|>assistant to={recipient}"
    return f"{header}<|message|>{body}"


def atem(name: str, parameters: Mapping[str, str]) -> str:
    """An ATEM block with the template's layout: one newline after each tag."""
    lines = [f'<atem:function_calls>\n<atem:invoke name="{name}">\n']
    lines += [f'<atem:parameter name="{key}">{value}</atem:parameter>\n' for key, value in parameters.items()]
    lines.append("</atem:invoke>\n</atem:function_calls>")
    return "".join(lines)
