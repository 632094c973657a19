"""Streaming parser of a generated Muse Glimmer turn: reasoning, content and ATEM tool calls (protocol.md §4).

The input is the decoded completion with special tokens kept, starting right after the prompt's
`<|start|>assistant`. The parser is one state machine over that text; `parse_output` is the same machine fed
the whole text at once (P-STREAM-1), so streaming and one-shot agree by construction.

Structure, from the outside in:

- **Framing** (`<|start|>`, `<|message|>`, `<|eom|>`, `<|eot|>`, eos, bos) is decided first, everywhere.
  The parser starts as if `<|start|>` had just been read (P-HDR-1). A header candidate runs to the next
  `<|message|>`; it is voided by another marker first or by running past HEADER_SPAN characters, and then
  its `<|start|>` is dropped and its text continues whatever it interrupted (P-HDR-3..5). A complete
  `to=R<|message|>` at the start of a body or after one whitespace character switches channel without a
  header (P-HDR-7).
- **Channels**: `to=self` bodies are reasoning, `to=user` (or no recipient) bodies and text between
  messages are content, other recipients are tool channels whose bodies go to the ATEM scanner, and
  ill-formed headers open a discarded channel (P-CHAN-1..5).
- **Hold-back**: only text that may still turn out to be framing is held — a trailing prefix of a marker, a
  trailing possible headerless switch, an open header candidate — so held text stays under HOLD_MAX and
  everything else streams at once (P-STREAM-3, P-STREAM-4). At the end of the stream held text that did not
  become framing is delivered to its channel (P-STREAM-6).

Every step consumes its input: the parser never re-scans text it has decided, so `feed` costs amortized
O(len(chunk)) (P-STREAM-5). It never raises on any text (P-STREAM-8).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from glimmer.protocol.atem import CLOSING_TAGS, AtemChannel
from glimmer.protocol.atem_markup import AtemMarkupFilter, trailing_tag_start
from glimmer.protocol.call_ledger import CallLedger
from glimmer.protocol.deltas import Delta, ParsedOutput, ToolCallDelta
from glimmer.protocol.headers import (
    HEADERLESS_SWITCH,
    SWITCH_PREFIX_AFTER_SPACE,
    SWITCH_PREFIX_AT_START,
    SWITCH_PREFIX_SPAN,
    Channel,
    channel_of_recipient,
    is_interrupted_header,
    read_header,
)
from glimmer.protocol.marker_safe_text import MarkerSafeText
from glimmer.protocol.tokens import (
    BOS,
    EOM,
    FRAMING_MARKERS,
    HEADER_SPAN,
    MESSAGE,
    RECIPIENT_MAX,
    START,
)
from glimmer.protocol.tool_registry import ToolRegistry

logger = logging.getLogger(__name__)

_new_delta = tuple.__new__  # Delta is a tuple; the fast path builds it directly

_MARKER = re.compile("|".join(re.escape(marker) for marker in FRAMING_MARKERS))
_MARKER_PREFIXES = frozenset(marker[:cut] for marker in FRAMING_MARKERS for cut in range(1, len(marker)))
_LONGEST_MARKER = max(len(marker) for marker in FRAMING_MARKERS)
_WHITESPACE = re.compile(r"\s*")
_RESIDUE_RUN = re.compile(r"(?:\s|" + "|".join(re.escape(tag) for tag in CLOSING_TAGS) + r")*")
_SWITCH_LOOKBACK = 1 + len("to=") + RECIPIENT_MAX

# Where the parser is: inside a header candidate, or in a body (a message's, or text between messages).
_HEADER = "header"
_BODY = "body"
# The body between a terminator and the next header (P-CHAN-1): content, minus its leading whitespace.
_ORPHAN = "orphan"

OpenChannel = Literal["reasoning", "content", "tool", "discarded"]


class OutputParser:
    """Incremental parser of one generated turn.

    `tools` are the request's declared tools (OpenAI-style or bare function objects); with none, tool
    channels yield no calls (P-NAME-4; pass None for `tool_choice="none"`). `continue_recipient` is for a
    continued final assistant message (P-TMPL-8): the parser then starts inside that message's channel
    (`"self"`, `"user"` or a tool name) instead of header-open. `continue_prefix` is that message's body as the
    prompt holds it: a tool channel's ATEM is read from it on, so that a call the prefix began comes back whole,
    its start (and any parameter the prefix completed) with the first delta; reasoning and content continue
    without it (the reply never repeats the prompt), and the reply's reasoning added to a reasoning prefix gives the
    whole reasoning (P-CHAN-4). Its last character decides whether the reply may open with a headerless switch
    (P-HDR-7), as in the whole body. `verbatim_content`: the answer is grammar-
    constrained (structured outputs), so content bodies are delivered as written, ATEM-like text included
    (P-CHAN-2), without the markup filter that drops a tag cut short at a body's end. `mark_messages`: each
    reasoning or content message a header opens sends a `("message", channel)` event before its first text, so that
    a reader can tell two messages of one channel apart (the Responses API makes an output item of each); orphan text
    continues the content before it.

    State the engine reads (all O(1)): `channel`, `other_role_header_seen`, `reasoning_spans`, `content_spans`,
    `decided_offset`, `valid_call_names`, `has_valid_call`, `unresolved_call_count`, `turn_ended`.
    """

    def __init__(self, tools: Iterable[Mapping[str, Any]] | None = None, *,
                 continue_recipient: str | None = None, continue_prefix: str = "", verbatim_content: bool = False,
                 mark_messages: bool = False):
        self._tools = ToolRegistry(tools)
        self._mark_messages = mark_messages
        self._message_unmarked = False  # the open message's `("message", channel)` event is still to be sent
        self._verbatim_content = verbatim_content
        self._events: list[list[Any]] = []
        self._ledger = CallLedger(self._emit_call)
        self._reasoning_text = MarkerSafeText()
        self._content_text = MarkerSafeText()
        self._buffer = ""
        self._buffer_offset = 0  # offset of self._buffer[0] in the text fed so far
        self._fed = 0
        self._finished = False
        self._channel_at_finish: OpenChannel | None = None
        self._fast_channel: str | None = None
        self._append_value_text: Callable[[str], None] = _ignore_text

        self._mode = _HEADER
        self._header_start = 0
        self._header_is_real = False
        self._channel: str = _ORPHAN
        self._at_body_start = True
        self._atem: AtemChannel | None = None
        self._dropped_characters = 0
        self._markup = AtemMarkupFilter()

        self._reasoning_seen = False
        self._reasoning_block_has_text = False
        self._message_has_text = False  # the open reasoning or content message delivered text: it has an output
        self._calls_before_message = 0  # the calls started before the open message
        self._reasoning_span_start = 0
        self._closed_reasoning_spans: list[tuple[int, int]] = []
        self._content_spans: list[tuple[int, int]] = []
        self._other_role_header_seen = False
        self._turn_ended = False

        if continue_recipient is not None:
            self._mode = _BODY
            self._open_message(channel_of_recipient(continue_recipient), continue_recipient, 0)
            # The body started in the prompt: the reply starts where a headerless switch may stand (P-HDR-7) only when
            # the prefix is empty or ends in whitespace
            self._at_body_start = not continue_prefix or continue_prefix[-1].isspace()
            self._message_has_text = bool(continue_prefix)
            if self._channel == "reasoning" and continue_prefix:
                # the prefix is the reasoning block's text: the next block joins it with a newline (P-CHAN-4)
                self._reasoning_seen = self._reasoning_block_has_text = True
            if self._channel == "tool" and self._atem is not None and continue_prefix:
                # The prefix is body text of the prompt: no framing to decide in it. What it completes goes out
                # with the first delta, so the fast path, which would skip those events, waits for it.
                self._atem.feed(continue_prefix)
        self._fast_channel = None if self._events else self._fast_path_channel()

    # -- state the engine reads -----------------------------------------------------------------------------

    @property
    def channel(self) -> OpenChannel | None:
        """Class of the open message; None between messages and inside a header (P-REQ-6, P-REQ-7)."""
        if self._mode is _HEADER or self._channel == _ORPHAN:
            return None
        return self._channel  # type: ignore[return-value]

    @property
    def channel_at_finish(self) -> OpenChannel | None:
        """After `finish`: the class of the message the output ended inside (a limit or an abort cut it before its
        terminator; an unfinished turn-start header counts as the content it is delivered as, P-HDR-6); None when
        it ended between messages, inside a later message's header, or inside a message that had delivered nothing
        yet (no text, no call), every message before it whole."""
        return self._channel_at_finish

    @property
    def other_role_header_seen(self) -> bool:
        """A header for `user`, `system`, `developer` or `tool` was read: the engine should stop (P-HDR-8)."""
        return self._other_role_header_seen

    @property
    def reasoning_spans(self) -> list[tuple[int, int]]:
        """(start, end) character offsets into the fed text of each reasoning message, from its header start
        (or the turn start) through its terminator; an open one ends at the text fed so far (P-API-5)."""
        if self._channel == "reasoning" and not self._finished:
            return [*self._closed_reasoning_spans, (self._reasoning_span_start, self._fed)]
        return list(self._closed_reasoning_spans)

    @property
    def content_spans(self) -> list[tuple[int, int]]:
        """(start, end) character offsets into the fed text of the body text delivered to content (content
        messages and orphan text), in order, adjacent pieces merged. Framing, headers, the orphan whitespace left
        out (P-CHAN-1) and the whitespace before a headerless switch lie outside them. Grows as text is decided;
        the caller must not modify it."""
        return self._content_spans

    @property
    def decided_offset(self) -> int:
        """How much of the fed text is decided; what follows is held back (P-STREAM-3). All of it after `finish`."""
        return self._fed - len(self._buffer)

    @property
    def valid_call_names(self) -> list[str]:
        """Names of finished calls that name a declared tool (arguments are always objects) (P-REQ-4)."""
        return self._ledger.valid_call_names

    @property
    def has_valid_call(self) -> bool:
        return bool(self._ledger.valid_call_names)

    @property
    def unresolved_call_count(self) -> int:
        """Finished calls whose name matched no declared tool (P-NAME-3)."""
        return self._ledger.unresolved_call_count

    @property
    def turn_ended(self) -> bool:
        """`<|eot|>` or eos was read."""
        return self._turn_ended

    # -- input ----------------------------------------------------------------------------------------------

    def feed(self, chunk: str) -> Delta:
        """Parse the next piece of decoded text; returns what it decided."""
        fast = self._fast_channel
        if fast is not None:
            # The streaming fast path, for plain text in the middle of a reasoning, content or value body.
            # Text without `<|` and `to=` holds no framing; only its end may still grow into some: a `<`
            # before `|`, or whitespace, `\st`, `\sto` before a headerless switch (then held back).
            text = self._buffer + chunk if self._buffer else chunk
            if text and "to=" not in text and "<|" not in text:
                last = text[-1]
                held = 0
                if last <= " " or last in "<to" or (last >= "\x85" and last.isspace()):
                    if last.isspace():
                        held = 1
                    elif last == "t":
                        held = 2 if len(text) > 1 and text[-2].isspace() else 0
                    elif last == "o":
                        held = 3 if len(text) > 2 and text[-2] == "t" and text[-3].isspace() else 0
                    elif last == "<":
                        held = -1
                decided = text[:-held] if held > 0 else text
                # Reasoning/content ending in `<` could spell a marker with text after a removed piece:
                # MarkerSafeText on the slow path tracks that; a trailing ATEM tag fragment is held there too.
                if held >= 0 and (fast == "value" or (decided[-1:] != "<" and trailing_tag_start(decided) < 0)):
                    if fast == "content":
                        self._add_content_span(self._fed - len(self._buffer), len(decided))
                    self._fed += len(chunk)
                    self._buffer = text[-held:] if held else ""
                    if fast == "content":
                        return _new_delta(Delta, ("", decided, [], None))
                    if fast == "reasoning":
                        return _new_delta(Delta, (decided, "", [], None))
                    # No ATEM closer can start in it (a `<` right before held whitespace starts none).
                    if "</" not in decided and (held > 0 or decided[-1:] != "<"):
                        self._append_value_text(decided)
                        return _new_delta(Delta, ("", "", [], None))
                    self._atem.feed(decided)  # type: ignore[union-attr]
                    self._fast_channel = self._fast_path_channel()
                    return self._delta()
        if not chunk or self._finished:
            return Delta()
        self._fed += len(chunk)
        self._run(self._buffer + chunk, final=False)
        self._fast_channel = self._fast_path_channel()
        return self._delta()

    def finish(self) -> Delta:
        """End of stream (eos, stop, max_tokens or abort): deliver or settle everything held (P-STREAM-6)."""
        if self._finished:
            return Delta()
        in_turn_start_header = self._mode is _HEADER and not self._header_is_real
        self._run(self._buffer, final=True)
        # an unfinished turn-start header is delivered as the content it then is (P-HDR-6)
        channel = "content" if in_turn_start_header else self.channel
        self._end_body(self._fed)
        # a message cut before it delivered anything (no text yet, no call started) cut no output: what came before
        # it was whole
        cut_nothing = (channel == "tool" and self._ledger.count == self._calls_before_message) or (
            channel in ("reasoning", "content") and not in_turn_start_header and not self._message_has_text)
        self._channel_at_finish = None if cut_nothing else channel
        for kind, text in (("reasoning", self._reasoning_text), ("content", self._content_text)):
            held = text.flush()
            if held:
                self._emit_text(kind, held)
        self._finished = True
        self._fast_channel = None
        return self._delta()

    # -- the machine ----------------------------------------------------------------------------------------

    def _run(self, text: str, final: bool) -> None:
        """Scan `text` (the held buffer plus new input) as far as it can be decided.

        Each scanner returns the position to continue from, or `~position` (negative) to stop there and hold
        the rest.
        """
        self._buffer_offset = self._fed - len(text)
        position = 0
        while True:
            if self._mode is _HEADER:
                position = self._scan_header(text, position, final)
            else:
                position = self._scan_body(text, position, final)
            if position < 0:
                position = ~position
                break
        self._buffer = text[position:]

    def _scan_header(self, text: str, position: int, final: bool) -> int:
        """Decide the header candidate starting at `position` (right after its `<|start|>`)."""
        window_end = min(len(text), position + HEADER_SPAN + len(MESSAGE))
        marker = _MARKER.search(text, position, window_end)
        if marker is not None:
            if marker.group() == MESSAGE and marker.start() - position <= HEADER_SPAN:
                self._open_header_message(text[position:marker.start()])
                return marker.end()
            # P-HDR-4: another marker before `<|message|>` (or P-HDR-3: `<|message|>` too far away).
            return self._void_header(position, "a framing marker comes before <|message|>")
        if len(text) - position >= HEADER_SPAN + len(MESSAGE):
            return self._void_header(position, f"no <|message|> within {HEADER_SPAN} characters")
        if not final:
            return ~position
        # P-HDR-6: the stream ended inside the header.
        if self._header_is_real and is_interrupted_header(text[position:]):
            self._mode = _BODY
            return len(text)
        return self._void_header(position, "the stream ended inside it")

    def _void_header(self, position: int, reason: str) -> int:
        # P-HDR-5: not a header. Its `<|start|>` is dropped and its text continues the interrupted context.
        # (Debug level: a model looping on stray markers would otherwise flood the log.)
        if self._header_is_real:
            logger.debug("ignoring a <|start|> that opens no header: %s", reason)
        self._mode = _BODY
        return position

    def _open_header_message(self, header_text: str) -> None:
        header = read_header(header_text)
        if header.names_other_role:
            self._other_role_header_seen = True
        self._mode = _BODY
        self._end_body(self._header_start)
        self._open_message(header.channel, header.recipient, self._header_start)
        if header.channel == "discarded":
            logger.warning("discarding a message with the ill-formed header %r", header_text[:HEADER_SPAN])

    def _scan_body(self, text: str, position: int, final: bool) -> int:
        """Consume body text from `position` up to the next framing decision."""
        length = len(text)
        if position >= length:
            return ~position
        # After an interrupted call, reasoning and content text passes the markup filter in residue mode (see
        # `_deliver`); a tool body only drops a leading run of closing tags.
        tool_residue = self._markup.residue and self._channel in ("tool", "discarded")
        if tool_residue or (self._at_body_start and self._channel == _ORPHAN and not self._markup.residue):
            dropped_end = (_RESIDUE_RUN if tool_residue else _WHITESPACE).match(text, position).end()
            if dropped_end > position:
                return dropped_end
            if tool_residue:
                if not final and _could_become_closing_tag(text, position):
                    return ~position
                if not self._framing_at(text, position, final):
                    self._markup.end_residue()  # P-CHAN-7: in a tool body the first other character ends it
        scan = position
        while True:
            marker_start = text.find("<|", scan)
            if marker_start < 0:
                break
            marker = _MARKER.match(text, marker_start)
            if marker is not None:
                return self._on_marker(text, position, marker)
            if not final and length - marker_start < _LONGEST_MARKER:
                if text[marker_start:] in _MARKER_PREFIXES:
                    break
            scan = marker_start + 1
        end = length if final else self._undecided_start(text, position)
        if end > position:
            self._deliver(text, position, end)
        return ~end

    def _on_marker(self, text: str, position: int, marker: re.Match[str]) -> int:
        token = marker.group()
        start = marker.start()
        if token == MESSAGE:
            switch = self._headerless_switch(text, position, start)
            if switch is not None:
                self._deliver(text, position, switch.start())
                switch_offset = self._buffer_offset + switch.start()
                recipient = switch.group(2)
                self._end_body(switch_offset)
                self._open_message(channel_of_recipient(recipient), recipient, switch_offset)
            elif self._channel == "tool" and self._atem is not None:
                # Inside a tool body a stray <|message|> is literal text (P-ATEM-2, P-ATEM-7).
                self._deliver(text, position, marker.end())
            else:
                self._deliver(text, position, start)  # P-CHAN-6: a stray <|message|> is removed
            return marker.end()
        self._deliver(text, position, start)
        if token == START:
            self._mode = _HEADER
            self._header_start = self._buffer_offset + start
            self._header_is_real = True
        elif token != BOS:  # a terminator; a bos inside a turn means nothing and is dropped
            self._end_body(self._buffer_offset + marker.end())
            if token != EOM:
                self._turn_ended = True
        return marker.end()

    def _headerless_switch(self, text: str, position: int, marker_start: int) -> re.Match[str] | None:
        """`to=R` right before the `<|message|>` at `marker_start`, if it switches channel (P-HDR-7)."""
        lookback = max(position, marker_start - _SWITCH_LOOKBACK)
        match = HEADERLESS_SWITCH.search(text, lookback, marker_start)
        if match is None:
            return None
        if match.group(1) or (match.start() == position and self._at_body_start):
            return match
        return None

    def _undecided_start(self, text: str, position: int) -> int:
        """Where the trailing text that may still become framing begins (P-STREAM-3)."""
        length = len(text)
        hold = length
        tag_start = text.rfind("<", max(position, length - _LONGEST_MARKER + 1))
        if tag_start >= 0 and text[tag_start:] in _MARKER_PREFIXES:
            hold = tag_start
        # A headerless switch in progress: `\s` then a prefix of `to=R<|message|>`. Without a `to=` in reach
        # only `\s`, `\st` or `\sto` at the very end can be one.
        window = max(position, length - SWITCH_PREFIX_SPAN)
        if text.find("to=", window) >= 0:
            switch = SWITCH_PREFIX_AFTER_SPACE.search(text, window)
            if switch is not None and switch.start() < hold:
                hold = switch.start()
        else:
            tail = _short_switch_tail(text, position)
            if tail and length - tail < hold:
                hold = length - tail
        if self._at_body_start and text[position] == "t" and SWITCH_PREFIX_AT_START.fullmatch(text, position):
            hold = position
        return hold

    def _framing_at(self, text: str, position: int, final: bool) -> bool:
        if _MARKER.match(text, position):
            return True
        return not final and len(text) - position < _LONGEST_MARKER and text[position:] in _MARKER_PREFIXES

    # -- messages -------------------------------------------------------------------------------------------

    def _open_message(self, channel: Channel, recipient: str | None, start_offset: int) -> None:
        self._channel = channel
        self._message_unmarked = self._mark_messages and channel in ("reasoning", "content")
        self._message_has_text = False
        self._calls_before_message = self._ledger.count
        self._at_body_start = True
        self._dropped_characters = 0
        if channel == "reasoning":
            self._reasoning_span_start = start_offset
            self._reasoning_block_has_text = False
        elif channel == "tool":
            if self._tools:
                self._atem = AtemChannel(recipient or "", self._tools, self._ledger)
            else:
                self._atem = None

    def _end_body(self, end_offset: int) -> None:
        channel = self._channel
        if channel not in ("tool", "discarded"):
            self._route(self._markup.end_body())
        if channel == "tool":
            if self._atem is not None:
                if self._atem.close():
                    self._markup.start_residue()
                self._atem = None
            else:
                logger.warning("tool channel without declared tools: its body (%d characters) yields no "
                               "calls", self._dropped_characters)
        elif channel == "discarded" and self._dropped_characters:
            logger.warning("dropped %d characters of a discarded message", self._dropped_characters)
        elif channel == "reasoning":
            self._closed_reasoning_spans.append((self._reasoning_span_start, end_offset))
        self._channel = _ORPHAN
        self._message_unmarked = False
        self._at_body_start = True
        self._dropped_characters = 0

    def _deliver(self, text: str, start: int, end: int) -> None:
        """Route decided body text, `text[start:end]`, to the open channel."""
        if end <= start:
            return
        if self._channel == "content" or self._channel == _ORPHAN:
            self._add_content_span(self._buffer_offset + start, end - start)
        text = text[start:end]
        self._at_body_start = False
        if self._channel in ("reasoning", _ORPHAN) or (self._channel == "content" and not self._verbatim_content):
            for part in self._markup.accept(text):  # P-CHAN-2, P-CHAN-7: no cut or residual ATEM tag shows
                self._route(part)
            return
        self._route(text)

    def _route(self, text: str) -> None:
        if not text:
            return
        channel = self._channel
        if self._message_unmarked:  # sent with the message's first text: an empty message makes no event
            self._message_unmarked = False
            self._events.append(["message", channel])
        if channel in ("reasoning", "content"):
            self._message_has_text = True
        if channel == "reasoning":
            if not self._reasoning_block_has_text:
                # P-CHAN-4: reasoning blocks are joined by one newline, sent with the next block's first text.
                self._reasoning_block_has_text = True
                if self._reasoning_seen:
                    text = "\n" + text
                self._reasoning_seen = True
            self._emit_text("reasoning", self._reasoning_text.accept(text))
        elif channel == "content" or channel == _ORPHAN:
            self._emit_text("content", self._content_text.accept(text))
        elif channel == "tool" and self._atem is not None:
            self._atem.feed(text)
        else:
            self._dropped_characters += len(text)

    def _add_content_span(self, start_offset: int, length: int) -> None:
        spans = self._content_spans
        if spans and spans[-1][1] == start_offset:
            spans[-1] = (spans[-1][0], start_offset + length)
        else:
            spans.append((start_offset, start_offset + length))

    # -- output ---------------------------------------------------------------------------------------------

    def _emit_text(self, kind: str, text: str) -> None:
        if not text:
            return
        events = self._events
        if events and events[-1][0] == kind:
            events[-1][1].append(text)
        else:
            events.append([kind, [text]])

    def _emit_call(self, piece: ToolCallDelta) -> None:
        self._events.append(["tool_call", piece])

    def _delta(self) -> Delta:
        """The events since the last delta, as one Delta; they are drained (every path that emits ends here)."""
        if len(self._events) == 1 and self._events[0][0] in ("reasoning", "content"):
            kind, parts = self._events[0]
            self._events = []
            return Delta.single(kind, "".join(parts))
        events: list[Any] = []
        for kind, payload in self._events:
            events.append((kind, "".join(payload)) if kind in ("reasoning", "content") else (kind, payload))
        self._events = []
        return Delta.from_events(events)

    def _fast_path_channel(self) -> str | None:
        """Which channel plain text can go to without scanning, or None (see `feed`)."""
        if ("<" in self._buffer or self._mode is _HEADER or self._at_body_start or self._message_unmarked
                or not self._markup.is_settled):
            return None
        channel = self._channel
        if channel == "content" or channel == _ORPHAN:
            return "content" if self._content_text.is_settled else None
        if channel == "reasoning":
            settled = self._reasoning_block_has_text and self._reasoning_text.is_settled
            return "reasoning" if settled else None
        if channel == "tool" and self._atem is not None and self._atem.accepts_plain_value_text:
            self._append_value_text = self._atem.append_plain_value_text
            return "value"
        return None


def _short_switch_tail(text: str, position: int) -> int:
    r"""Length of a trailing `\s`, `\st` or `\sto` in `text[position:]` (a switch that may follow), or 0."""
    last = text[-1]
    if last.isspace():
        return 1
    length = len(text)
    if last == "t":
        return 2 if length - position > 1 and text[-2].isspace() else 0
    if last == "o" and length - position > 2 and text[-2] == "t" and text[-3].isspace():
        return 3
    return 0


def _ignore_text(text: str) -> None:
    pass


def _could_become_closing_tag(text: str, position: int) -> bool:
    rest_length = len(text) - position
    return any(rest_length < len(tag) and tag.startswith(text[position:]) for tag in CLOSING_TAGS)


def parse_output(text: str, tools: Iterable[Mapping[str, Any]] | None = None, *, continue_recipient: str | None = None,
                 continue_prefix: str = "", verbatim_content: bool = False) -> ParsedOutput:
    """Parse a whole turn: by definition, an OutputParser fed all of `text` at once, then finished (the arguments
    are the OutputParser's)."""
    parser = OutputParser(tools, continue_recipient=continue_recipient, continue_prefix=continue_prefix,
                          verbatim_content=verbatim_content)
    return ParsedOutput.from_deltas([parser.feed(text), parser.finish()])
