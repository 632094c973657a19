"""One generation stream: its tokens, how far its KV cache is computed, and the blocks holding it."""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

import torch

from glimmer.engine.sampling_params import SamplingParams

_arrival_counter = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class MultimodalItem:
    """One image or video whose features fill a run of placeholder positions in the prompt.

    offset/length: the placeholder positions [offset, offset + length) in the prompt.
    content_hash: identifies the pixels, for the encoder cache and for prefix-cache block hashes.
    """

    offset: int
    length: int
    content_hash: int
    pixel_values: torch.Tensor
    grid_thw: torch.Tensor


@dataclass
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    stop_token_ids: frozenset[int]
    max_total_tokens: int
    generator: torch.Generator | None = None
    multimodal: list[MultimodalItem] = field(default_factory=list)
    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    # per KV group, logical block index → physical block id (None once a sliding block is released)
    blocks: dict[str, list[int | None]] = field(default_factory=dict)
    # content hashes of the full blocks of all_token_ids, computed incrementally
    block_hashes: list[int] = field(default_factory=list)
    num_preemptions: int = 0
    # prompt tokens found in the prefix cache when the sequence was first admitted
    num_cached_tokens: int = 0
    # which of the request's `n` completions this is
    index: int = 0
    arrival: int = field(default_factory=lambda: next(_arrival_counter))

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_at(self, position: int) -> int:
        prompt_len = len(self.prompt_token_ids)
        if position < prompt_len:
            return self.prompt_token_ids[position]
        return self.output_token_ids[position - prompt_len]

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def multimodal_hashes_in(self, start: int, end: int) -> tuple[int, ...]:
        """Content hashes of the media whose placeholders overlap positions [start, end)."""
        return tuple(m.content_hash for m in self.multimodal if m.offset < end and m.offset + m.length > start)
