"""What generation returns: whole results (`RequestOutput`) and per-step increments (`StepDelta`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from glimmer.engine.sampler import TokenLogprobs

if TYPE_CHECKING:
    from glimmer.engine.tokenizer import Tokenizer


@dataclass(frozen=True)
class Logprob:
    """One token's entry in a position of vLLM's logprobs: its logprob, its rank (1 the most likely) and its text."""

    logprob: float
    rank: int | None
    decoded_token: str | None


class PositionLogprobs(TokenLogprobs, Mapping[int, Logprob]):
    """One position's logprobs as `LLM.generate` returns them: a `TokenLogprobs` (`token_id`, `logprob`, `top`,
    `rank`) that also reads as vLLM's `dict[int, Logprob]`, so that vLLM code runs as written
    (`lp[token_id].logprob`, `lp.items()`, `next(iter(lp.values())).decoded_token`). Its keys are vLLM's: the
    token at the position first, then the `top` ones not already there, most likely first, each ranked by its place
    in `top`; `decoded_token` is the token's text alone (a lone byte of a character reads U+FFFD)."""

    def __init__(self, entry: TokenLogprobs, tokenizer: Tokenizer):
        super().__init__(entry.token_id, entry.logprob, entry.top, entry.rank)
        self._tokenizer = tokenizer

    def _entry(self, token_id: int) -> tuple[float, int | None]:
        if token_id == self.token_id:
            return self.logprob, self.rank
        for rank, (top_id, logprob) in enumerate(self.top.items(), start=1):
            if top_id == token_id:
                return logprob, rank
        raise KeyError(token_id)

    def __getitem__(self, token_id: int) -> Logprob:
        logprob, rank = self._entry(token_id)
        return Logprob(logprob, rank, self._decoded_token(token_id))

    def _decoded_token(self, token_id: int) -> str:
        decoded = self.__dict__.get("_decoded")
        return decoded[token_id] if decoded is not None else self._tokenizer.decode([token_id])

    def __getstate__(self) -> dict[str, object]:
        """Pickled (and deep-copied) with its tokens' texts instead of the tokenizer, which is megabytes."""
        state = {name: value for name, value in self.__dict__.items() if name != "_tokenizer"}
        state["_decoded"] = {token_id: self._decoded_token(token_id) for token_id in self}
        return state

    def __iter__(self) -> Iterator[int]:
        return iter(dict.fromkeys([self.token_id, *self.top]))

    def __len__(self) -> int:
        return len(self.top) + (self.token_id not in self.top)


@dataclass
class CompletionOutput:
    """One completion of a prompt (there are `n` per request)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" | "length" | "abort", None while running
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it (None: EOS, length)
    logprobs: list[TokenLogprobs] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def cumulative_logprob(self) -> float | None:
        """The sum of the generated tokens' logprobs, as vLLM's field; None unless logprobs were asked for."""
        if self.logprobs is None:
            return None
        return sum(entry.logprob for entry in self.logprobs)


@dataclass
class RequestMetrics:
    """When a request's life passed each point, as vLLM's `RequestMetrics`: wall-clock times (`time.time()`, seconds
    since the epoch) and `time_in_queue` in seconds. A point not yet reached is None, and so are vLLM's
    `scheduler_time`, `model_forward_time` and `model_execute_time`, which Glimmer does not measure per request.

    The token times are when `LLM` received the step's tokens from the engine; `first_scheduled_time` is when the
    scheduler first admitted any of the request's completions into a step."""

    arrival_time: float
    last_token_time: float  # arrival_time until the first token comes, as vLLM's
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    time_in_queue: float | None = None
    finished_time: float | None = None
    scheduler_time: float | None = None
    model_forward_time: float | None = None
    model_execute_time: float | None = None

    def record_delta(self, delta: StepDelta, now: float) -> None:
        """Note what `delta`, received at `now`, tells: its completion's first scheduling and its tokens."""
        scheduled = delta.first_scheduled_time
        if scheduled is not None and (self.first_scheduled_time is None or scheduled < self.first_scheduled_time):
            self.first_scheduled_time = scheduled
            self.time_in_queue = scheduled - self.arrival_time
        if delta.token_ids:
            if self.first_token_time is None:
                self.first_token_time = now
            self.last_token_time = now


