"""Sampling parameters, in the shape vLLM users know, validated once at construction."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from glimmer.errors import RequestError

MAX_LOGPROBS = 20


def _check(condition: bool, param: str, message: str) -> None:
    if not condition:
        raise RequestError(f"{param}: {message}", param=param)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class SamplingParams:
    """How to pick tokens and when to stop.

    temperature: 0 means greedy (argmax); otherwise logits are divided by it before sampling.
    top_p, top_k, min_p: nucleus, top-k (0 or -1 = off) and min-p filtering, applied after temperature.
    max_tokens: the most tokens to generate (None: up to the model's context length).
    stop: strings that end generation; the stop string itself is not included in the text.
    stop_token_ids: extra token ids that end generation (the checkpoint's stop ids always apply
        unless ignore_eos is set).
    seed: per-request seed; the same seed gives the same tokens whatever else runs in the batch.
    logprobs: if set, return each generated token's logprob and the `logprobs` most likely
        alternatives, from the model's own distribution (before temperature and penalties).
    presence_penalty, frequency_penalty: OpenAI-style, over generated tokens, in [-2, 2].
    repetition_penalty: HF-style multiplicative penalty over prompt and generated tokens (1 = off).
    n: number of independent completions of the same prompt.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    n: int = 1
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        _check(_is_number(self.temperature) and self.temperature >= 0, "temperature", "must be a number >= 0")
        _check(_is_number(self.top_p) and 0 < self.top_p <= 1, "top_p", "must be in (0, 1]")
        _check(
            isinstance(self.top_k, int) and not isinstance(self.top_k, bool) and self.top_k >= -1,
            "top_k",
            "must be an integer >= -1 (0 or -1 disables it)",
        )
        _check(_is_number(self.min_p) and 0 <= self.min_p <= 1, "min_p", "must be in [0, 1]")
        if self.max_tokens is not None:
            _check(
                isinstance(self.max_tokens, int) and not isinstance(self.max_tokens, bool) and self.max_tokens >= 1,
                "max_tokens",
                "must be an integer >= 1",
            )
        _check(isinstance(self.min_tokens, int) and self.min_tokens >= 0, "min_tokens", "must be an integer >= 0")
        if self.max_tokens is not None:
            _check(self.min_tokens <= self.max_tokens, "min_tokens", "must not exceed max_tokens")
        _check(all(isinstance(s, str) and s for s in self.stop), "stop", "must be non-empty strings")
        _check(
            all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids),
            "stop_token_ids",
            "must be non-negative integers",
        )
        if self.seed is not None:
            _check(isinstance(self.seed, int) and not isinstance(self.seed, bool), "seed", "must be an integer")
        if self.logprobs is not None:
            _check(
                isinstance(self.logprobs, int) and 0 <= self.logprobs <= MAX_LOGPROBS,
                "logprobs",
                f"must be an integer between 0 and {MAX_LOGPROBS}",
            )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(_is_number(value) and -2 <= value <= 2, name, "must be in [-2, 2]")
        _check(
            _is_number(self.repetition_penalty) and self.repetition_penalty > 0,
            "repetition_penalty",
            "must be a number > 0",
        )
        _check(isinstance(self.n, int) and not isinstance(self.n, bool) and self.n >= 1, "n", "must be >= 1")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def uses_penalties(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1
