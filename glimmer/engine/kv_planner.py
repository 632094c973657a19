"""The KV cache's plan: what a byte budget holds — pages the model's layer groups share, and the drafter's blocks.

Pure arithmetic, no device and no engine: the engine measures the budget (the configured size, or a GPU's free
memory after the weights and the steps' working memory) and asks here how to spend it. The drafter's context,
whose layers have another geometry, gets the share of the budget its bytes per sequence at max_model_len are of
the drafter's and the model's together (a windowed group counting its window), so that both hold as many sequences
(never less than one sequence at max_model_len needs, where the budget holds that beside the model's own); the
model's groups share what is left as pages (kv_cache_manager.PageGeometry).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from glimmer.checkpoint.config import TextConfig
from glimmer.engine.kv_cache_manager import DRAFT, FULL, SLIDING, KVCacheLayout, page_geometry

CPU_DEFAULT_KV_BYTES = 2 << 30
CPU_DEFAULT_KV_SIZING = f"what max_num_seqs sequences of max_model_len need, {CPU_DEFAULT_KV_BYTES >> 30} GiB at most"
"""The CPU's KV cache where kv_cache_memory gives none (a GPU's takes the free memory), and how it is sized."""
# left beside a CPU default KV cache lowered to the room the weights leave: the steps' activations, tokenizer, Python
CPU_HEADROOM_BYTES = 1 << 30


def cpu_default_kv_bytes(wanted_bytes: int, room_bytes: int | None) -> int:
    """The CPU's default KV cache: what the sequences want (`wanted_bytes`), CPU_DEFAULT_KV_BYTES at most, and no more
    than the room the weights leave in the host's memory less CPU_HEADROOM_BYTES (`room_bytes`; None: unknown), where
    the pages, zero-filled at start, would pass it. A room too small for one sequence gives a budget the plan refuses,
    naming the context it holds."""
    budget = min(CPU_DEFAULT_KV_BYTES, wanted_bytes)
    return budget if room_bytes is None else min(budget, max(room_bytes - CPU_HEADROOM_BYTES, 0))


@dataclass(frozen=True)
class DraftKV:
    """The drafter's context cache: bytes a block of it takes (all its layers), and how far back its queries see."""

    bytes_per_block: int
    max_visible_distance: int | None  # None: its whole context


@dataclass(frozen=True)
class KVDemand:
    """What the engine's configuration asks of the cache."""

    block_size: int  # a power of two (config_checks.py)
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    draft: DraftKV | None = None

    @property
    def draft_window(self) -> int | None:
        """Positions a drafter query may see, its own included, where that is less than the context (else None)."""
        distance = None if self.draft is None else self.draft.max_visible_distance
        return distance + 1 if distance is not None and distance + 1 < self.max_model_len else None


def kv_bytes_per_page(text: TextConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one page of the model's KV cache occupies (`PageGeometry`: a block of positions in `page_layers`
    layers, keys and values)."""
    element = torch.empty((), dtype=dtype).element_size()
    return page_geometry(text).page_layers * 2 * block_size * text.num_key_value_heads * text.head_dim * element


def kv_bytes_per_block(text: TextConfig, group: str, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block of `group` occupies across all of the group's layers (keys and values): its pages."""
    return page_geometry(text).pages_per_block[group] * kv_bytes_per_page(text, block_size, dtype)


def block_bytes(text: TextConfig, dtype: torch.dtype, demand: KVDemand) -> dict[str, int]:
    """Bytes a block takes in each group, the drafter's included."""
    per_block = {g: kv_bytes_per_block(text, g, demand.block_size, dtype) for g in page_geometry(text).pages_per_block}
    if demand.draft is not None:
        per_block[DRAFT] = demand.draft.bytes_per_block
    return per_block