@dataclass
class RequestOutput:
    """A request's prompt and its completions, as vLLM's `RequestOutput`.

    `text`, `token_ids`, `finish_reason`, `stop_reason` and `logprobs` are shortcuts to the first completion.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    num_cached_tokens: int = 0
    # with SamplingParams(prompt_logprobs=k): one entry per prompt token, the first None (nothing predicts it)
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    metrics: RequestMetrics | None = None

    @property
    def finished(self) -> bool:
        return all(o.finished for o in self.outputs)

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def stop_reason(self) -> int | str | None:
        return self.outputs[0].stop_reason

    @property
    def logprobs(self) -> list[TokenLogprobs] | None:
        return self.outputs[0].logprobs


@dataclass
class StepDelta:
    """What one step added to one completion: new tokens, the text they released, and whether it ended.

    `text` may lag `token_ids`: bytes of a character split across tokens, and text that might be the
    start of a stop string, are held back until decided, and are never retracted once released.
    """

    request_id: str
    index: int
    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    # on a completion's first delta, when prompt logprobs were asked for: one entry per prompt token, the first None
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    # where each token's released text ends in `text`; empty: all of it ends with the last token (one step's delta)
    token_text_ends: list[int] = field(default_factory=list)
    # with logprobs, per token: where its own text starts in the completion's decoded text (counted from its first
    # character; after the U+FFFD of bytes earlier tokens left incomplete, `IncrementalDetokenizer.add_at`), which a
    # legacy completion's `text_offset` and a chat answer's logprobs read; empty without logprobs
    token_text_starts: list[int] = field(default_factory=list)
    # wall-clock time (time.time()) the scheduler first admitted the completion into a step; None if unknown
    first_scheduled_time: float | None = None

    def text_ends(self) -> list[int]:
        """Per token, the end of the text it released within `text` (earlier tokens of one step release none)."""
        if self.token_text_ends:
            return self.token_text_ends
        return [0] * (len(self.token_ids) - 1) + [len(self.text)] if self.token_ids else []

    def pieces(self) -> list[StepDelta]:
        """A coalesced delta as the one-token deltas it was made of (a step's own delta stays whole), so a
        reader that decides per step (the server's stop rules) decides as it would have without coalescing."""
        if not self.token_text_ends:
            return [self]
        pieces = []
        start = 0
        last = len(self.token_ids) - 1
        for i, (token, end) in enumerate(zip(self.token_ids, self.token_text_ends, strict=True)):
            pieces.append(StepDelta(
                request_id=self.request_id,
                index=self.index,
                token_ids=[token],
                text=self.text[start:end],
                logprobs=self.logprobs[i : i + 1],
                token_text_starts=self.token_text_starts[i : i + 1],
                finish_reason=self.finish_reason if i == last else None,
                stop_reason=self.stop_reason if i == last else None,
                num_prompt_tokens=self.num_prompt_tokens,
                num_cached_tokens=self.num_cached_tokens,
                prompt_logprobs=self.prompt_logprobs if i == 0 else None,
                first_scheduled_time=self.first_scheduled_time,
            ))
            start = end
        return pieces

    def merged(self, later: StepDelta) -> StepDelta:
        """This delta followed by the next one of the same completion, as one (a slow client's coalesced deltas)."""
        offset = len(self.text)
        return StepDelta(
            request_id=self.request_id,
            index=self.index,
            token_ids=self.token_ids + later.token_ids,
            text=self.text + later.text,
            logprobs=self.logprobs + later.logprobs,
            finish_reason=later.finish_reason,
            stop_reason=later.stop_reason,
            num_prompt_tokens=later.num_prompt_tokens,
            num_cached_tokens=later.num_cached_tokens,
            prompt_logprobs=self.prompt_logprobs if self.prompt_logprobs is not None else later.prompt_logprobs,
            token_text_ends=self.text_ends() + [offset + end for end in later.text_ends()],
            token_text_starts=self.token_text_starts + later.token_text_starts,
            first_scheduled_time=self.first_scheduled_time if self.first_scheduled_time is not None else
            later.first_scheduled_time,
        )
