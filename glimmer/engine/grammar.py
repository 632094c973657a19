"""Grammar-constrained decoding with llguidance: grammars compiled per request, masks filled per step.

- `GrammarCompiler` (one per engine) wraps the tokenizer for llguidance once and compiles a request's grammar (kept
  for reuse by later requests), refusing an invalid one with a RequestError naming the field. Compiling can take
  milliseconds for a large schema, so the server does it off the engine thread; what it returns builds one
  controller per completion from a copy of the compiled matcher.
- `GrammarController` (one per completion) is a sequence's token controller: it consumes each generated token
  and ends the sequence when the grammar admits nothing more. It also guards where the grammar may place tokens
  that end or frame the output (`SpecialTokens`): a stop token only where it completes the grammar, and in a chat
  answer no special token but the `<|eot|>` that completes the turn.
- `GrammarMasks` fills one packed bitmask (32 token ids per int32) for every sampled row of a step, the
  grammar rows in parallel on llguidance's threads, and can do so while the model runs: the matchers only
  move when tokens are appended, after sampling. The sampler applies the bitmask; it knows nothing of grammars.

Which grammar a chat turn gets (channel structure, typed ATEM calls, the answer) is protocol knowledge:
`glimmer.protocol.turn_grammar`.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Protocol

import llguidance
import numpy as np
import torch

from glimmer.engine.sampling_params import StructuredOutputsParams
from glimmer.engine.tokenizer import Tokenizer
from glimmer.errors import ConstraintFailure, RequestError
from glimmer.protocol.duplicate_keys import refuse_duplicate_keys
from glimmer.protocol.request_normalization import lone_surrogate_error
from glimmer.protocol.schema_bounds import empty_bounds, endless_reference
from glimmer.protocol.tokens import EOM, EOT, MESSAGE
from glimmer.protocol.turn_grammar import (
    ANSWER_HEADER,
    JSON_LAYOUT,
    TurnConstraint,
    laid_out_schema,
    lark_string,
    patterned_raw_values,
    turn_grammar,
)
from glimmer.protocol.value_typing import LoneSurrogateError, check_no_lone_surrogate, is_json_number

logger = logging.getLogger(__name__)

_ERROR_MESSAGE_MAX = 300
_SOURCE_POSITION = re.compile(r"^at \d+\(\d+\): ")
_BOUND_PAST_LIMITS = re.compile(r"Failed to generate regex for (integer|float) range")
"""llguidance's refusal of a bound past ±2^63, naming the bound it clamped (`min=Some(-9223372036854775808)`)."""
COMPILED_CACHE_SIZE = 256
"""Compiled grammars kept for reuse (a matcher holds the grammar's lexer and parser tables, not a vocabulary)."""


class GrammarFailure(ConstraintFailure):
    """A request's grammar failed its completion while generating: the grammar engine hit a limit on it, or it made a
    chat answer spell a framing marker. The compiler refuses what it can foresee, this is what it could not."""


class MarkerSpelling:
    """Which tokens spell (part of) a framing marker's opening `<|` in text: a chat turn's text may not (the
    output parser reads framing in text, P-CHAN-6). The mask keeps them out where the grammar offers other tokens
    (a JSON string the schema leaves free); a grammar that makes the answer spell one fails its request rather than
    return an answer the parser cut. Special tokens are framing, not text, and pass."""

    def __init__(self, tokenizer: Tokenizer):
        special = set(tokenizer.all_special_ids)
        self.inside: set[int] = set()  # `<|` within the token
        self.ends_open: set[int] = set()  # ends with `<`
        self.starts_bar: set[int] = set()  # starts with `|`
        for token_id in range(tokenizer.vocab_size):
            if token_id in special:
                continue
            data = tokenizer.token_bytes(token_id)
            if b"<|" in data:
                self.inside.add(token_id)
            if data.endswith(b"<"):
                self.ends_open.add(token_id)
            if data.startswith(b"|"):
                self.starts_bar.add(token_id)
        self._inside_bits = _TokenBits(self.inside, tokenizer.vocab_size)
        self._inside_or_bar_bits = _TokenBits(self.inside | self.starts_bar, tokenizer.vocab_size)

    def steer(self, words: np.ndarray, after_open: bool) -> None:
        """Clear from a mask row (as uint32 words) the tokens that would spell `<|` next (`after_open`: the text so
        far ends with `<`), unless they are all it allows: then the row stays, and the token taken fails the
        request (`GrammarController.observe`)."""
        spelling = (self._inside_or_bar_bits if after_open else self._inside_bits).allowed(words)
        if not spelling:
            return
        _set_bits(words, spelling, allowed=False)
        if not words.any():
            _set_bits(words, spelling, allowed=True)


class SpecialTokens:
    """The tokenizer's special tokens (P-TOK-1: ids from the tokenizer, never constants) and their spellings, for
    guarding where a grammar may place them: llguidance's Lark names any token by id (`<[2049]>`), and text
    checks cannot see that."""

    def __init__(self, tokenizer: Tokenizer):
        self.ids = frozenset(tokenizer.all_special_ids)
        self._tokenizer = tokenizer

    def spelled(self, token_ids: Iterable[int]) -> str:
        """`<|eot|>, <|start|>`: the tokens' text, for error messages."""
        return ", ".join(self._tokenizer.decode([token_id]) or f"<[{token_id}]>" for token_id in token_ids)


class _TokenBits:
    """A set of token ids located in packed masks (32 ids per 32-bit word, lowest id in the lowest bit)."""

    def __init__(self, token_ids: Iterable[int], num_token_ids: int):
        self.id_set = frozenset(t for t in token_ids if 0 <= t < num_token_ids)
        ids = np.array(sorted(self.id_set), dtype=np.int64)
        self._ids = ids
        self._words = ids >> 5
        self._bits = np.left_shift(np.uint32(1), (ids & 31).astype(np.uint32))

    def __contains__(self, token_id: int) -> bool:
        return token_id in self.id_set

    def __bool__(self) -> bool:
        return bool(self.id_set)

    def allowed(self, words: np.ndarray) -> list[int]:
        """Which of the ids a mask row (as uint32 words) allows."""
        return self._ids[(words[self._words] & self._bits) != 0].tolist()


@dataclass(frozen=True)
class AnswerGate:
    """Where a chat turn's answer opens: at the `opener` token (the id of `<|message|>`) that completes the answer's
    header, which the turn grammar's matcher records as `capture` (`ANSWER_HEADER`). llguidance records a capture as
    soon as its forced text reaches the rule's end, which may be before that token is sampled: both are needed."""

    capture: str
    opener: int

    def opens(self, matcher: llguidance.LLMatcher, token_id: int) -> bool:
        """Whether `token_id`, just consumed by `matcher`, opened the answer."""
        return token_id == self.opener and matcher.get_capture(self.capture) is not None


def _set_bits(words: np.ndarray, token_ids: list[int], allowed: bool) -> None:
    for token_id in token_ids:
        bit = np.uint32(1 << (token_id & 31))
        words[token_id >> 5] = words[token_id >> 5] | bit if allowed else words[token_id >> 5] & ~bit


def _completes(matcher: llguidance.LLMatcher, token_id: int) -> bool:
    """Whether consuming `token_id` leaves the grammar complete (tried on a copy: the matcher stays where it is)."""
    probe = matcher.deep_copy()
    return probe.consume_token(token_id) and not probe.is_error() and probe.is_accepting()


