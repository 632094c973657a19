"""What the output parser emits: streaming deltas and the assembled one-shot result."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

EventKind = Literal["reasoning", "content", "tool_call", "message"]


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of one tool call, OpenAI streaming style (P-ATEM-4, P-API-3).

    The first delta of a call carries its `id` and `name` (the call start); later ones carry only the
    `index` and an `arguments` fragment. A call's fragments concatenate to its JSON object text.
    """

    index: int
    id: str | None
    name: str | None
    arguments: str

    @property
    def is_start(self) -> bool:
        return self.id is not None


Event = (
    tuple[Literal["reasoning"], str]
    | tuple[Literal["content"], str]
    | tuple[Literal["tool_call"], ToolCallDelta]
    | tuple[Literal["message"], Literal["reasoning", "content"]]
)
"""One piece of parser output, in wire order. A `("message", channel)` event (only from a parser made with
`mark_messages`) says that a message of that channel starts: the text that follows is its own, not the one before's."""


_new_tuple = tuple.__new__


class Delta(tuple):
    """What one `OutputParser.feed` (or `finish`) produced.

    `reasoning` and `content` are the new text of each channel and `tool_calls` the new call pieces.
    `events` is the same output in wire order across kinds (P-STREAM-7): `("reasoning", text)`,
    `("content", text)`, `("tool_call", ToolCallDelta)` and, from a parser made with `mark_messages`,
    `("message", channel)` items, adjacent text of one kind (and one message) merged.
    A Delta is falsy when it carries nothing. (It is a tuple underneath only because the parser makes one
    per chunk and a tuple is the cheapest object Python builds.)
    """

    __slots__ = ()

    def __new__(cls, reasoning: str = "", content: str = "", tool_calls: list[ToolCallDelta] | None = None,
                events: list[Event] | None = None) -> Delta:
        return _new_tuple(cls, (reasoning, content, [] if tool_calls is None else tool_calls, events))

    @classmethod
    def single(cls, kind: Literal["reasoning", "content"], text: str) -> Delta:
        """A Delta of one text event (the parser's fast path)."""
        if kind == "reasoning":
            return _new_tuple(cls, (text, "", [], None))
        return _new_tuple(cls, ("", text, [], None))

    @classmethod
    def from_events(cls, events: list[Event]) -> Delta:
        reasoning = [text for kind, text in events if kind == "reasoning"]
        content = [text for kind, text in events if kind == "content"]
        calls = [call for kind, call in events if kind == "tool_call"]
        return _new_tuple(cls, ("".join(reasoning), "".join(content), calls, events))

    @property
    def reasoning(self) -> str:
        return self[0]

    @property
    def content(self) -> str:
        return self[1]

    @property
    def tool_calls(self) -> list[ToolCallDelta]:
        return self[2]

    @property
    def events(self) -> list[Event]:
        ordered = self[3]
        if ordered is not None:
            return ordered
        # Built without an explicit order: at most one kind of text (see `single`).
        events: list[Event] = []
        if self[0]:
            events.append(("reasoning", self[0]))
        if self[1]:
            events.append(("content", self[1]))
        events.extend(("tool_call", call) for call in self[2])
        return events

    def __bool__(self) -> bool:
        return bool(self[0] or self[1] or self[2])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Delta):
            return NotImplemented
        return self.events == other.events

    def __ne__(self, other: object) -> bool:
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Delta(reasoning={self[0]!r}, content={self[1]!r}, tool_calls={self[2]!r})"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A complete tool call: `arguments` is the JSON object text (`json.dumps`, ensure_ascii=False)."""

    id: str
    name: str
    arguments: str


@dataclass(slots=True)
class ParsedOutput:
    """A whole turn: reasoning and content are None when empty (P-API-1)."""

    reasoning: str | None
    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)

    @classmethod
    def from_deltas(cls, deltas: Iterable[Delta]) -> ParsedOutput:
        """Assemble streamed deltas; equal to `parse_output` of the same text, ids aside (P-API-4)."""
        reasoning: list[str] = []
        content: list[str] = []
        starts: dict[int, ToolCallDelta] = {}
        arguments: dict[int, list[str]] = {}
        for delta in deltas:
            reasoning.append(delta.reasoning)
            content.append(delta.content)
            for piece in delta.tool_calls:
                if piece.is_start:
                    starts[piece.index] = piece
                arguments.setdefault(piece.index, []).append(piece.arguments)
        calls = [
            ToolCall(start.id or "", start.name or "", "".join(arguments[index]))
            for index, start in sorted(starts.items())
        ]
        return cls("".join(reasoning) or None, "".join(content) or None, calls)
