"""The pure-text part of mapping parser output onto the OpenAI chat API (protocol.md §6, P-API-1..5).

The server wraps these objects in its response and chunk envelopes; the shapes of the `message` and
`delta` objects, the finish reason and the reasoning-token count are decided here so that streaming and
non-streaming responses agree (P-API-4).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from glimmer.protocol.deltas import Delta, ParsedOutput


def assistant_message(output: ParsedOutput, *, include_reasoning: bool = True) -> dict[str, Any]:
    """The response `message` (P-API-1).

    `reasoning_content` and its mirror `reasoning` are null when empty or when `include_reasoning` is
    false; `content` is null when empty; `tool_calls` is omitted when there are none.
    """
    reasoning = output.reasoning if include_reasoning else None
    message: dict[str, Any] = {
        "role": "assistant",
        "content": output.content,
        "reasoning_content": reasoning,
        "reasoning": reasoning,
    }
    if output.tool_calls:
        message["tool_calls"] = [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in output.tool_calls
        ]
    return message


def finish_reason(*, has_tool_calls: bool, length_limited: bool) -> str:
    """P-API-2: `length` when the token limit ended generation (even with calls), else `tool_calls` when a
    call is returned, else `stop`."""
    if length_limited:
        return "length"
    return "tool_calls" if has_tool_calls else "stop"


def stream_delta_objects(delta: Delta, *, include_reasoning: bool = True) -> list[dict[str, Any]]:
    """The `choices[0].delta` objects for one parser Delta, one per event, in wire order (P-API-3).

    Reasoning goes in `reasoning_content` and `reasoning`, content in `content`; a call start carries
    `index`, `id`, `type`, `function.name` and the first `function.arguments` fragment, later fragments only
    `index` and `function.arguments`. (The first chunk's `role: "assistant"` is the server's.)
    """
    objects: list[dict[str, Any]] = []
    for kind, payload in delta.events:
        if kind == "reasoning":
            if include_reasoning:
                objects.append({"reasoning_content": payload, "reasoning": payload})
        elif kind == "content":
            objects.append({"content": payload})
        elif payload.is_start:
            objects.append({"tool_calls": [{
                "index": payload.index,
                "id": payload.id,
                "type": "function",
                "function": {"name": payload.name, "arguments": payload.arguments},
            }]})
        else:
            fragment = {"index": payload.index, "function": {"arguments": payload.arguments}}
            objects.append({"tool_calls": [fragment]})
    return objects


def count_reasoning_tokens(token_spans: Sequence[tuple[int, int]],
                           reasoning_spans: Sequence[tuple[int, int]]) -> int:
    """How many generated tokens overlap a reasoning message (P-API-5).

    `token_spans` are the (start, end) character offsets of each generated token in the decoded text fed to
    the parser, in order; `reasoning_spans` come from `OutputParser.reasoning_spans`. A token overlaps a span
    when they share a character (an empty token: when it sits inside the span). Linear in both inputs.
    """
    count = 0
    span_index = 0
    for token_start, token_end in token_spans:
        while span_index < len(reasoning_spans) and reasoning_spans[span_index][1] <= token_start:
            span_index += 1
        if span_index == len(reasoning_spans):
            break
        span_start, span_end = reasoning_spans[span_index]
        if token_end > token_start:
            overlaps = token_start < span_end and span_start < token_end
        else:
            overlaps = span_start <= token_start < span_end
        if overlaps:
            count += 1
    return count
