"""Beam search as vLLM runs it (`LLM.beam_search`, the server's `use_beam_search`): each step every live beam of a
prompt offers its `2 * beam_width` most likely next tokens (the model's own logprobs, as a request with
`logprobs=2 * beam_width` reads them), and the `beam_width` best continuations by cumulative logprob stay live. A
candidate that is a stop id ends its beam (kept aside as finished); the search runs `max_tokens` steps, then the
finished and live beams are ranked by `cum_logprob / length ** length_penalty` and the best `beam_width` returned.

This file holds the search's bookkeeping only; the caller runs each step's beams through the engine (each beam one
request for one token, its prompt the prompt and the beam's tokens: the prefix cache shares their KV; without it,
each step computes the prompt and every beam in full, which `warn_if_beams_recompute` logs once per engine)."""

from __future__ import annotations

import functools
import logging
import math
import sys
import weakref
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from glimmer.engine.outputs import PositionLogprobs
from glimmer.engine.sampler import TokenLogprobs
from glimmer.engine.sampling_params import MAX_LOGPROBS, SamplingParams, is_int, is_number, plain_number
from glimmer.errors import RequestError

if TYPE_CHECKING:
    from glimmer.engine.llm_engine import LLMEngine
    from glimmer.engine.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

_WARNED_RECOMPUTE: weakref.WeakSet[LLMEngine] = weakref.WeakSet()
"""The engines `warn_if_beams_recompute` has warned."""

MAX_BEAM_WIDTH = MAX_LOGPROBS // 2
"""Each beam's candidates are its 2 * beam_width most likely tokens, read as logprobs, at most MAX_LOGPROBS (vLLM's
default max_logprobs bounds its beam width the same way)."""


@dataclass
class BeamSearchParams:
    """vLLM's `BeamSearchParams`: `beam_width` beams (and results) per prompt, each at most `max_tokens` tokens.

    ignore_eos: no token ends a beam (the checkpoint's stop ids are candidates as any other).
    temperature: any number >= 0, taken as vLLM takes it, and it changes no result: the search ranks candidates by the
        model's own logprobs, which a temperature does not change (vLLM's are its raw logprobs too; sampling at its
        temperature only draws one more candidate at random, below its beam's 2 * beam_width, which its flat candidate
        list can then credit to the wrong beam: no defined result to reproduce). A search at 0.7 is one at 0.
    length_penalty: a result's score is cum_logprob / length ** length_penalty, the length counting the prompt's
        tokens and the generated ones but a final stop id, as vLLM's; 0 ranks by cum_logprob alone, a larger one
        favours longer results.
    include_stop_str_in_output: a result that a stop id ended keeps that id in its tokens and its text.
    """

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise RequestError naming the first invalid field (at construction, and again when a search starts: the
        dataclass is mutable). NumPy scalars are taken as the Python numbers they hold, as SamplingParams takes them."""
        for name in ("beam_width", "max_tokens", "temperature", "length_penalty"):
            setattr(self, name, plain_number(getattr(self, name)))
        if not (is_int(self.beam_width) and 1 <= self.beam_width <= MAX_BEAM_WIDTH):
            raise RequestError(f"beam_width: must be an integer from 1 to {MAX_BEAM_WIDTH} (each beam's candidates "
                               f"are its 2 * beam_width most likely tokens, at most {MAX_LOGPROBS} logprobs), not "
                               f"{self.beam_width!r}", param="beam_width")
        if not (is_int(self.max_tokens) and self.max_tokens >= 1):
            raise RequestError(f"max_tokens: must be an integer >= 1, not {self.max_tokens!r}", param="max_tokens")
        for name in ("ignore_eos", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise RequestError(f"{name}: must be a boolean", param=name)
        if not (is_number(self.temperature) and self.temperature >= 0):
            raise RequestError(f"temperature: must be a finite number >= 0, not {self.temperature!r} (beam search "
                               "ranks by the model's own logprobs whatever it is)", param="temperature")
        if not is_number(self.length_penalty):
            raise RequestError(f"length_penalty: must be a finite number, not {self.length_penalty!r}",
                               param="length_penalty")

    def stop_ids(self, checkpoint_stop_ids: Collection[int]) -> frozenset[int]:
        """The ids that end a beam: the checkpoint's stop ids, none under ignore_eos."""
        return frozenset() if self.ignore_eos else frozenset(checkpoint_stop_ids)

    def step_params(self, cache_salt: str | None = None) -> SamplingParams:
        """What each beam's one-token request of a step runs with: greedy, its 2 * beam_width most likely tokens as
        logprobs (the candidates), no stop (the search decides what ends a beam)."""
        return SamplingParams(temperature=0, max_tokens=1, logprobs=2 * self.beam_width, ignore_eos=True,
                              cache_salt=cache_salt)