def wanted_blocks(text: TextConfig, demand: KVDemand) -> dict[str, int]:
    """Blocks per group for max_num_seqs sequences at max_model_len at once: every position in the
    full-attention group (and the drafter's, unless its context is bounded), a window and the block it
    grows into per sequence in a windowed group, plus one step's chunk of new tokens there, but never more
    than every position (a sequence never holds more blocks than its whole context fills)."""
    bs, seqs, context = demand.block_size, demand.max_num_seqs, demand.max_model_len
    chunk_blocks = math.ceil(demand.max_num_batched_tokens / bs)
    every_position = seqs * math.ceil(context / bs)

    def windowed(window: int) -> int:
        return min(seqs * (math.ceil(min(window, context) / bs) + 1) + chunk_blocks, every_position)

    wanted = {FULL: every_position, SLIDING: windowed(text.sliding_window or context)}
    if demand.draft is not None:
        distance = demand.draft.max_visible_distance
        wanted[DRAFT] = windowed(distance + 1) if distance is not None else every_position
    return wanted


def plan_kv_layout(text: TextConfig, dtype: torch.dtype, demand: KVDemand, budget: int
                   ) -> tuple[KVCacheLayout, dict[str, tuple[int, int]]]:
    """The layout `budget` bytes give, and where it cannot hold one sequence of max_model_len, what falls short:
    {"pages": (available, needed)} and/or {DRAFT: (blocks available, needed)} (empty where one fits)."""
    bs = demand.block_size
    per_block = block_bytes(text, dtype, demand)
    has_draft = demand.draft is not None
    # the layout's groups and windows; its pages and the drafter's blocks are what the budget gives
    shape = KVCacheLayout(block_size=bs, num_pages=0, pages_per_block=page_geometry(text).pages_per_block,
                          sliding_window=text.sliding_window, draft_blocks=0 if has_draft else None,
                          draft_window=demand.draft_window)
    needs = shape.blocks_for_one(demand.max_model_len)
    target_floor = sum(needs[g] * per_block[g] for g in shape.pages_per_block)
    draft_blocks = None
    if has_draft:
        # split by the bytes one sequence at max_model_len takes in each, windows counted: both then hold as many
        # sequences (by bytes per block, the drafter's every position against a window of the sliding group's,
        # glimmer-nano's drafter held 3.6 sequences of 4,096 tokens beside pages for 8.1)
        floor = needs[DRAFT] * per_block[DRAFT]
        share = budget * floor // (target_floor + floor)
        if budget >= target_floor + floor:  # where the budget holds one sequence, the split leaves every group that
            share = max(min(share, budget - target_floor), floor)
        draft_blocks = share // per_block[DRAFT]
        if demand.draft_window is not None:
            draft_blocks = min(draft_blocks, wanted_blocks(text, demand)[DRAFT])
        budget -= draft_blocks * per_block[DRAFT]
    num_pages = budget // kv_bytes_per_page(text, bs, dtype)  # the model's groups share what is left
    layout = replace(shape, num_pages=num_pages, draft_blocks=draft_blocks)
    pages_needed = layout.pages_for_one(demand.max_model_len)
    short = {} if num_pages >= pages_needed else {"pages": (num_pages, pages_needed)}
    if draft_blocks is not None and draft_blocks < needs[DRAFT]:
        short[DRAFT] = (draft_blocks, needs[DRAFT])
    return layout, short


def longest_context_held(text: TextConfig, dtype: torch.dtype, demand: KVDemand, budget: int) -> int | None:
    """The longest max_model_len, below `demand`'s, of which `budget` bytes hold one sequence (what vLLM's refusal
    calls the estimated maximum model length); None where they hold none of 2 tokens, the least max_model_len. One
    sequence fits in bytes that grow with its length, so the longest is found by bisection."""
    def holds(max_model_len: int) -> bool:
        return not plan_kv_layout(text, dtype, replace(demand, max_model_len=max_model_len), budget)[1]

    low, high = 1, demand.max_model_len - 1  # `low` holds one (1 token: so said only where 2 do), `high` is the most
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if holds(middle) else (low, middle - 1)
    return low if low >= 2 else None
