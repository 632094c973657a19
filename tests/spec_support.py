"""Helpers shared by the speculative-decoding tests (CPU and CUDA)."""

from __future__ import annotations

from glimmer.engine.llm_engine import LLMEngine
from glimmer.tiny import TinyDrafterSpec, TinySpec

TARGET = TinySpec(sliding_window=16)
DRAFTER = TinyDrafterSpec(sliding_window=12)  # contexts cross the drafter's window too
K = DRAFTER.block_size - 1  # the most proposals a step makes


def record_drafts(engine: LLMEngine) -> list[list[int]]:
    """Wrap the engine's proposer so that every draft it proposes from now on is appended to the returned list."""
    recorded: list[list[int]] = []
    proposer = engine.speculator.proposer
    inner = proposer.propose

    def propose(context, requests):
        drafts = inner(context, requests)
        recorded.extend(d.token_ids for d in drafts)
        return drafts

    proposer.propose = propose
    return recorded
