"""One choice of a chat completion: the engine's text deltas in, protocol events out.

Each choice has its own `OutputParser` (P-API-1..3). On top of the parser the server applies what the
request asked for, the same way whether the response streams or not (P-API-4):

- `stop` strings match the answer (content) text only, never reasoning or tool bodies (P-REQ-2). Content
  that may be the start of a stop string is held until decided; a stop string does not span an event of
  another kind (held content is released before it). A match ends the choice with `stop`.
- `parallel_tool_calls: false` keeps the first call only and ends the choice once it is finished.
- A header naming another role (`user`, `tool`, `system`) ends the choice: the model is inventing the next
  turn (P-HDR-8).
- Special tokens other than the framing markers (`<|image_end|>`, say) are left out of the parser's input,
  so reasoning and content never show them, unless the request sets `skip_special_tokens: false`. The
  engine leaves them out of the text (`hidden_token_ids`) before their bytes are decoded, so a character whose
  bytes one splits comes out whole; it keeps every other special token (P-REQ-1): the framing must reach the parser.
- Logprobs are those of the answer's tokens (`ContentTokens`): a token's entry is released once the parser
  has decided its text, so the entries streamed add up to the non-streamed list. The U+FFFD of bytes that
  earlier tokens left incomplete, which comes at the start of the next token's text, is the earlier tokens'
  text: the `<|eot|>` after an answer that ends in a truncated character is no answer token.

A choice that ends for one of these reasons is `done` while the engine may still be generating it; the
handler aborts the request once every choice is done.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from glimmer.engine.outputs import StepDelta
from glimmer.engine.sampler import TokenLogprobs
from glimmer.engine.stop_strings import StopStringMatcher
from glimmer.protocol import ContentTokens, OutputParser, count_reasoning_tokens, finish_reason
from glimmer.protocol.deltas import Event, ToolCallDelta
from glimmer.protocol.openai_mapping import answer_characters_before


@dataclass(frozen=True)
class Released:
    """What reading one token of a choice released: the parser's events, and the logprobs of the answer tokens whose
    text they decided (a stream sends them with those events)."""

    events: list[Event]
    logprobs: list[TokenLogprobs]


def coalesced(released: list[Released]) -> list[Released]:
    """What one engine delta released, adjacent pieces of one kind joined: a delta coalesced for a client slower than
    the engine goes out as one chunk per run of reasoning, answer or call arguments instead of one or more per token.
    Each result holds one event, or none and logprobs. Each answer token's logprobs stay with the text that carries
    them: entries whose text is still held back (a possible stop string) join the answer text that follows them in
    the delta, or keep a result of their own, as they would without coalescing; concatenated, the results hold what
    `released` held (P-API-4)."""
    if len(released) == 1 and len(released[0].events) <= 1:
        return released
    out: list[Released] = []
    for step in released:
        carrier = next((i for i, (kind, _) in enumerate(step.events) if kind == "content"), None)
        pieces = [Released([event], step.logprobs if i == carrier else []) for i, event in enumerate(step.events)]
        if carrier is None and step.logprobs:
            pieces.append(Released([], step.logprobs))
        for piece in pieces:
            joined = _joined(out[-1], piece) if out else None
            if joined is None:
                out.append(piece)
            else:
                out[-1] = joined
    return out


def _joined(first: Released, second: Released) -> Released | None:
    """`first` followed by `second` as one piece of `coalesced`, or None where they go apart."""
    logprobs = first.logprobs + second.logprobs
    if not second.events:
        return None if first.events else Released([], logprobs)
    (kind, payload), = second.events
    if not first.events:  # held-back entries go with the answer text that follows them
        return Released(second.events, logprobs) if kind == "content" else None
    (first_kind, first_payload), = first.events
    if kind != first_kind or kind == "message":  # each message start stays an event of its own
        return None
    if kind == "tool_call":
        if payload.is_start or payload.index != first_payload.index:
            return None
        call = ToolCallDelta(first_payload.index, first_payload.id, first_payload.name,
                             first_payload.arguments + payload.arguments)
        return Released([("tool_call", call)], logprobs)
    return Released([(kind, first_payload + payload)], logprobs)


class ChoiceStream:
    def __init__(self, index: int, tools: Iterable[Mapping[str, Any]] | None, *, stop: list[str],
                 single_call: bool, include_stop: bool = False, hidden_tokens: Collection[int] = (),
                 min_tokens: int = 0, verbatim_content: bool = False, continue_recipient: str | None = None,
                 continue_prefix: str = "", mark_messages: bool = False):
        """min_tokens: a stop string counts only where it ends in the text of a token after the min_tokens-th;
        verbatim_content: the answer is grammar-constrained, its text goes to content as written; continue_recipient:
        the prompt ends inside a message to this recipient, which the reply continues, and continue_prefix is that
        message's body in the prompt; mark_messages: a `("message", channel)` event starts each reasoning or content
        message (all four OutputParser's); hidden_tokens: the special tokens the engine left out of the text
        (`hidden_token_ids`), which have no answer logprob."""
        self.index = index
        self._min_tokens = min_tokens
        self._hidden_tokens = frozenset(hidden_tokens)
        self.parser = OutputParser(tools, continue_recipient=continue_recipient, continue_prefix=continue_prefix,
                                   verbatim_content=verbatim_content, mark_messages=mark_messages)
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None  # the stop token id or stop string that ended it (vLLM's field)
        self.num_tokens = 0
        self.num_cached_tokens = 0
        # the logprobs of the answer's tokens (chat `logprobs.content`), and those of them the last `feed` decided
        self.content_logprobs: list[TokenLogprobs] = []
        self.new_content_logprobs: list[TokenLogprobs] = []
        self._content_tokens: ContentTokens[TokenLogprobs] = ContentTokens(self.parser)
        self._stops = StopStringMatcher(stop, include_stop) if stop else None
        self._stop_matched = False
        self._answer_released = 0  # characters of the answer the stop strings released
        self._answer_fed = 0  # characters of the answer fed to the stop strings
        self._single_call = single_call
        self._has_calls = False
        self._token_spans: list[tuple[int, int]] = []
        self._characters_fed = 0

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def reasoning_tokens(self) -> int:
        """Generated tokens that overlap a reasoning message (P-API-5)."""
        return count_reasoning_tokens(self._token_spans, self.parser.reasoning_spans)

    def feed(self, delta: StepDelta) -> list[Released]:
        """What one engine delta releases, token by token; the last of the choice if it ends here. A coalesced delta
        is read token by token, so the choice ends (and counts its tokens) exactly where it would have, and each
        answer token's logprobs go with the events of the token that decided its text, as without coalescing."""
        released: list[Released] = []
        for piece in delta.pieces():  # a coalesced delta's tokens past the choice's end are never read
            events = self._feed_step(piece)
            released.append(Released(events, self._content_tokens.decided(final=self.done)))
            if self.done:
                break
        self.new_content_logprobs = [entry for step in released for entry in step.logprobs]
        self.content_logprobs += self.new_content_logprobs
        return released

    def _feed_step(self, delta: StepDelta) -> list[Event]:
        self._count_tokens(delta)
        events = self._route(self.parser.feed(delta.text).events)
        if self._stop_matched:
            return events + self._end("stop", flush_parser=False)
        parser = self.parser
        if parser.other_role_header_seen:
            return events + self._end("stop")
        if self._single_call and (parser.valid_call_names or parser.unresolved_call_count):
            return events + self._end("stop")
        if delta.finish_reason is not None:
            self.stop_reason = delta.stop_reason
            return events + self._end(delta.finish_reason)
        return events

    def _count_tokens(self, delta: StepDelta) -> None:
        # A token's span is the text it released to the parser (the parser's offsets are in it); tokens whose text
        # is still held, and hidden special tokens, get an empty one.
        start = self._characters_fed
        self._characters_fed += len(delta.text)
        ends = delta.text_ends()
        previous = 0
        spans = []
        for end in ends:
            spans.append((start + previous, start + end))
            previous = end
        self._token_spans += spans
        self.num_tokens += len(delta.token_ids)
        self.num_cached_tokens = delta.num_cached_tokens
        if delta.logprobs:  # only when the request asked for them
            # a token's own text starts where the engine says (`token_text_starts`: the engine's text is the one fed
            # here, from its first character), after the U+FFFD at the start of its span that stands for bytes earlier
            # tokens left incomplete (its first byte cannot continue their character)
            starts = delta.token_text_starts or [span_start for span_start, _ in spans]
            for token_id, (span_start, end), own_start, entry in zip(delta.token_ids, spans, starts, delta.logprobs,
                                                                     strict=True):
                if token_id not in self._hidden_tokens:  # the answer never shows it
                    self._content_tokens.add((min(max(own_start, span_start), end), end), entry)

    def _route(self, events: list[Event]) -> list[Event]:
        routed: list[Event] = []
        for kind, payload in events:
            if kind == "content" and self._stops is not None:
                released, stop = self._match_stops(payload)
                if released:
                    routed.append(("content", released))
                self._answer_released += len(released)
                if stop is not None:
                    self._stop_matched = True
                    self.stop_reason = stop
                    # the text the parser released with the stop string's (held back as a possible header) and
                    # the tokens that wrote it come after the answer's end
                    self._content_tokens.cut_after(
                        self._answer_released + (0 if self._stops.include_in_output else len(stop)))
                    break
                continue
            self._release_held_content(routed)
            if kind == "tool_call":
                if self._single_call and payload.index > 0:
                    continue
                self._has_calls = True
            routed.append((kind, payload))
        return routed

    def _match_stops(self, answer: str) -> tuple[str, str | None]:
        """The stop strings' `feed` of the answer's next text, armed from its first character past the min_tokens-th
        token's text: text the parser held back (a possible header) comes out with later tokens', and a stop string
        that ends in an earlier token's counts no more than it would have without the wait, as in vLLM."""
        armed_from = self._armed_from()
        unarmed = len(answer) if armed_from is None else min(len(answer), max(0, armed_from - self._answer_fed))
        self._answer_fed += len(answer)
        released, stop = self._stops.feed(answer[:unarmed], armed=False) if unarmed else ("", None)
        if unarmed < len(answer):
            more, stop = self._stops.feed(answer[unarmed:])
            released += more
        return released, stop

    def _armed_from(self) -> int | None:
        """How many of the answer's characters come before the end of the min_tokens-th token's text (None while no
        more tokens were generated)."""
        if self.num_tokens <= self._min_tokens:
            return None
        if not self._min_tokens:
            return 0
        return answer_characters_before(self.parser.content_spans, self._token_spans[self._min_tokens - 1][1])

    def _release_held_content(self, routed: list[Event]) -> None:
        if self._stops is not None:
            held = self._stops.flush()
            self._answer_released += len(held)
            if held:
                routed.append(("content", held))

    def _end(self, engine_reason: str, *, flush_parser: bool = True) -> list[Event]:
        tail: list[Event] = []
        if flush_parser:
            tail = self._route(self.parser.finish().events)
            if not self._stop_matched:
                self._release_held_content(tail)
        # a stop string in the text the parser released at the end (held back as a possible header) ended the answer
        length_limited = engine_reason == "length" and not self._stop_matched
        self.finish_reason = finish_reason(has_tool_calls=self._has_calls, length_limited=length_limited)
        return tail
