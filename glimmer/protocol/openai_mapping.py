"""The pure-text part of mapping parser output onto the OpenAI chat API (protocol.md §6, P-API-1..5).

The server wraps these objects in its response and chunk envelopes; the shapes of the `message` and
`delta` objects, the finish reason, the reasoning-token count and which tokens `logprobs.content` lists are
decided here so that streaming and non-streaming responses agree (P-API-4).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

from glimmer.protocol.deltas import Delta, ParsedOutput
from glimmer.protocol.output_parser import OutputParser

T = TypeVar("T")


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
    for token in token_spans:
        while span_index < len(reasoning_spans) and reasoning_spans[span_index][1] <= token[0]:
            span_index += 1
        if span_index == len(reasoning_spans):
            break
        if token_overlaps(token, reasoning_spans[span_index]):
            count += 1
    return count


def token_overlaps(token_span: tuple[int, int], span: tuple[int, int]) -> bool:
    """Whether a generated token's text, (start, end) offsets in the text fed to the parser, shares a character with
    `span`. An empty token (its text still held, a byte of a character the next token completes) overlaps when it
    sits inside the span."""
    token_start, token_end = token_span
    span_start, span_end = span
    if token_end > token_start:
        return token_start < span_end and span_start < token_end
    return span_start <= token_start < span_end


def offset_of_answer_character(content_spans: Sequence[tuple[int, int]], characters: int) -> int | None:
    """Where the answer's first `characters` characters end, as an offset into the text fed to the parser, whose
    `content_spans` hold the answer; None past the answer decided so far. `answer_characters_before`'s inverse."""
    for start, end in content_spans:
        if characters <= end - start:
            return start + characters
        characters -= end - start
    return None


def answer_characters_before(content_spans: Sequence[tuple[int, int]], offset: int) -> int:
    """How many of the answer's characters (`content_spans`, in the text fed to the parser) come before `offset`."""
    before = 0
    for start, end in content_spans:
        if start >= offset:
            break
        before += min(end, offset) - start
    return before


class ContentTokens(Generic[T]):
    """The generated tokens of the answer, picked as `parser` decides their text: what the chat API's
    `logprobs.content` lists. OpenAI defines it as the message content's tokens, so reasoning, tool-call and framing
    tokens (headers, `<|message|>`, terminators) are left out: the listed tokens' texts concatenate to `content`.

    A token counts when its text overlaps `OutputParser.content_spans` (`token_overlaps`), so a token that is part
    framing, part answer counts, and so do the tokens of a stop string that ended the answer (their text reached
    the parser as content before the stop string was matched), as in vLLM, up to the one it ends in (`cut_after`).
    """

    def __init__(self, parser: OutputParser):
        self._parser = parser
        self._pending: deque[tuple[tuple[int, int], T]] = deque()
        self._span_index = 0

    def add(self, token_span: tuple[int, int], item: T) -> None:
        """A generated token: its text's (start, end) offsets in the text fed to the parser, and what to list for it."""
        self._pending.append((token_span, item))

    def cut_after(self, characters: int) -> None:
        """The server ends the answer after its first `characters` characters (where a stop string that ended it ends):
        a token not yet decided whose text starts past them, text the parser held back and released with the stop
        string's, is no answer token (vLLM stops at the token that ends the stop string)."""
        offset = offset_of_answer_character(self._parser.content_spans, characters)
        while offset is not None and self._pending and self._pending[-1][0][0] >= offset:
            self._pending.pop()

    def decided(self, *, final: bool = False) -> list[T]:
        """The items of the tokens whose text the parser decided since the last call (every token left, when
        `final`: the turn is over) that are answer tokens, in order. Linear in the tokens and spans it passes."""
        spans = self._parser.content_spans
        decided_offset = self._parser.decided_offset
        picked = []
        while self._pending:
            token, item = self._pending[0]
            start, end = token
            if not final and (end > decided_offset or start == decided_offset):
                break  # its text may still turn out to be framing
            self._pending.popleft()
            # a span that ends before a decided token can no longer grow: later text is delivered past it
            while self._span_index < len(spans) and spans[self._span_index][1] <= start:
                self._span_index += 1
            if self._span_index < len(spans) and token_overlaps(token, spans[self._span_index]):
                picked.append(item)
        return picked
