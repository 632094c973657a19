"""The KV plan as arithmetic alone (glimmer/engine/kv_planner.py), at the released 30B geometry, without a device."""

from __future__ import annotations

import math

import pytest
import torch

from glimmer.engine.kv_cache_manager import DRAFT, FULL, SLIDING
from glimmer.engine.kv_planner import (
    DraftKV,
    KVDemand,
    kv_bytes_per_page,
    longest_context_held,
    plan_kv_layout,
    wanted_blocks,
)
from glimmer.tiny import released_30b_config

TEXT = released_30b_config().text
PAGE = kv_bytes_per_page(TEXT, 16, torch.bfloat16)


def _pages_for_one(max_model_len: int) -> int:
    blocks = math.ceil(max_model_len / 16)
    return blocks + 3 * min(blocks, TEXT.sliding_window // 16 + 1)


def test_a_page_of_the_30b_is_16_positions_of_13_layers():
    assert PAGE == 13 * 2 * 16 * TEXT.num_key_value_heads * TEXT.head_dim * 2 == 212_992


def test_the_h100s_cache_is_pages_the_groups_share():
    demand = KVDemand(block_size=16, max_model_len=34 * 1024, max_num_seqs=256, max_num_batched_tokens=8192)
    layout, short = plan_kv_layout(TEXT, torch.bfloat16, demand, 7_200_000_000)
    assert (layout.num_pages, layout.pages_per_block, layout.draft_blocks, short) == (
        7_200_000_000 // PAGE, {FULL: 1, SLIDING: 3}, None, {})


@pytest.mark.parametrize("max_model_len", [100, 2048, 2049, 131_072])
def test_a_budget_a_page_short_of_one_sequence_says_how_short(max_model_len):
    demand = KVDemand(block_size=16, max_model_len=max_model_len, max_num_seqs=1, max_num_batched_tokens=8192)
    needed = _pages_for_one(max_model_len)
    assert plan_kv_layout(TEXT, torch.bfloat16, demand, needed * PAGE)[1] == {}
    assert plan_kv_layout(TEXT, torch.bfloat16, demand, needed * PAGE - 1)[1] == {"pages": (needed - 1, needed)}


@pytest.mark.parametrize("context", [2, 17, 2048, 2049, 100_000])
def test_a_budget_short_of_max_model_len_names_the_longest_context_it_holds(context):
    """vLLM's refusal gives "the estimated maximum model length"; the KV cache refusal named none to try."""
    demand = KVDemand(block_size=16, max_model_len=131_072, max_num_seqs=1, max_num_batched_tokens=8192)
    longest = math.ceil(context / 16) * 16  # the pages that hold `context` positions hold the rest of their block
    assert longest_context_held(TEXT, torch.bfloat16, demand, _pages_for_one(context) * PAGE) == longest
    assert longest_context_held(TEXT, torch.bfloat16, demand, _pages_for_one(context) * PAGE - 1) == (
        longest - 16 if longest > 16 else None)  # under one block of each group: no context at all


def test_the_longest_context_held_beside_a_drafter_holds_the_drafter_s_blocks_too():
    draft = DraftKV(bytes_per_block=PAGE // 13, max_visible_distance=None)
    demand = KVDemand(block_size=16, max_model_len=8192, max_num_seqs=8, max_num_batched_tokens=8192, draft=draft)
    budget = _pages_for_one(4096) * PAGE + 256 * draft.bytes_per_block  # one sequence of 4,096 in every group
    assert longest_context_held(TEXT, torch.bfloat16, demand, budget) == 4096


def _sequences_held(layout, max_model_len: int) -> tuple[float, float]:
    """Sequences of max_model_len the drafter's blocks and the model's pages each hold."""
    return layout.draft_blocks / math.ceil(max_model_len / 16), layout.num_pages / _pages_for_one(max_model_len)


def test_the_drafter_and_the_model_hold_as_many_sequences_at_max_model_len():
    """A drafter that sees its whole context needs every position's block, the model's sliding group a window's: a
    split by bytes per block gave the drafter (the released assistant's 5 layers of 8 heads, unbounded) 4.1 sequences
    of 32k tokens in 10 GB beside pages for 13.9; split by bytes per sequence, both hold 8.4."""
    draft = DraftKV(bytes_per_block=5 * 2 * 16 * 8 * 128 * 2, max_visible_distance=None)
    demand = KVDemand(block_size=16, max_model_len=32768, max_num_seqs=8, max_num_batched_tokens=8192, draft=draft)
    layout, short = plan_kv_layout(TEXT, torch.bfloat16, demand, 10**10)
    drafter_seqs, model_seqs = _sequences_held(layout, 32768)
    assert short == {} and round(drafter_seqs, 1) == round(model_seqs, 1) == 8.4
    assert layout.num_pages == (10**10 - layout.draft_blocks * draft.bytes_per_block) // PAGE
    # a drafter with a window needs a window's blocks per sequence too: the split counts it
    windowed = KVDemand(block_size=16, max_model_len=32768, max_num_seqs=64, max_num_batched_tokens=8192,
                        draft=DraftKV(bytes_per_block=draft.bytes_per_block, max_visible_distance=2047))
    layout = plan_kv_layout(TEXT, torch.bfloat16, windowed, 10**10)[0]
    assert round(layout.draft_blocks / (2048 // 16 + 1), 1) == round(layout.num_pages / _pages_for_one(32768), 1)


def test_max_concurrency_is_the_sequences_of_max_model_len_the_cache_holds_at_once():
    """vLLM's start-up line "Maximum concurrency for N tokens per request": the pages over what one sequence of
    max_model_len takes (a window's blocks in the sliding group), and with a drafter the fewer of its and the
    model's."""
    demand = KVDemand(block_size=16, max_model_len=34 * 1024, max_num_seqs=256, max_num_batched_tokens=8192)
    layout = plan_kv_layout(TEXT, torch.bfloat16, demand, 7_200_000_000)[0]
    assert layout.sequences_held(34 * 1024) == layout.num_pages / _pages_for_one(34 * 1024)
    draft = DraftKV(bytes_per_block=5 * 2 * 16 * 8 * 128 * 2, max_visible_distance=None)
    with_drafter = KVDemand(block_size=16, max_model_len=32768, max_num_seqs=8, max_num_batched_tokens=8192,
                            draft=draft)
    layout = plan_kv_layout(TEXT, torch.bfloat16, with_drafter, 10**10)[0]
    assert layout.sequences_held(32768) == min(_sequences_held(layout, 32768))


def test_the_drafter_never_leaves_the_model_short_of_one_sequence():
    draft = DraftKV(bytes_per_block=PAGE // 13, max_visible_distance=None)  # one layer's block
    demand = KVDemand(block_size=16, max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=8192, draft=draft)
    # a budget that holds one sequence in every group and no more: the proportional share would leave the model's
    # pages short; the drafter keeps what one sequence needs and the model gets the rest
    tight = _pages_for_one(4096) * PAGE + 256 * draft.bytes_per_block
    layout, short = plan_kv_layout(TEXT, torch.bfloat16, demand, tight)
    assert short == {} and (layout.draft_blocks, layout.num_pages) == (256, _pages_for_one(4096))
    layout, short = plan_kv_layout(TEXT, torch.bfloat16, demand, tight - 1)
    assert short  # one byte less: one of them is short, and the plan says which


def test_a_bounded_drafter_context_and_the_windows_are_never_planned_past_every_position():
    draft = DraftKV(bytes_per_block=1, max_visible_distance=63)
    demand = KVDemand(block_size=16, max_model_len=64, max_num_seqs=8, max_num_batched_tokens=1 << 20, draft=draft)
    every_position = 8 * 64 // 16
    assert wanted_blocks(TEXT, demand) == {FULL: every_position, SLIDING: every_position, DRAFT: every_position}
    assert demand.draft_window is None  # 64 positions seen: the whole context