def warn_if_beams_recompute(engine: LLMEngine) -> None:
    """Log once per engine, at its first beam search, that without the prefix cache every step's one-token requests
    compute their prompt and beam tokens in full: each beam then prefills about max_tokens * (prompt length +
    max_tokens / 2) tokens, where the cache computes each token once."""
    if engine.kv.enable_prefix_caching or engine in _WARNED_RECOMPUTE:
        return
    _WARNED_RECOMPUTE.add(engine)
    logger.warning("beam search runs without the prefix cache: every step computes the prompt and each beam's tokens "
                   "in full again (a cost growing with max_tokens squared, times beam_width); leave out "
                   "--no-enable-prefix-caching / enable_prefix_caching=False to share their KV")


@dataclass
class BeamSearchSequence:
    """One result of a beam search, as vLLM's: `tokens` are the prompt's ids then the generated ones (a final stop id
    only with include_stop_str_in_output), `text` those tokens decoded (the prompt's text first, as vLLM's
    `LLM.beam_search` gives it), `logprobs` one entry per generated token (the final stop id's included) whose keys
    are the beam's candidates there, `cum_logprob` the sum of the generated tokens' logprobs (the stop id's
    included). `finish_reason`: "stop" (a stop id ended it; `stop_reason` names an id other than the tokenizer's EOS)
    or "length"."""

    tokens: list[int]
    logprobs: list[PositionLogprobs]
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None
    stop_reason: int | None = None
    score: float = 0.0  # cum_logprob / length ** length_penalty: what the results are ranked by


@dataclass
class BeamSearchOutput:
    """A prompt's results, best first: at most beam_width of them."""

    sequences: list[BeamSearchSequence]


_LARGEST_LOG = math.log(sys.float_info.max)


def beam_score(cum_logprob: float, length: int, length_penalty: float) -> float:
    """vLLM's score of a beam: the cumulative logprob over the length (prompt included, a final stop id not) to the
    power of length_penalty; -0.0 or -inf where it is past float's range (`compare_beams` ranks those too)."""
    if cum_logprob >= 0:
        return 0.0
    exponent = math.log(-cum_logprob) - length_penalty * math.log(length)
    return -math.exp(exponent) if exponent < _LARGEST_LOG else -math.inf


def compare_beams(first: tuple[float, int], second: tuple[float, int], length_penalty: float) -> int:
    """Whether vLLM's score ranks the first (cum_logprob, length) beam higher (1), the second (-1) or neither (0).

    Compared in log space: the power itself leaves float's range for penalties any float is (12 ** 300 overflows, and
    12 ** -300 is 0, which raised OverflowError or ZeroDivisionError), and in log space beams keep their order for
    every finite length_penalty; two beams of one length compare by their logprobs alone."""
    (cum_a, length_a), (cum_b, length_b) = first, second
    kind_a, kind_b = _score_kind(cum_a), _score_kind(cum_b)
    if kind_a != kind_b or kind_a:
        return (kind_a > kind_b) - (kind_a < kind_b)
    # a ranks higher when ln(-cum_a) - penalty * ln(length_a) is the smaller
    margin = math.log(-cum_b) - math.log(-cum_a)
    if length_a != length_b:
        margin += length_penalty * (math.log(length_a) - math.log(length_b))
    return (margin > 0) - (margin < 0)


