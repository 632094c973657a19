"""One generation stream: its tokens, how far its KV cache is computed, and the blocks holding it."""

from __future__ import annotations

import enum
import functools
import itertools
from dataclasses import InitVar, dataclass, field
from typing import TYPE_CHECKING, Literal, get_args

import numpy as np
import torch

from glimmer.engine.bad_words import banned_after
from glimmer.engine.completion_rules import bans_stop_ids
from glimmer.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from glimmer.engine.grammar import GrammarController
    from glimmer.engine.sampler import PenaltyIds

_arrival_counter = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


MediaKind = Literal["image", "video"]
"""What a MultimodalItem is: its placeholders and markers are an image's or a video's."""


def check_media_kind(kind: str) -> None:
    """ValueError unless `kind` is a MediaKind."""
    if kind not in get_args(MediaKind):
        raise ValueError(f"kind={kind!r}: a media item is an 'image' or a 'video'")


@dataclass
class MultimodalItem:
    """One image or video whose features fill runs of placeholder positions in the prompt.

    runs: (offset, length) of each run of placeholder tokens the item fills, in order (an image has one
        run; a video has one per temporal group, separated by timestamps); feature rows fill them in order.
    content_hash: the key of the pixels (cache_keys), for the encoder cache and for prefix-cache block keys.
    kind: "image" or "video", which placeholders and markers its expansion is made of.
    span: [start, end) of its whole expansion, its markers (and a video's timestamps) included, as attach_media
        found it where the expansion was written.
    """

    runs: tuple[tuple[int, int], ...]
    content_hash: bytes
    pixel_values: torch.Tensor
    grid_thw: torch.Tensor
    kind: MediaKind
    span: tuple[int, int]

    def __post_init__(self) -> None:
        check_media_kind(self.kind)

    def overlaps(self, start: int, end: int) -> bool:
        return any(offset < end and offset + length > start for offset, length in self.runs)

    def feature_slices(self, start: int, end: int) -> list[tuple[int, int, int]]:
        """For positions [start, end): (first position, first feature row, count) of each overlapping piece."""
        pieces = []
        row = 0
        for offset, length in self.runs:
            lo, hi = max(start, offset), min(end, offset + length)
            if lo < hi:
                pieces.append((lo, row + lo - offset, hi - lo))
            row += length
        return pieces