class GrammarController:
    """Constrains one completion by a grammar (the sequence's controller)."""

    def __init__(self, matcher: llguidance.LLMatcher, num_token_ids: int, markers: MarkerSpelling | None = None,
                 on_failure: Callable[[], None] | None = None, param: str = "structured_outputs", *,
                 stop_token_ids: Iterable[int] = (), special: SpecialTokens | None = None,
                 answer_gate: AnswerGate | None = None, final_token_ids: Iterable[int] = ()):
        """on_failure: called once when the grammar engine fails this completion (the compiler then drops the
        grammar it keeps: llguidance's copies share a lexer, which stays broken for every later copy). param: the
        request field whose constraint this is, named by a GrammarFailure.

        stop_token_ids: the ids that end this completion; the grammar may place one only where it completes (one it
        needs earlier would end the output with the constraint unmet). answer_gate: where a chat turn's answer opens;
        from then on no special token of `special` may be taken but one completing the turn (its `<|eot|>`):
        framing or control tokens inside an answer end or break it. final_token_ids: ids the grammar places only at
        its end (a turn's `<|eot|>` where no answer grammar of the request's can name it), which complete it wherever
        they are allowed: no copy of the matcher is walked to check (each costs as much as a step's mask)."""
        self.matcher = matcher
        self.param = param
        self._on_failure = on_failure
        self.num_token_ids = num_token_ids  # the ids llguidance indexed: every logit row of the model
        self._markers = markers  # a chat turn's: its text may not spell `<|`
        self._after_open = False  # the text so far ends with `<`
        self.failure: str | None = None  # the grammar engine's error, met while filling this completion's mask
        self._stops = _TokenBits(stop_token_ids, num_token_ids)
        self._special = special
        self._answer_gate = answer_gate
        self._final = frozenset(final_token_ids)
        self._in_answer_guard = (_TokenBits(special.ids | self._stops.id_set, num_token_ids)
                                 if special is not None and answer_gate is not None else None)
        self.answer_open = False  # the answer's header was consumed: its own grammar runs
        self.refusal: GrammarFailure | None = None  # every token the grammar allowed here was one it may not take
        self.consumed = 0  # tokens observed: where the matcher is
        self.last_walk: GrammarWalk | None = None  # the drafter's latest walk from here (`walked`)

    def check_mask(self, row: torch.Tensor) -> None:
        """After `row` (this completion's packed mask) was filled from the matcher: a matcher in its error state
        masks every token but the stop ids, which would end the completion as if it were done; its error is kept,
        and `observe` fails the request with it. Otherwise the tokens the grammar may not place here are cleared
        from `row` (`guard_row`); when nothing else was allowed, `observe` fails the request saying so."""
        if self.failure is None and self.matcher.is_error():
            self._fail(_engine_error(self.matcher.get_error()))
            logger.warning("grammar engine error while filling a mask: %s", self.failure)
            return
        if self.refusal is None:
            self.refusal = self.guard_row(row, self.matcher, self.answer_open, self._after_open)

    def guard_row(self, row: torch.Tensor, matcher: llguidance.LLMatcher, in_answer: bool, after_open: bool
                  ) -> GrammarFailure | None:
        """Clear from `row`, the mask filled from `matcher` (this completion's, or a copy walked through proposed
        tokens), in a chat turn the tokens that would spell `<|` (`MarkerSpelling.steer`; `after_open`: the text
        there ends with `<`), the stop tokens that would end the output before the grammar is complete and,
        `in_answer` (a chat answer's open), the special tokens that would not complete the turn. When those were all
        the row allowed, the row is left as it was (the sampler needs an allowed token) and the refusal returned:
        its request fails."""
        words = row.numpy().view(np.uint32)
        if self._markers is not None:
            self._markers.steer(words, after_open)
        if (not self._stops and self._in_answer_guard is None) or matcher.is_accepting():
            return None
        refused = [t for t in self._guarded(in_answer).allowed(words) if t not in self._final
                   and not _completes(matcher, t)]
        if not refused:
            return None
        _set_bits(words, refused, allowed=False)
        if words.any():
            return None
        _set_bits(words, refused, allowed=True)
        return self._refused(refused, in_answer)

    def _guarded(self, in_answer: bool) -> _TokenBits:
        return self._in_answer_guard if in_answer and self._in_answer_guard is not None else self._stops

    def ends_open(self, token_id: int | None) -> bool:
        """Whether the text a turn's matcher reads ends with `<` after `token_id` (None: after what this completion
        observed), for `guard_row`."""
        if token_id is None:
            return self._after_open
        return self._markers is not None and token_id in self._markers.ends_open

    def opens_answer(self, matcher: llguidance.LLMatcher, token_id: int) -> bool:
        """Whether `token_id`, just consumed by `matcher` (this completion's or a copy), opened a chat answer."""
        return self._answer_gate is not None and self._answer_gate.opens(matcher, token_id)

    def _refused(self, token_ids: list[int], in_answer: bool) -> GrammarFailure:
        spelled = self._special.spelled(token_ids) if self._special is not None else str(token_ids)
        added = [t for t in token_ids if t in self._stops and (self._special is None or t not in self._special.ids)]
        if added:  # text tokens the request made stop ids: that field is the one to change
            return GrammarFailure(f"stop_token_ids: {self._special.spelled(added) if self._special else added} ends "
                                  f"generation, but the output of the constraint ({self.param}) needs it here, before "
                                  "it is complete; leave it out of stop_token_ids", param="stop_token_ids")
        if in_answer:
            return _special_in_chat_answer(self.param, spelled)
        return GrammarFailure(f"{self.param}: the constraint needs {spelled} before it is complete, which ends "
                              "generation there: the output would not satisfy it", param=self.param)

    def _failure_error(self) -> GrammarFailure:
        return GrammarFailure(f"{self.param}: the grammar engine stopped on this constraint while generating "
                              f"({self.failure}); the output so far would not satisfy it", param=self.param)

    def _fail(self, reason: str) -> None:
        self.failure = reason
        if self._on_failure is not None:
            self._on_failure()
            self._on_failure = None

    def accepted_prefix(self, tokens: list[int]) -> int:
        """How many of `tokens`, in a row, the grammar would accept from here, without consuming them. An id
        outside the indexed rows ends the prefix: llguidance would put the matcher in its error state for good."""
        known = 0
        while known < len(tokens) and 0 <= tokens[known] < self.num_token_ids:
            known += 1
        return self.matcher.validate_tokens(tokens[:known]) if known else 0

    def observe(self, token_id: int) -> bool:
        """Consume the token just generated; True ends generation (the grammar admits nothing more).

        Raises GrammarFailure when the grammar engine failed, when the last mask allowed only tokens the
        completion may not take (`guard_row`), or when the token is one of those (a proposal of speculative
        decoding is verified against masks, but checked here once more, as every token is)."""
        if self.failure is not None:
            raise self._failure_error()
        if self.refusal is not None:
            raise self.refusal
        in_answer = self.answer_open
        # a stop token taken where the grammar is complete just ends it; elsewhere it must complete the grammar
        guarded = token_id in self._guarded(in_answer) and not self.matcher.is_accepting()
        markers = self._markers
        if markers is not None:
            spelled = token_id in markers.inside or (self._after_open and token_id in markers.starts_bar)
            self._after_open = token_id in markers.ends_open
            if spelled and not in_answer:  # a typed call value: its tool's schema made it spell the marker
                raise GrammarFailure(f"{self.param}: a tool call's value spelled a framing marker's `<|` in text, "
                                     "which would end or break the call (P-CHAN-6); keep such text out of what the "
                                     "tool's parameters schema writes (names, enum and const values, patterns)",
                                     param=self.param)
            if spelled:
                raise GrammarFailure(f"{self.param}: the constrained answer spelled a framing marker's `<|` in text, "
                                     "which would end or break the message (P-CHAN-6); constrain the raw text on "
                                     "/v1/completions instead", param=self.param)
        if not self.matcher.consume_token(token_id) or self.matcher.is_error():
            # the sampler only draws allowed tokens, so this is a limit of the grammar engine (or a bug): the
            # request fails with the engine's reason rather than end as if its output were complete (a matcher in
            # its error state takes any token and says it stopped)
            self._fail(_engine_error(self.matcher.get_error()))
            logger.warning("grammar rejected token %d: %s", token_id, self.failure)
            raise self._failure_error()
        if guarded and not self.matcher.is_accepting():
            raise self._refused([token_id], in_answer)
        self.consumed += 1
        self.answer_open = in_answer or self.opens_answer(self.matcher, token_id)
        return self.matcher.is_stopped()

    def walked(self, drafts: list[int]) -> GrammarWalk | None:
        """The drafter's walk that proposed `drafts` from where the matcher is now, its masks those verification
        fills (`GrammarWalk`); None where another proposer's drafts, or others, are verified. Taken once."""
        walk, self.last_walk = self.last_walk, None
        if walk is None or walk.start != self.consumed or not drafts or walk.tokens[:len(drafts)] != drafts:
            return None
        return walk if len(walk.masks) > len(drafts) or walk.tokens == drafts else None


class GrammarWalk:
    """A copy of a controller's matcher walked through tokens the drafter proposes: the mask at each position, as
    verification will fill it (`GrammarMasks.fill_verification`: the grammar's, guarded by `guard_row`), while the
    controller's own matcher stays as it is. The walk is kept on the controller with its masks, which verification
    takes instead of computing them again (`GrammarController.walked`)."""

    def __init__(self, controller: GrammarController):
        self.controller = controller
        self.matcher = controller.matcher.deep_copy()
        self.in_answer = controller.answer_open
        self.words = (controller.num_token_ids + 31) // 32
        self.start = controller.consumed
        self.tokens: list[int] = []  # advanced through
        self.masks: list[torch.Tensor] = []  # masks[j]: the mask after tokens[:j]
        controller.last_walk = self

    def mask(self) -> torch.Tensor | None:
        """The packed mask of the next position; None where nothing more may be proposed: the grammar stopped,
        failed, or allows only tokens the completion may not take."""
        if self.controller.failure is not None or self.controller.refusal is not None or self.matcher.is_stopped() \
                or self.matcher.is_error():
            return None
        mask = torch.frombuffer(bytearray(self.matcher.compute_bitmask()), dtype=torch.int32)[:self.words]
        after_open = self.controller.ends_open(self.tokens[-1] if self.tokens else None)
        if self.controller.guard_row(mask, self.matcher, self.in_answer, after_open) is not None:
            return None
        self.masks.append(mask)
        return mask

    def advance(self, token_id: int) -> None:
        self.matcher.consume_token(token_id)
        self.tokens.append(token_id)
        self.in_answer = self.in_answer or self.controller.opens_answer(self.matcher, token_id)