def _score_kind(cum_logprob: float) -> int:
    """1 for a score of 0 (no beam ranks higher), -1 for one of -inf (none lower), 0 for the others."""
    return 1 if cum_logprob >= 0 else -1 if cum_logprob == -math.inf else 0


@dataclass
class _Beam:
    token_ids: list[int]  # generated, a final stop id included
    logprobs: list[TokenLogprobs]
    cum_logprob: float = 0.0
    stop_id: int | None = None  # the stop id that ended it


@dataclass
class BeamSearch:
    """One prompt's search: `live_beams()` lists what the next step scores, `advance(...)` takes each one's candidates.

    `stop_ids`: the ids that end a beam (none under ignore_eos); `budget`: the tokens a beam may generate (max_tokens,
    or less where the context ends first)."""

    prompt_token_ids: list[int]
    params: BeamSearchParams
    stop_ids: Collection[int]
    budget: int
    live: list[_Beam] = field(default_factory=lambda: [_Beam([], [])])
    finished: list[_Beam] = field(default_factory=list)
    steps: int = 0

    @property
    def done(self) -> bool:
        return not self.live or self.steps >= self.budget

    def live_beams(self) -> list[list[int]]:
        """Each live beam's whole sequence (the prompt and its tokens), whose next token the step scores."""
        return [] if self.done else [self.prompt_token_ids + beam.token_ids for beam in self.live]

    def advance(self, candidates: list[TokenLogprobs]) -> None:
        """One step: per live beam (in `live_beams()`' order), its next-token logprobs, whose `top` holds its
        2 * beam_width candidates, most likely first."""
        growing = []
        for beam, entry in zip(self.live, candidates, strict=True):
            for rank, (token_id, logprob) in enumerate(entry.top.items(), start=1):
                grown = _Beam(beam.token_ids + [token_id],
                              beam.logprobs + [TokenLogprobs(token_id, logprob, entry.top, rank)],
                              beam.cum_logprob + logprob)
                if token_id in self.stop_ids:
                    grown.stop_id = token_id
                    self.finished.append(grown)
                else:
                    growing.append(grown)
        # a stable sort: between equal logprobs the earlier beam's candidate, then the more likely one, stays
        self.live = sorted(growing, key=lambda beam: -beam.cum_logprob)[: self.params.beam_width]
        self.steps += 1

    def _scored(self, beam: _Beam) -> tuple[float, int]:
        """`beam`'s cumulative logprob and the length its score divides by."""
        return beam.cum_logprob, len(self.prompt_token_ids) + len(beam.token_ids) - (beam.stop_id is not None)

    def results(self, tokenizer: Tokenizer, eos_token_id: int | None) -> BeamSearchOutput:
        """The best beam_width of the finished and live beams, best first."""
        penalty = self.params.length_penalty
        order = functools.cmp_to_key(lambda a, b: compare_beams(self._scored(a), self._scored(b), penalty))
        ranked = sorted(self.finished + self.live, key=order, reverse=True)[: self.params.beam_width]
        sequences = []
        for beam in ranked:
            kept = beam.token_ids
            if beam.stop_id is not None and not self.params.include_stop_str_in_output:
                kept = kept[:-1]
            tokens = self.prompt_token_ids + kept
            sequences.append(BeamSearchSequence(
                tokens=tokens,
                logprobs=[PositionLogprobs(entry, tokenizer) for entry in beam.logprobs],
                cum_logprob=beam.cum_logprob,
                text=tokenizer.decode(tokens),
                finish_reason="length" if beam.stop_id is None else "stop",
                stop_reason=None if beam.stop_id in (None, eos_token_id) else beam.stop_id,
                score=beam_score(*self._scored(beam), penalty),
            ))
        return BeamSearchOutput(sequences)