@dataclass(eq=False)  # a sequence is itself: compared (and found in the scheduler's queues) by identity
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    stop_token_ids: frozenset[int]
    max_total_tokens: int
    generator: torch.Generator | None = None
    multimodal: list[MultimodalItem] = field(default_factory=list)
    controller: GrammarController | None = None  # constrains the tokens (structured outputs, tool_choice)
    # the token sequences of params.bad_words (bad_words.bad_word_ids), tokenized once when the request is added
    bad_word_ids: tuple[tuple[int, ...], ...] = ()
    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    # tokens chosen on the device by a step launched ahead (lookahead.py), not yet appended by the host
    num_pending_tokens: int = 0
    # per KV group, logical block index → physical block id (None once a sliding block is released)
    blocks: dict[str, list[int | None]] = field(default_factory=dict)
    # content keys (cache_keys.block_key) of the full blocks of all_token_ids, computed incrementally
    block_hashes: list[bytes] = field(default_factory=list)
    block_token_bytes: list[bytes] = field(default_factory=list)  # `token_bytes` of each hashed block
    # leading full blocks already offered to the prefix cache (reset when the blocks are freed)
    num_registered_blocks: int = 0
    num_preemptions: int = 0
    # whether its first admission counts in the prefix-cache statistics: not a beam-search step past the first, whose
    # prompt continues tokens the search generated (the search's prompt was counted at its first step)
    counts_prefix_lookup: bool = True
    # prompt tokens found in the prefix cache when the sequence was first admitted
    num_cached_tokens: int = 0
    # which of the request's `n` completions this is
    index: int = 0
    arrival: int = field(default_factory=lambda: next(_arrival_counter))
    # wall-clock time (time.time()) the scheduler first admitted it into a step; None while it has only waited
    first_scheduled_time: float | None = None
    # speculative decoding: tokens proposed after the last one, to be verified by the next step, and the
    # (k, vocab) distribution each was drawn from (None: chosen deterministically, e.g. an argmax)
    spec_token_ids: list[int] = field(default_factory=list)
    spec_draft_probs: torch.Tensor | None = None
    # the ids its penalties read, kept across steps by the sampler (made on its first penalized step, dropped when
    # it finishes: it may hold a copy of the prompt on the device)
    penalty_ids: PenaltyIds | None = None
    # the ids banned while fewer than min_tokens were generated: `held_ids` (completion_rules.all_stop_ids, the
    # checkpoint's stop ids too under ignore_eos), or its stop ids where none are given
    min_tokens_ids: frozenset[int] = field(init=False)
    held_ids: InitVar[frozenset[int] | None] = None

    def __post_init__(self, held_ids: frozenset[int] | None) -> None:
        self.min_tokens_ids = self.stop_token_ids if held_ids is None else held_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def banned_ids(self, outputs: list[int]) -> tuple[int, ...]:
        """The ids that may not follow `outputs` (its output ids, then any proposed after them): `min_tokens_ids`
        while fewer than min_tokens were generated (a token chosen by a step launched ahead counts, though the host
        has not appended it yet) and what its bad words ban there. An id < 0 in `outputs` stands for a proposed token
        not chosen yet (the drafter masks all its positions at once): no bad word's prefix matches it."""
        banned = tuple(self.min_tokens_ids) if bans_stop_ids(len(outputs) + self.num_pending_tokens,
                                                             self.params.min_tokens) else ()
        if self.bad_word_ids:  # (a sequence with a bad word of several tokens never runs ahead: no token is pending)
            banned += banned_after(self.bad_word_ids, outputs)
        return banned

    @functools.cached_property
    def allowed_ids(self) -> frozenset[int] | None:
        """`params.allowed_token_ids` as a set, made once (None: every id is allowed)."""
        return frozenset(self.params.allowed_token_ids) if self.params.allowed_token_ids else None

    @functools.cached_property
    def prompt_id_array(self) -> np.ndarray:
        """The prompt's ids as an int64 array, made once (the sampler's repetition penalty reads them each step)."""
        return np.fromiter(self.prompt_token_ids, dtype=np.int64, count=len(self.prompt_token_ids))

    @property
    def samples_nothing(self) -> bool:
        """max_tokens=0: the prompt is computed (and scored), and the host finishes it without sampling."""
        return self.max_total_tokens == len(self.prompt_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def tokens_in(self, start: int, end: int) -> list[int]:
        """Token ids at positions [start, end), without copying the whole sequence."""
        prompt_len = len(self.prompt_token_ids)
        if end <= prompt_len:
            return self.prompt_token_ids[start:end]
        if start >= prompt_len:
            return self.output_token_ids[start - prompt_len : end - prompt_len]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - prompt_len]

    def step_token_ids(self, start: int, end: int) -> list[int]:
        """`token_at` for every position in [start, end) (a step's input ids), sliced rather than looked up one by
        one: a prefill chunk lays out thousands."""
        known = min(end, self.num_tokens)
        ids = self.tokens_in(start, known) if start < known else []
        if end > known:
            ids = ids + self.spec_token_ids[max(start, known) - self.num_tokens : end - self.num_tokens]
        return ids

    def token_at(self, position: int) -> int:
        """The token at `position`; positions past the last token are the proposed (speculative) ones."""
        prompt_len = len(self.prompt_token_ids)
        if position < prompt_len:
            return self.prompt_token_ids[position]
        if position < self.num_tokens:
            return self.output_token_ids[position - prompt_len]
        return self.spec_token_ids[position - self.num_tokens]

    def keep_spec_tokens(self, count: int) -> None:
        """Drop the proposed tokens after the first `count`."""
        del self.spec_token_ids[count:]
        if self.spec_draft_probs is not None:
            self.spec_draft_probs = self.spec_draft_probs[:count] if count else None

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def scores_prompt(self) -> bool:
        """Whether the prompt's logits are still wanted (prompt logprobs not yet delivered): such a sequence
        computes its whole prompt, since cached prefix blocks carry no logits."""
        return self.params.prompt_logprobs is not None and not self.output_token_ids

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def multimodal_hashes_in(self, start: int, end: int) -> tuple[bytes, ...]:
        """Content hashes of the media whose placeholders overlap positions [start, end)."""
        return tuple(m.content_hash for m in self.multimodal if m.overlaps(start, end))