class ControllerFactory(Protocol):
    def __call__(self, stop_token_ids: Collection[int] | None = None) -> GrammarController:
        """A controller for one completion whose generation ends at `stop_token_ids` (None: the checkpoint's stop
        ids); RequestError when every output of the grammar needs one of them before it is complete."""


@dataclass
class _Compiled:
    """A grammar compiled for requests to copy, and the text and tokens every output of it begins with
    (llguidance's forced bytes and tokens from its start: all of it for a regex `a<\\|b`, nothing for `(a|b)c`)."""

    matcher: llguidance.LLMatcher
    forced_text: bytes
    forced_tokens: tuple[int, ...]


class GrammarCompiler:
    """Compiles grammars for one tokenizer; ids of special tokens come from the tokenizer itself (P-TOK-1)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, stop_token_ids: Iterable[int]):
        """vocab_size: the model's logit rows (at least the tokenizer's); stop ids end a grammar that is done.

        Takes a few seconds for a 200k vocabulary (llguidance indexes every token's bytes).
        """
        self.vocab_size = vocab_size
        self._compiled: OrderedDict[str, _Compiled] = OrderedDict()
        self._turn_texts: OrderedDict[str, tuple[TurnConstraint, str]] = OrderedDict()  # `_turn_grammar_text`'s
        self._lock = threading.Lock()
        self._text_tokenizer = tokenizer
        self._markers: MarkerSpelling | None = None
        self.special = SpecialTokens(tokenizer)
        stops = sorted(set(stop_token_ids))
        self._stop_token_ids = frozenset(stops)
        if vocab_size < tokenizer.vocab_size:
            raise ValueError(f"vocab_size {vocab_size} is smaller than the tokenizer's {tokenizer.vocab_size} ids")
        table = _TokenTable(tokenizer, stops[0], vocab_size)
        self.tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(table), n_vocab=vocab_size,
                                                eos_token=stops)
        if self.tokenizer.vocab_size != vocab_size:  # the masks are sized by the model's rows (GrammarMasks)
            raise RuntimeError(f"llguidance indexed {self.tokenizer.vocab_size} tokens for {vocab_size} logit rows")

    def compile(self, grammar: dict[str, Any], param: str, *, guard_markers: bool = False, internal: bool = False,
                failure_param: str | None = None, answer_gate: AnswerGate | None = None,
                final_token_ids: tuple[int, ...] = ()) -> ControllerFactory:
        """Controllers for `grammar` (llguidance's top-level grammar object); RequestError(param) if invalid.

        Compiled grammars are kept (the last `COMPILED_CACHE_SIZE`), so requests repeating a schema, a tool set
        or a regex start from a copy instead of compiling again. `guard_markers`: the text is a chat turn's, which
        may not spell a framing marker (`MarkerSpelling`). `internal`: the grammar is Glimmer's own (a turn's), whose
        source a refusal does not quote. `failure_param`: the field a failure while generating names (`param` by
        default). `answer_gate`: the grammar is a chat turn's whose answer is the request's constraint, guarded
        from where the gate opens (`GrammarController`). `final_token_ids`: ids the grammar places only at its end
        (`GrammarController`).
        """
        return self._compile_text(_grammar_text(grammar, param), param, guard_markers=guard_markers,
                                  internal=internal, failure_param=failure_param, answer_gate=answer_gate,
                                  final_token_ids=final_token_ids)

    def _compile_text(self, text: str, param: str, *, guard_markers: bool = False, internal: bool = False,
                      failure_param: str | None = None, answer_gate: AnswerGate | None = None,
                      final_token_ids: tuple[int, ...] = ()) -> ControllerFactory:
        """`compile` of a grammar's JSON text (`_grammar_text`)."""
        compiled = self._kept(text, param, internal)
        markers = self._marker_spelling() if guard_markers else None
        failure_param = failure_param or param

        def controller(stop_token_ids: Collection[int] | None = None) -> GrammarController:
            stops = self._stop_token_ids if stop_token_ids is None else frozenset(stop_token_ids)
            _refuse_forced_stop(compiled.forced_tokens, stops, self._stop_token_ids, self.special, failure_param)
            with self._lock:
                kept = self._compiled.get(text)
                if kept is None:  # dropped after a failure (or from the cache): built afresh and kept again
                    kept = self._compiled[text] = _Compiled(self._matcher(text), compiled.forced_text,
                                                            compiled.forced_tokens)
            return GrammarController(kept.matcher.deep_copy(), self.tokenizer.vocab_size, markers,
                                     on_failure=lambda: self._drop(text, kept), param=failure_param,
                                     stop_token_ids=stops, special=self.special, answer_gate=answer_gate,
                                     final_token_ids=final_token_ids)

        return controller

    def _kept(self, text: str, param: str, internal: bool) -> _Compiled:
        """The compiled grammar of `text`, kept from an earlier request or built (and kept); RequestError(param)
        if invalid."""
        with self._lock:
            kept = self._compiled.get(text)
            if kept is not None:
                self._compiled.move_to_end(text)
                return kept
        kept = self._build(text, param, internal)
        with self._lock:
            _keep_last(self._compiled, text, kept)
        return kept

    def _matcher(self, text: str) -> llguidance.LLMatcher:
        return llguidance.LLMatcher(self.tokenizer, text, log_level=0)

    def _drop(self, text: str, kept: _Compiled) -> None:
        """Forget `kept` for `text` if it is still the kept one: llguidance's copies of a matcher share its lexer,
        and a lexer that hit one of its limits fails every later copy at its first mask; the next request gets a
        matcher built afresh, and so meets the grammar as the first request did."""
        with self._lock:
            if self._compiled.get(text) is kept:
                del self._compiled[text]

    def _build(self, text: str, param: str, internal: bool) -> _Compiled:
        """The compiled grammar of `text`; RequestError(param) for a grammar llguidance refuses, one whose first
        mask is already an error (a grammar no text satisfies, such as `root ::= root`: llguidance finds out only
        there), or one whose first token already takes the grammar engine past a limit (a regex `a{1000000}`: its
        lexer builds a repetition's expressions as it goes, and gives up after too many)."""
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text, self.tokenizer)
        matcher = None if is_error else self._matcher(text)
        if matcher is None or matcher.is_error():
            raise _refused(param, messages[0] if is_error else matcher.get_error(), internal=internal)
        # a matcher of its own: a copy of `matcher` would share (and spend) the lexer the requests will use
        probe = self._matcher(text)
        mask = probe.compute_bitmask()
        if probe.is_error():
            raise RequestError(f"{param}: no text satisfies this constraint; the grammar engine found no way to "
                               f"begin it ({_engine_error(probe.get_error())})", param=param)
        forced_text = probe.compute_ff_bytes()
        forced_tokens = tuple(probe.compute_ff_tokens())
        first = _first_allowed(mask, self._stop_token_ids)
        if first is not None and (not probe.consume_token(first) or probe.is_error()):
            raise RequestError(f"{param}: the grammar engine cannot follow this constraint past its first token "
                               f"({_engine_error(probe.get_error())}); a smaller one (fewer repetitions, a shorter "
                               "pattern) may fit its limits", param=param)
        return _Compiled(matcher, forced_text, forced_tokens)

    def _marker_spelling(self) -> MarkerSpelling:
        with self._lock:
            if self._markers is None:
                self._markers = MarkerSpelling(self._text_tokenizer)
            return self._markers

    def structured_outputs(self, params: StructuredOutputsParams, param: str = "structured_outputs"
                           ) -> ControllerFactory:
        """Controllers that constrain the raw text (LLM.generate, /v1/completions)."""
        return self.compile({"grammars": [answer_grammar(params, param)]}, param)

    def turn(self, constraint: TurnConstraint, answer_param: str = "response_format") -> ControllerFactory:
        """Controllers that constrain a chat turn. The answer is checked first, so its errors name `answer_param`,
        and so does a failure while generating (the answer's grammar is the request's own; with no answer, a tool's
        schema is: `tools`). An answer whose every text begins by spelling `<|` (a regex's `<\\|`, a grammar's
        `"a<" "|b"`, which `chat_answer_grammar` cannot see) is refused here; one that may spell it later fails its
        request when it does (P-CHAN-6). So is an answer that names a special token by id (Lark's `<[2049]>`):
        refused when every answer begins with one, and kept from taking one, or failed if it must, while generating.
        """
        if constraint.answer is None:  # the turn's own grammar names `<|eot|>` only where the turn ends
            factory = self._compile_text(self._turn_grammar_text(constraint), "tools", guard_markers=True,
                                         internal=True, final_token_ids=(self._text_tokenizer.require_token_id(EOT),))
        else:
            answer = self._kept(_grammar_text({"grammars": [dict(constraint.answer)]}, answer_param), answer_param,
                                internal=False)
            if b"<|" in answer.forced_text:
                raise _marker_in_chat_answer(answer_param)
            forced_special = [token_id for token_id in answer.forced_tokens if token_id in self.special.ids]
            if forced_special:
                raise _special_in_chat_answer(answer_param, self.special.spelled(forced_special[:1]))
            factory = self._refusing_answer_stops(self._compile_text(
                self._turn_grammar_text(constraint), "tools", guard_markers=True, internal=True,
                failure_param=answer_param,
                answer_gate=AnswerGate(ANSWER_HEADER, self._text_tokenizer.require_token_id(MESSAGE))),
                answer.forced_tokens, answer_param)
        if not constraint.must_call or constraint.thinking_token_budget == 0:
            return factory
        return self._refusing_end_of_message_stop(factory)

    def _refusing_answer_stops(self, factory: ControllerFactory, answer_tokens: tuple[int, ...], answer_param: str
                               ) -> ControllerFactory:
        """`factory` for a turn whose answer begins with `answer_tokens` (every answer's), refusing stop ids among
        them (RequestError naming `stop_token_ids`): the turn's own forced tokens end at the answer's free
        reasoning, so the check `compile` makes cannot see them, and the request failed while generating."""
        end_of_turn = self._text_tokenizer.require_token_id(EOT)

        def controller(stop_token_ids: Collection[int] | None = None) -> GrammarController:
            if stop_token_ids is not None:  # the turn's `<|eot|>` follows the answer: each of its tokens is before it
                _refuse_forced_stop(answer_tokens + (end_of_turn,), frozenset(stop_token_ids), self._stop_token_ids,
                                    self.special, answer_param)
            return factory(stop_token_ids)

        return controller

    def _refusing_end_of_message_stop(self, factory: ControllerFactory) -> ControllerFactory:
        """`factory` for a turn that must call and may reason first, refusing to stop at `<|eom|>`
        (RequestError naming `stop_token_ids`): a reasoning message ends with `<|eom|>` before the call's message
        begins, so a turn that reasoned stopped there, its call never written, and the request failed while
        generating (mid-stream when streamed) saying that the constraint needs `<|eom|>`."""
        end_of_message = self._text_tokenizer.require_token_id(EOM)

        def controller(stop_token_ids: Collection[int] | None = None) -> GrammarController:
            if stop_token_ids is not None and end_of_message in stop_token_ids:
                raise RequestError(f"stop_token_ids: {EOM} ({end_of_message}) ends each reasoning message, before the "
                                   "call that a required or named tool_choice needs, so a turn that reasoned would "
                                   f"stop with no call; leave {EOM} out of stop_token_ids, or set "
                                   "thinking_token_budget to 0 (no reasoning)", param="stop_token_ids")
            return factory(stop_token_ids)

        return controller

    def _turn_grammar_text(self, constraint: TurnConstraint) -> str:
        """The JSON text of the turn's grammar (its tools without the patterns the engine cannot express), kept for
        the last `COMPILED_CACHE_SIZE` constraints: an agent sends the same tools with every request, and building
        the text walks every tool's schema (about 0.15 ms a tool of nested parameters). Kept by the constraint's
        JSON text, and taken only for a constraint equal to the one it was built for (the text of a tuple or of a
        number key is a list's or a string's). Raises RequestError naming `tools` as `turn_grammar` does."""
        try:
            key = json.dumps([constraint.answer, constraint.call_tools, constraint.must_call,
                              constraint.parallel_calls, constraint.thinking_token_budget], ensure_ascii=False)
        except (TypeError, ValueError, RecursionError):  # no JSON text to keep it by: built each time
            key = None
        with self._lock:
            kept = self._turn_texts.get(key) if key is not None else None
            if kept is not None and kept[0] == constraint:
                self._turn_texts.move_to_end(key)
                return kept[1]
        lenient = replace(constraint, call_tools=[_lenient_tool(tool) for tool in constraint.call_tools])
        text = _grammar_text(turn_grammar(lenient), "tools")
        self._refuse_raw_values_no_text_meets(lenient.call_tools)
        if key is not None:
            with self._lock:
                _keep_last(self._turn_texts, key, (copy.deepcopy(constraint), text))
        return text


    def _refuse_raw_values_no_text_meets(self, tools: Iterable[Mapping[str, Any]]) -> None:
        """RequestError naming `tools` for a parameter written as raw text whose `pattern` (or `format`) only text
        holding `<|` or the value's closer `</atem:parameter>` meets: no raw value may hold either (the first is
        framing, P-CHAN-6; the second ends the value, P-ATEM-2). The grammar engine finds such a value's terminal
        empty only when a call reaches it: the first mask of the value alone fails ("NoExtensionBias")."""
        for tool in tools:
            for key, grammar in patterned_raw_values(tool):
                matcher = self._matcher(json.dumps({"grammars": [{"lark_grammar": grammar}]}))
                if matcher.is_error():  # not this check's fault: the turn's own grammar is refused for it
                    continue
                matcher.compute_bitmask()
                if matcher.is_error():
                    name = tool["function"]["name"]
                    raise RequestError(f"tools: parameter {key!r} of {name!r} is written as raw text, and its pattern "
                                       "(or format) is met only by text holding '<|' or '</atem:parameter>', which a "
                                       "raw value cannot hold (framing, or the end of the value), so a call could "
                                       "never finish it; change the pattern so that text without them meets it",
                                       param="tools")


class _TokenTable:
    """What llguidance needs of a tokenizer: every token's bytes, which ids are special, and an encoder.

    Byte-level tokens come from `Tokenizer.token_bytes` (what detokenization produces); special tokens are given
    by their text and flagged, so grammars name them (`<|message|>`) and text never matches them. Building from
    this table is much faster than letting llguidance parse tokenizer.json itself.

    The table has one entry per logit row (`vocab_size`): rows past the tokenizer's ids (a checkpoint's padded
    vocabulary, glimmer-nano's 2,112 rows for 2,067 tokens) are special tokens no grammar names, so every mask
    forbids them. llguidance sizes its masks by this table, not by its `n_vocab` argument.
    """

    def __init__(self, tokenizer: Tokenizer, eos_token_id: int, vocab_size: int):
        known = tokenizer.vocab_size
        special = set(tokenizer.all_special_ids) | set(range(known, vocab_size))
        self.eos_token_id = eos_token_id
        self.bos_token_id = tokenizer.bos_token_id
        self.special_token_ids = sorted(special)
        self.tokens = [(tokenizer.id_to_token(i) or "").encode() if i in special and i < known
                       else f"<|glimmer_padded_row_{i}|>".encode() if i >= known else tokenizer.token_bytes(i)
                       for i in range(vocab_size)]
        self._tokenizer = tokenizer

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError("text, not bytes")  # tells llguidance's wrapper to pass text
        return self._tokenizer.encode_text(text)  # text a grammar spells out stays text, `<|eot|>` included


def answer_grammar(params: StructuredOutputsParams, param: str = "structured_outputs") -> dict[str, Any]:
    """The llguidance grammar object of one structured-output constraint; RequestError(param) when malformed."""
    kind = params.kind
    if kind in ("json", "json_object"):
        schema: Any = {"type": "object"} if kind == "json_object" else params.json
        if isinstance(schema, str):
            schema = _schema_from_text(schema, param)
        if not isinstance(schema, dict):
            raise RequestError(f"{param}: a JSON schema must be an object", param=param)
        try:
            _refuse_integer_past_float_range(schema, param)
            _refuse_endless_reference(schema, param)
            _refuse_a_layout_of_its_own(schema, param)
            if params.strict:
                _refuse_what_the_engine_cannot_enforce(schema, param)
            return {"json_schema": laid_out_schema(schema, strict=bool(params.strict))}
        except RecursionError:  # the walks of the schema are recursive, as json.dumps is
            raise RequestError(f"{param}: the JSON schema is nested too deeply", param=param) from None
    try:
        if kind == "regex":
            grammar = llguidance.grammar_from("regex", params.regex)
        elif kind == "choice":
            return {"lark_grammar": _choice_grammar(params.choice)}
        else:
            grammar = llguidance.grammar_from("grammar", params.grammar)
    except ValueError as exc:
        raise RequestError(f"{param}: {_first_lines(str(exc))}", param=param) from None
    if not grammar.lstrip().startswith("{"):  # llguidance hands Lark grammars back as they are
        return {"lark_grammar": grammar}
    entry = json.loads(grammar)["grammars"][0]
    return {k: v for k, v in entry.items() if v is not None and k != "name"}


def _schema_from_text(text: str, param: str) -> Any:
    """A JSON schema sent as its JSON text (vLLM's `guided_json` or `structured_outputs.json` as a string), read as the
    request body is: RequestError(param) for text that is no JSON or nests too deeply, that gives a key twice in one
    object (Python's json keeps the last value: `"properties"` given twice lost the first's required property with no
    word, where the same schema sent as an object is refused), or that holds a lone surrogate (`\\ud800`, which the
    grammar engine refused as "Value is not JSON serializable")."""
    try:
        schema = json.loads(text)
        refuse_duplicate_keys(text, under=param)
    except RecursionError:
        raise RequestError(f"{param}: the JSON schema is nested too deeply", param=param) from None
    except RequestError:  # the repeated key's, which is a ValueError too
        raise
    except ValueError as exc:
        raise RequestError(f"{param}: the JSON schema is not valid JSON: {exc}", param=param) from None
    try:
        check_no_lone_surrogate(text, schema)
    except LoneSurrogateError:
        raise lone_surrogate_error(param) from None
    return schema


def check_json_schema(schema: Mapping[str, Any], param: str, strict: bool = False) -> None:
    """RequestError(param) when the grammar engine refuses `schema` as a `response_format` schema of the same
    strictness is refused: an unknown type, a `$ref` to nothing, a keyword holding a value of the wrong kind, and,
    when `strict` (a tool declared `"strict": true`), a keyword the engine does not implement (`uniqueItems`, which
    pydantic writes for a set; `if`/`then`), which a non-strict schema ignores. Needs no tokenizer and compiles
    nothing for tokens, so a request's tool schemas are checked when it is parsed, whatever its `tool_choice`."""
    try:
        checked = schema if strict else without_patterns_beyond_the_engine(schema)
    except RecursionError:
        raise RequestError(f"{param}: the JSON schema is nested too deeply", param=param) from None
    grammar = answer_grammar(StructuredOutputsParams(json=dict(checked), strict=strict), param)
    try:
        text = _grammar_text({"grammars": [grammar]}, param)
    except RequestError:
        raise
    except (TypeError, ValueError, RecursionError):
        raise RequestError(f"{param}: the JSON schema is not JSON or is nested too deeply", param=param) from None
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text)
    if is_error:
        hint = (" (a strict tool's calls follow every keyword of its schema; without \"strict\": true, keywords "
                "the grammar engine does not implement are ignored)") if strict else ""
        raise _refused(param, messages[0], hint=hint)


def check_tool_parameters(parameters: Mapping[str, Any], param: str, strict: bool = False) -> None:
    """`check_json_schema` for a tool's `parameters`, and RequestError naming the parameter for an optional one that
    no value satisfies (a `pattern` of two characters with `maxLength` 1): the grammar engine leaves such a property
    out of JSON, but a call writes each parameter as a value of its own, so a call that began one failed while
    generating, with the engine's bare "NoExtensionBias". A required one the engine refuses itself, naming it. Also
    RequestError naming its place for a `$ref` that is not a JSON pointer into `parameters` (an `$anchor`'s `#item`,
    an `$id`'s `item.json`), which a call's value cannot follow (`_refuse_references_a_call_cannot_follow`).

    An accepted schema is remembered by its JSON text (`_accepted_schema`): an agent sends the same tools with
    every request, and the checks take up to a millisecond for a tool of nested parameters."""
    try:
        text = json.dumps(parameters, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):  # no JSON text to remember it by: the check names the fault
        text = None
    # the remembered schema equals `parameters` only where the text holds all of it (no tuple, no key of a number)
    if text is None or _accepted_schema(text, strict) != parameters:
        if strict:  # a call may write any parameter: an optional one's bounds are named before the other checks
            _refuse_empty_bounds(parameters, param, every_property=True)
        _check_call_parameters(parameters, param, strict)
    properties, required = parameters.get("properties"), parameters.get("required", [])
    if not isinstance(properties, Mapping) or not isinstance(required, list) or all(
            key in required for key in properties):
        return
    unsatisfiable = _unsatisfiable_optional_parameter(text, strict)
    if unsatisfiable is not None:
        path, reason = unsatisfiable
        raise RequestError(f"{param}{path}: {reason}", param=f"{param}{path}")


def _check_call_parameters(parameters: Mapping[str, Any], param: str, strict: bool) -> None:
    """The checks whose verdict `_accepted_schema` remembers: `check_json_schema`, then the `$ref`s a call can
    follow (`_refuse_references_a_call_cannot_follow`); one list, so the remembered verdict and the refusal that
    names the field cannot drift apart."""
    check_json_schema(parameters, param, strict)
    _refuse_references_a_call_cannot_follow(parameters, param)


def _refuse_references_a_call_cannot_follow(parameters: Mapping[str, Any], param: str) -> None:
    """RequestError naming the path in `param` of a `$ref` in a tool's `parameters` that is not a JSON pointer into
    them (`#`, `#/$defs/Item`): an anchor (`#item`) or a reference resolved against an `$id` (`item.json`). The engine
    follows them in the whole schema, but a call writes each parameter's value by a grammar of its own, whose schema's
    pointers are rewritten into a copy of `parameters` (`turn_grammar._standalone`): such a reference led nowhere,
    and the value was written as free text (a strict tool's integer came back `{"a": "film"}`)."""
    try:
        nodes = list(_subschemas_at(parameters))
    except RecursionError:  # check_json_schema names the depth
        return
    for path, node in nodes:
        reference = node.get("$ref")
        if isinstance(reference, str) and reference != "#" and not reference.startswith("#/"):
            raise RequestError(f"{param}{path}: $ref {reference!r} is not a JSON pointer into the parameters (such "
                               "as '#/$defs/Item'); a call's values can only follow those: point it at the schema's "
                               "path instead of its $anchor or $id", param=f"{param}{path}")


@functools.lru_cache(maxsize=1024)
def _accepted_schema(schema_text: str, strict: bool) -> Any:
    """The schema of JSON text `schema_text` where `_check_call_parameters` accepts it at this strictness, else None.
    Keyed by the whole text and the strictness, the verdict's only inputs (a field name only names a refusal), so a
    hit is this schema's own verdict; the caller checks a refused one again, to raise the refusal naming its field.
    Callers compare, never change, what it returns."""
    try:
        schema = json.loads(schema_text)
        _check_call_parameters(schema, "parameters", strict)
    except (RequestError, RecursionError):  # nested past the decoder's depth: the caller's check names it
        return None
    return schema


@functools.lru_cache(maxsize=1024)
def _unsatisfiable_optional_parameter(parameters_text: str, strict: bool) -> tuple[str, str] | None:
    """The path (`.properties.x`, or in a strict tool the schema whose bounds no value meets, `empty_bounds`) and the
    reason of the first optional parameter of a tool's `parameters` (JSON text, checked by `check_json_schema`) that
    no value satisfies, found by checking the schema with each one required; None if none. Cached: the checks take a
    fraction of a millisecond each, and an agent sends the same tools with every request."""
    parameters = json.loads(parameters_text)
    if strict:  # the required parameters' bounds were checked with the schema: what is found is an optional one's
        empty = empty_bounds(parameters, every_property=True)
        if empty is not None:
            return empty
    required = parameters.get("required", [])
    for key in parameters["properties"]:
        if key in required:
            continue
        try:
            check_json_schema({**parameters, "required": [*required, key]}, "parameters", strict)
        except RequestError:
            return (f".properties.{key}", "no value satisfies the schema of this optional parameter, so a call that "
                    "wrote it could never be finished; fix its schema, or leave the parameter out")
    return None


def without_patterns_beyond_the_engine(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    """`schema` (a non-strict tool's parameters) without the `pattern`s the grammar engine's regexes cannot express:
    lookarounds, word boundaries and backreferences are ECMA-262, as JSON Schema's `pattern` is, but no regular
    language. A non-strict schema's keywords are hints, and the engine refuses a whole schema for one such pattern
    (a strict tool's schema keeps it, and is refused for it). `schema` itself where it has none; may raise
    RecursionError for a schema nested past Python's recursion."""
    if not any(not _engine_reads_pattern(node["pattern"]) for node in _subschemas(schema)
               if isinstance(node.get("pattern"), str)):
        return schema
    kept = copy.deepcopy(dict(schema))
    for node in _subschemas(kept):
        if isinstance(node.get("pattern"), str) and not _engine_reads_pattern(node["pattern"]):
            del node["pattern"]
    return kept


@functools.lru_cache(maxsize=1024)
def _engine_reads_pattern(pattern: str) -> bool:
    grammar = json.dumps({"grammars": [{"json_schema": {"type": "string", "pattern": pattern}}]}, ensure_ascii=False)
    if not llguidance.LLMatcher.validate_grammar_with_warnings(grammar)[0]:
        return True
    logger.warning("the JSON-schema pattern %r is beyond the grammar engine's regexes (a lookaround, word boundary or "
                   "backreference): non-strict tools' calls are not held to it", pattern[:200])
    return False


def _lenient_tool(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    """A tool of a turn's grammar (normalized): a non-strict one without the patterns the grammar engine cannot
    express (`without_patterns_beyond_the_engine`), as its schema was checked."""
    function = tool["function"]
    if function.get("strict") is True:
        return tool
    return {**tool, "function": {**function, "parameters": without_patterns_beyond_the_engine(function["parameters"])}}


def _keep_last(kept: OrderedDict, key: object, value: object) -> None:
    """Keep `value` under `key` as the most recently used, dropping the least recently used beyond
    `COMPILED_CACHE_SIZE` (the caller holds the compiler's lock)."""
    kept[key] = value
    kept.move_to_end(key)
    while len(kept) > COMPILED_CACHE_SIZE:
        kept.popitem(last=False)


def _grammar_text(grammar: Mapping[str, Any], param: str) -> str:
    """`grammar` as the JSON text the grammar engine reads. Raises RequestError(param) for NaN or an infinity in it
    (a request body's `NaN`, `Infinity` or `1e400` in a schema), which json.dumps would write as `NaN` / `Infinity`,
    no JSON, and the engine would refuse as "expected value at line 1 column 100", naming neither."""
    try:
        return json.dumps(grammar, ensure_ascii=False, allow_nan=False)
    except ValueError as error:
        if "Out of range float" not in str(error):  # a circular reference (a Python caller's schema)
            raise
        raise RequestError(f"{param}: the JSON schema holds NaN or an infinity (a NaN, Infinity or 1e400 in the "
                           "request), which is no JSON value; write a finite number, or leave the keyword out",
                           param=param) from None


def _refused(param: str, message: str, *, internal: bool = False, hint: str = "") -> RequestError:
    """The grammar engine's refusal of the constraint in `param`. `internal`: the grammar is Glimmer's own (a turn's),
    whose source the engine lists after its error: only the error goes out, not that source."""
    reason = _without_source(message) if internal else _first_lines(message)
    if _BOUND_PAST_LIMITS.search(reason):  # its own words name neither the keyword nor the value given
        reason, hint = ("a minimum or maximum (or exclusive bound) this far from zero, at or past about ±9.2e18 "
                        "(2^63), is beyond the numbers it can bound; bring the bound within ±9e18 or leave it out"), ""
    return RequestError(f"{param}: the grammar engine refused it: {reason}{hint}", param=param)


def _choice_grammar(choices: list[str]) -> str:
    """One of `choices`, as one lexeme: an alternation of literals in a terminal (a regular language, matched by
    the lexer) rather than of rules, whose parser rows grow with the choices until the grammar engine's limit
    (2,000 items) stops generation in the middle of a choice."""
    literals = sorted({lark_string(choice) for choice in choices if choice})
    if not literals:
        return 'start: ""'
    optional = "?" if "" in choices else ""
    return f"start: CHOICE{optional}\nCHOICE: {' | '.join(literals)}"


def chat_answer_grammar(params: StructuredOutputsParams, param: str = "structured_outputs") -> dict[str, Any]:
    """`answer_grammar` for the answer of a chat turn, whose text cannot hold a framing marker's opening `<|`: the
    output parser reads framing in text (P-CHAN-6), so an answer spelling `<|eot|>` would end there, cut short. A
    constraint that names such text is refused (RequestError(param)); /v1/completions constrains raw text and
    takes it. A JSON schema's annotations (`description`, `title`, ...) are never written, so they may name it."""
    grammar = answer_grammar(params, param)
    written = {**grammar, "json_schema": _without_annotations(grammar["json_schema"])} if "json_schema" in grammar \
        else grammar
    if "<|" in json.dumps(written, ensure_ascii=False):
        raise _marker_in_chat_answer(param)
    return grammar


_ANNOTATION_KEYWORDS = frozenset({"title", "description", "$comment", "examples", "default", "deprecated", "readOnly",
                                  "writeOnly"})
"""JSON-schema keywords that describe a value without constraining it: no output writes their text."""
_SCHEMA_MAP_KEYWORDS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
"""JSON-schema keywords whose value maps names (written as keys, or defining no text) to schemas."""


def _without_annotations(schema: Any) -> Any:
    """`schema` without its annotation keywords, at every level; `enum` and `const` values are kept as they are
    (they are written), and so are the names in `properties` and the other maps of subschemas."""
    if isinstance(schema, list):
        return [_without_annotations(member) for member in schema]
    if not isinstance(schema, dict):
        return schema
    kept: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _ANNOTATION_KEYWORDS:
            continue
        if key in ("enum", "const"):
            kept[key] = value
        elif key in _SCHEMA_MAP_KEYWORDS and isinstance(value, dict):
            kept[key] = {name: _without_annotations(member) for name, member in value.items()}
        else:
            kept[key] = _without_annotations(value)
    return kept


def _refuse_what_the_engine_cannot_enforce(schema: Mapping[str, Any], param: str) -> None:
    """RequestError(param) for keywords of a strict schema (at any level) that the grammar engine takes but would
    not hold the output to, and for the schema's own engine options that relax it (`_RELAXING_OPTIONS`): a strict
    schema promises every keyword; a non-strict one leaves them hints. Also RequestError(param and the node's path)
    for bounds no value meets in a schema every instance needs (`schema_bounds.empty_bounds`), which the engine
    refuses itself, but in words naming neither the keyword nor where it is."""
    options = schema.get("x-guidance")
    for option in _RELAXING_OPTIONS if isinstance(options, Mapping) else ():
        if options.get(option) is True:
            raise RequestError(f"{param}: x-guidance.{option} true lets the output break the schema, which a strict "
                               "schema may not; leave it out", param=param)
    _refuse_empty_bounds(schema, param)
    for node in _subschemas(schema):
        reason = (_min_properties_of_repeatable_keys(node) or _exclusive_bound_on_its_integer(node)
                  or _integer_past_float_precision(node) or _prefix_items_beside_tuple_keywords(node)
                  or _format_on_a_number(node))
        if reason:
            raise RequestError(f"{param}: {reason}", param=param)


def _refuse_empty_bounds(schema: Mapping[str, Any], param: str, *, every_property: bool = False) -> None:
    """RequestError naming the path in `param` of the first schema every instance needs whose bounds no value meets
    (`empty_bounds`, whose `every_property` this passes on)."""
    empty = empty_bounds(schema, every_property=every_property)
    if empty is not None:
        path, reason = empty
        raise RequestError(f"{param}{path}: {reason}", param=f"{param}{path}")


def _refuse_endless_reference(schema: Mapping[str, Any], param: str) -> None:
    """RequestError naming the path in `param` of a `$ref` every instance needs that only an endless value meets
    (`endless_reference`): the grammar engine took it, and the output never finished (a forced call cut short by
    max_tokens, a 500; an answer stopped with "NoExtensionBias")."""
    endless = endless_reference(schema)
    if endless is not None:
        path, reference = endless
        what = f"$ref {reference!r}" if reference else "every branch of it holds a $ref that"
        raise RequestError(f"{param}{path}: {what} leads back to itself with no way out (each value it admits must "
                           "hold another such value), so only an endless value meets it; give the "
                           "recursion an end: an optional property, an anyOf branch without the $ref, or an array "
                           "that may be empty", param=f"{param}{path}")


def _refuse_a_layout_of_its_own(schema: Mapping[str, Any], param: str) -> None:
    """RequestError naming the path in `param` of a schema whose own engine options (`x-guidance`) lay the JSON out
    other than `JSON_LAYOUT`, strict or not: Glimmer's JSON is always laid out as json.dumps writes it, and at a root
    they would win over it (a separator such as `item_separator: ";"` wrote text that is not JSON at all, free
    whitespace let the model loop on it), as vLLM's `whitespace_pattern` and `disable_any_whitespace` are refused. At
    any level: a tool's parameter is the root of its value's grammar (`turn_grammar._standalone`), so
    `{"a": {"type": "array", "x-guidance": ...}}` wrote `a` as `[7;7]`; below an answer schema's root the engine
    would ignore them, and they are refused there too rather than silently dropped."""
    for path, node in _subschemas_at(schema):
        options = node.get("x-guidance")
        for option in _LAYOUT_OPTIONS if isinstance(options, Mapping) else ():
            if option not in options or options[option] == JSON_LAYOUT.get(option):
                continue
            value, shown = options[option], _shown_option(options[option])
            separator, between = _JSON_SEPARATORS.get(option, (None, ""))
            not_json = (f" ({shown} {between} is not JSON)" if isinstance(value, str) and separator
                        and value.strip(_JSON_WHITESPACE) != separator else "")
            raise RequestError(f"{param}{path}: x-guidance.{option} {shown} would lay the JSON out "
                               "otherwise, where Glimmer's JSON is always laid out as json.dumps writes it (', ' "
                               f"between items, ': ' after a key, no other whitespace){not_json}; leave it out",
                               param=f"{param}{path}")


def _shown_option(value: Any) -> str:
    """An engine option's value as JSON, cut to 100 characters; its repr where it is none (the Python API takes any
    object)."""
    try:
        shown = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        shown = repr(value)
    return shown if len(shown) <= 100 else f"{shown[:100]}…"


_JSON_WHITESPACE = " \t\n\r"  # RFC 8259 §2: the only insignificant whitespace around a separator
_JSON_SEPARATORS = {"item_separator": (",", "between items"), "key_separator": (":", "after a key")}
"""The layout options that set a separator: the one JSON has there, and where it goes."""

_LAYOUT_OPTIONS = ("item_separator", "key_separator", "whitespace_flexible", "whitespace_pattern")
"""The grammar engine's schema options that lay JSON out (`JSON_LAYOUT` sets all but `whitespace_pattern`)."""

_RELAXING_OPTIONS = ("lenient", "coerce_one_of")
"""The grammar engine's schema options (a schema's own `x-guidance`, which win over Glimmer's) that relax it: ignore
keywords it does not implement, write a `oneOf` as an `anyOf` (a value two branches admit)."""


def _subschemas(schema: Any) -> Iterator[dict[str, Any]]:
    """Every object in `schema` that is a schema, `schema` itself first; `enum` and `const` values and annotations are
    no schemas, and of the maps of subschemas (`properties`, `$defs`, ...) only the values are."""
    return (node for _, node in _subschemas_at(schema))


def _subschemas_at(schema: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """`_subschemas` with each one's path in `schema` (`.properties.a`, `.anyOf[0]`; "" for `schema` itself)."""
    if isinstance(schema, list):
        for index, member in enumerate(schema):
            yield from _subschemas_at(member, f"{path}[{index}]")
        return
    if not isinstance(schema, dict):
        return
    yield path, schema
    for key, value in schema.items():
        if key in _ANNOTATION_KEYWORDS or key in ("enum", "const"):
            continue
        if key in _SCHEMA_MAP_KEYWORDS and isinstance(value, dict):
            for name, member in value.items():
                yield from _subschemas_at(member, f"{path}.{key}.{name}")
        else:
            yield from _subschemas_at(value, f"{path}.{key}")


def _min_properties_of_repeatable_keys(node: dict[str, Any]) -> str | None:
    """A `minProperties` asking for more keys than `required` lists: the others would be keys of `patternProperties`
    or `additionalProperties`, which the grammar engine counts as written without keeping them distinct, so
    `{"a": 1, "a": 2}` met a `minProperties` of 2 while it parses to one key."""
    minimum = node.get("minProperties")
    required = node.get("required")
    required_keys = {key for key in required if isinstance(key, str)} if isinstance(required, list) else set()
    if not is_json_number(minimum) or minimum <= len(required_keys) or (
            node.get("additionalProperties", True) is False and not node.get("patternProperties")):
        return None
    return (f"minProperties {minimum} cannot be enforced beyond the {len(required_keys)} keys in required: the "
            "grammar engine cannot keep the keys of patternProperties or additionalProperties distinct (a key "
            "written twice would count twice); list the keys in properties and required, or leave minProperties out")


def _exclusive_bound_on_its_integer(node: dict[str, Any]) -> str | None:
    """An `exclusiveMinimum` or `exclusiveMaximum` of a number that is an integer whose digits the other bound shares
    (`exclusiveMinimum: 0` with `maximum: 0.5`, `exclusiveMaximum: -2` with `minimum: -2.5`): the grammar engine
    writes such a range as that integer part and a fraction, and lets the fraction be left out, so the output could
    be the excluded integer itself (`0`, `-0`, `-2`)."""
    kinds = node.get("type", "number")
    if "number" not in (kinds if isinstance(kinds, list) else [kinds]):
        return None  # an integer's range is no integer part and fraction
    for exclusive, others in (("exclusiveMinimum", ("maximum", "exclusiveMaximum")),
                              ("exclusiveMaximum", ("minimum", "exclusiveMinimum"))):
        bound = node.get(exclusive)
        if not is_json_number(bound) or not (isinstance(bound, int) or math.isfinite(bound) and bound.is_integer()):
            continue
        for other in others:
            value = node.get(other)
            if is_json_number(value) and (isinstance(value, int) or math.isfinite(value)) and value != bound \
                    and math.trunc(value) == bound:
                written = "-0" if bound == 0 and value < 0 else str(int(bound))
                inclusive = "minimum just above" if exclusive == "exclusiveMinimum" else "maximum just below"
                return (f"{exclusive} {bound} with {other} {value} cannot be enforced: the grammar engine would let "
                        f"the number be {written}; give a {inclusive} it instead")
    return None


def _prefix_items_beside_tuple_keywords(node: dict[str, Any]) -> str | None:
    """`prefixItems` (JSON Schema 2020-12's tuple) beside `additionalItems` or an array `items` (the tuple of the
    drafts before it): the grammar engine then reads the array as those drafts do and leaves `prefixItems` out, so
    `{"prefixItems": [{"type": "null"}], "additionalItems": false}` let it write `[202]`."""
    if "prefixItems" not in node:
        return None
    older = "additionalItems" if "additionalItems" in node else "items" if isinstance(node.get("items"), list) else None
    if older is None:
        return None
    written = "additionalItems" if older == "additionalItems" else "an array items"
    return (f"prefixItems beside {written} cannot be enforced: the grammar engine reads the array as the drafts "
            "before 2020-12 do and leaves prefixItems out; give the items after prefixItems as items (a schema, or "
            "false for none), without additionalItems")


def _format_on_a_number(node: dict[str, Any]) -> str | None:
    """A `format` on a schema of numbers (OpenAPI's `int32`, `int64`, `float`): the grammar engine holds `format` on
    strings only (and refuses one it does not know there), so `{"type": "integer", "format": "int32"}` let it write
    71231649312021020256420255402740202. Beside `enum` or `const` the values are held already; where strings are
    admitted too, the engine judges the format itself."""
    written = node.get("format")
    kinds = node.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if not isinstance(written, str) or "enum" in node or "const" in node or "string" in kinds \
            or not {"integer", "number"} & set(kinds):
        return None
    return (f"format {written!r} on a number cannot be enforced: the grammar engine holds format on strings only; "
            "give the range it means as minimum and maximum (int32: -2147483648 to 2147483647), or leave format out")


_FLOAT_EXACT_INTEGERS = 2**53
"""Integers a 64-bit float holds exactly: the grammar engine reads every number of a schema as one."""


def _integer_past_float_precision(node: dict[str, Any]) -> str | None:
    """An integer beyond ±2^53 that a 64-bit float does not hold exactly, as a bound, `const` or `enum` member: the
    grammar engine reads it as the nearest float, so a `maximum` 9007199254740995 lets 9007199254740996 through and a
    `const` 9007199254740993 is written 9007199254740992. (A bound at or past ±2^63 the engine refuses itself.)"""
    for keyword in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "const", "enum"):
        for value in _integers_in(node.get(keyword)):
            nearest = _nearest_float(value)
            if nearest == value or keyword not in ("const", "enum") and abs(nearest) >= 2.0 ** 63:
                continue
            return (f"{keyword} holds {value}, an integer past 2^53 ({_FLOAT_EXACT_INTEGERS}) that the grammar engine, "
                    "which reads numbers as 64-bit floats, cannot hold exactly: the output could differ from it; give "
                    "an integer within ±2^53, or a string")
    return None


def _nearest_float(value: int) -> float:
    """The float nearest `value`, an infinity of its sign past a float's range (math.copysign would convert it)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _refuse_integer_past_float_range(schema: Any, param: str) -> None:
    """RequestError naming the path in `param` of the first integer anywhere in `schema` (a bound, `multipleOf`,
    `minItems`, an `enum` member, a `default`) past a 64-bit float's range (about ±1.8e308, `10**400`): the grammar
    engine reads the schema's JSON text with every number a float or a 64-bit integer, and refuses such a number as
    "number out of range at line 1 column 501", naming neither the keyword nor where it is."""
    path = _integer_past_float_range(schema, "")
    if path is not None:
        raise RequestError(f"{param}{path}: the integer there is past the range of a 64-bit float (about "
                           "±1.8e308), the widest number the grammar engine reads in a schema; give a value within "
                           "it, or leave the keyword out", param=f"{param}{path}")


def _integer_past_float_range(value: Any, path: str) -> str | None:
    """The path (`.properties.n.minimum`, `.enum[2]`) in `value` of its first integer past a float's range; None."""
    if isinstance(value, Mapping):
        found = (_integer_past_float_range(member, f"{path}.{key}") for key, member in value.items())
    elif isinstance(value, list):
        found = (_integer_past_float_range(member, f"{path}[{index}]") for index, member in enumerate(value))
    else:
        return path if isinstance(value, int) and math.isinf(_nearest_float(value)) else None
    return next((found_path for found_path in found if found_path is not None), None)


def _integers_in(value: Any) -> Iterator[int]:
    """The integers in a JSON value (`const` and `enum` values may be arrays and objects), booleans left out."""
    if isinstance(value, list):
        for member in value:
            yield from _integers_in(member)
    elif isinstance(value, dict):
        for member in value.values():
            yield from _integers_in(member)
    elif isinstance(value, int) and not isinstance(value, bool):
        yield value


def _special_in_chat_answer(param: str, spelled: str) -> GrammarFailure:
    return GrammarFailure(f"{param}: a chat answer cannot contain special tokens, and this constraint puts {spelled} "
                          "inside it (framing and control tokens end or break the message, P-CHAN-6); constrain "
                          "the raw text on /v1/completions instead", param=param)


def _refuse_forced_stop(forced_tokens: tuple[int, ...], stop_token_ids: frozenset[int],
                        checkpoint_stop_ids: frozenset[int], special: SpecialTokens, param: str) -> None:
    """RequestError when every output of a grammar spells a stop token with more forced after it: generation would
    end there, the constraint unmet. It names `param` for a stop token of the checkpoint's, and `stop_token_ids` for
    one the request added (a turn's framing, say `<|message|>`, cannot be left out of its constraint)."""
    for token_id in forced_tokens[:-1]:
        if token_id not in stop_token_ids:
            continue
        spelled = special.spelled([token_id])
        if token_id not in checkpoint_stop_ids:
            raise RequestError(f"stop_token_ids: {spelled} ends generation, but every output of the constraint "
                               f"({param}) holds it before its end; leave it out of stop_token_ids",
                               param="stop_token_ids")
        raise RequestError(f"{param}: every output of this constraint holds {spelled} before its end, a stop token "
                           "that ends generation there; leave it out (or out of the stop tokens, with ignore_eos)",
                           param=param)


def _marker_in_chat_answer(param: str) -> RequestError:
    return RequestError(f"{param}: a chat answer cannot contain '<|' (text spelling a framing marker ends or breaks "
                        "the message); constrain the raw text on /v1/completions instead", param=param)


class GrammarMasks:
    """One packed bitmask for a step's sampled rows: all ones for free rows, the grammar's for constrained ones."""

    def __init__(self, vocab_size: int, max_rows: int):
        words = (vocab_size + 31) // 32
        self._buffer = torch.full((max_rows, words), -1, dtype=torch.int32, pin_memory=torch.cuda.is_available())
        self._executor = llguidance.LLExecutor()
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="glimmer-grammar")

    def fill(self, controllers: list[GrammarController | None]) -> torch.Tensor | None:
        """The bitmask of rows whose controllers are given (None: a free row); None when no row is constrained."""
        constrained = [(c.matcher, row) for row, c in enumerate(controllers) if c is not None]
        if not constrained:
            return None
        if len(controllers) > self._buffer.shape[0]:
            self._buffer = torch.full((len(controllers), self._buffer.shape[1]), -1, dtype=torch.int32,
                                      pin_memory=self._buffer.is_pinned())
        bitmask = self._buffer[:len(controllers)]
        bitmask.fill_(-1)
        self._executor.unsafe_compute_mask_ptr(constrained, bitmask.data_ptr(), bitmask.shape[1] * 4,
                                               bitmask.shape[0])
        for row, controller in enumerate(controllers):
            if controller is not None:
                controller.check_mask(bitmask[row])
        return bitmask

    def fill_async(self, controllers: list[GrammarController | None]) -> Future:
        """`fill` on a worker thread, to overlap the model's forward pass; the Future holds its result."""
        return self._thread.submit(self.fill, controllers)

    def fill_verification(self, controllers: list[GrammarController | None], proposed: list[list[int]]
                          ) -> torch.Tensor | None:
        """Masks for verifying proposed tokens (speculative decoding): per sequence one row for each of its
        proposals and one after them, each the grammar's mask once the proposals before it are consumed.

        A copy of the matcher walks through the proposals it accepts; the matcher itself is left as it was (a
        rollback is refused by llguidance for grammars with `max_tokens=` or `stop=` lexemes, a thinking budget's
        among them, and leaves the matcher in its error state). Rows after a proposal the grammar refuses (or
        after it stops) allow everything: that proposal is rejected, so they are never used.
        """
        if all(c is None for c in controllers):
            return None
        words = self._buffer.shape[1]
        bitmask = torch.full((sum(len(p) + 1 for p in proposed), words), -1, dtype=torch.int32)
        row = 0
        for controller, drafts in zip(controllers, proposed, strict=True):
            if controller is not None:
                walk = controller.walked(drafts)
                if walk is not None:  # the drafter's walk filled the rows before each draft: only the last is new
                    kept = walk.masks[:len(drafts) + 1]
                    for j, mask in enumerate(kept):
                        bitmask[row + j] = mask
                    controller.check_mask(bitmask[row])
                    first, valid = len(kept), len(drafts)
                    matcher, in_answer = walk.matcher, walk.in_answer
                else:
                    first, valid = 0, controller.accepted_prefix(drafts)
                    matcher = controller.matcher.deep_copy() if valid else controller.matcher
                    in_answer = controller.answer_open
                for j in range(first, valid + 1):
                    if matcher.is_stopped():  # the proposal before ended the sequence: the rest is never used
                        break
                    mask = torch.frombuffer(bytearray(matcher.compute_bitmask()), dtype=torch.int32)
                    bitmask[row + j] = mask[:words]
                    if j == 0:  # the row the sequence samples from when every proposal is rejected
                        controller.check_mask(bitmask[row])
                    else:
                        controller.guard_row(bitmask[row + j], matcher, in_answer, controller.ends_open(drafts[j - 1]))
                    if j == valid:
                        break
                    matcher.consume_token(drafts[j])
                    in_answer = in_answer or controller.opens_answer(matcher, drafts[j])
            row += len(drafts) + 1
        return bitmask

    def fill_verification_async(self, controllers: list[GrammarController | None], proposed: list[list[int]]
                                ) -> Future:
        """`fill_verification` on the worker thread, to overlap the model's forward pass."""
        return self._thread.submit(self.fill_verification, controllers, proposed)


def _first_allowed(mask: bytes, skipped: frozenset[int]) -> int | None:
    """The lowest token id a packed mask (32 ids per little-endian 32-bit word) allows, other than `skipped`."""
    words = memoryview(mask).cast("I")
    for index, word in enumerate(words):
        while word:
            low = word & -word
            token_id = index * 32 + low.bit_length() - 1
            if token_id not in skipped:
                return token_id
            word ^= low
    return None


def _without_source(message: str) -> str:
    """The first line of llguidance's error, without the position in the grammar it begins with (`at 3(16): `)
    or the listing of the grammar's source that follows it."""
    return _first_lines(_SOURCE_POSITION.sub("", message.strip().splitlines()[0] if message.strip() else ""))


def _first_lines(message: str) -> str:
    text = " ".join(line.strip() for line in message.strip().splitlines()[:3])
    return text[:_ERROR_MESSAGE_MAX]


def _engine_error(message: str) -> str:
    """A matcher's error without the state llguidance appends (`<state> Tokens: ⟦…⟧`: the completion's text so
    far, reasoning included, which an error body should not repeat)."""
    return _first_lines(message.split("<state>")[0])
