"""A step's layout, built once: flat fields in order, block tables, and graph padding onto the null blocks."""

from __future__ import annotations

import torch

from glimmer import SamplingParams
from glimmer.engine.kv_cache_manager import FULL, SLIDING, KVCacheLayout, KVCacheManager
from glimmer.engine.scheduler import Scheduler, SchedulerConfig
from glimmer.engine.sequence import Sequence
from glimmer.engine.step_inputs import build_step_inputs


def _scheduled(lengths: list[int]):
    kv = KVCacheManager(KVCacheLayout(block_size=4, num_pages=80, pages_per_block={FULL: 1, SLIDING: 1},
                                      sliding_window=6))
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64), kv)
    for n in lengths:
        scheduler.add(Sequence("r", list(range(1, n + 1)), SamplingParams(), frozenset(), 64))
    return kv, scheduler.schedule()


def test_flat_fields_and_tables_describe_the_step():
    kv, step = _scheduled([5, 10])
    inputs = build_step_inputs(step, kv, {FULL: 40, SLIDING: 40})
    input_ids, ctx = inputs.context(inputs.flat, inputs.tables, 4, {})
    assert input_ids.tolist() == list(range(1, 6)) + list(range(1, 11))
    assert ctx.positions.tolist() == list(range(5)) + list(range(10))
    assert ctx.query_start_loc.tolist() == [0, 5, 15] and ctx.seq_lens.tolist() == [5, 10]
    assert ctx.max_query_len == 10
    full = ctx.groups[FULL]
    assert full.block_tables.shape == (2, 3)
    assert full.block_tables[0, 2].item() == 40  # a short row is padded with the null block
    slots = full.slot_mapping.tolist()
    assert slots[:5] == [full.block_tables[0, p // 4].item() * 4 + p % 4 for p in range(5)]


def test_graph_padding_rows_touch_only_the_null_blocks():
    kv, step = _scheduled([3])
    inputs = build_step_inputs(step, kv, {FULL: 40, SLIDING: 41}, padded_seqs=4)
    input_ids, ctx = inputs.context(inputs.flat, inputs.tables, 4, {})
    assert inputs.num_seqs == 4 and inputs.num_tokens == 6
    assert ctx.seq_lens.tolist() == [3, 1, 1, 1]
    assert ctx.query_start_loc.tolist() == [0, 3, 4, 5, 6]
    for group, null in ((FULL, 40), (SLIDING, 41)):
        view = ctx.groups[group]
        assert view.block_tables[1:, 0].tolist() == [null] * 3
        assert view.slot_mapping[3:].tolist() == [null * 4] * 3
    assert torch.equal(input_ids[3:], torch.zeros(3, dtype=torch.int64))


def test_decode_rows_match_the_general_layout_across_window_and_block_boundaries():
    """Decode tokens take a shortcut through the layout; it must give what the per-position path gives, at
    every offset within a block and as the sliding window drops blocks."""
    kv = KVCacheManager(KVCacheLayout(block_size=4, num_pages=160, pages_per_block={FULL: 1, SLIDING: 1},
                                      sliding_window=6))
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64), kv)
    seqs = [Sequence(f"r{n}", list(range(1, n + 1)), SamplingParams(), frozenset(), 64) for n in (1, 3, 4, 7, 9)]
    for seq in seqs:
        scheduler.add(seq)
    for step_index in range(12):
        step = scheduler.schedule()
        assert step.num_new_tokens == ([1] * 5 if step_index else [1, 3, 4, 7, 9])
        inputs = build_step_inputs(step, kv, {FULL: 80, SLIDING: 80})
        input_ids, ctx = inputs.context(inputs.flat, inputs.tables, 4, {})
        expected_ids = [s.token_at(s.num_computed_tokens + p)
                        for s, n in zip(step.seqs, step.num_new_tokens, strict=True) for p in range(n)]
        assert input_ids.tolist() == expected_ids
        for group in (FULL, SLIDING):
            view = ctx.groups[group]
            slots, row_starts = [], []
            for i, (seq, n) in enumerate(zip(step.seqs, step.num_new_tokens, strict=True)):
                visible, start, new_slots = kv.step_blocks(seq, group, n)
                assert view.block_tables[i, : len(visible)].tolist() == visible
                slots += new_slots
                row_starts.append(start)
            assert view.slot_mapping.tolist() == slots
            assert view.kv_start_pos.tolist() == row_starts
        for seq, n in zip(step.seqs, step.num_new_tokens, strict=True):
            seq.num_computed_tokens += n
            if seq.num_computed_tokens == seq.num_tokens:
                seq.output_token_ids.append(100 + step_index)


def test_chunk_ids_and_slots_equal_the_per_position_layout():
    """A prefill or verification chunk's ids and slots are laid out a slice and a block at a time; each equals the
    per-position definition (`token_at`; slot = block · block_size + offset) for chunks starting and ending
    inside blocks, across the prompt/output boundary and into the proposed tokens."""
    kv = KVCacheManager(KVCacheLayout(block_size=4, num_pages=80, pages_per_block={FULL: 1, SLIDING: 1},
                                      sliding_window=6))
    seq = Sequence("r", list(range(1, 8)), SamplingParams(), frozenset(), 64)
    seq.output_token_ids += [50, 51, 52]
    seq.spec_token_ids = [90, 91, 92]
    kv.allocate(seq, seq.num_tokens + len(seq.spec_token_ids))
    for start in range(0, 13):
        for end in range(start, 14):
            assert seq.step_token_ids(start, end) == [seq.token_at(p) for p in range(start, end)], (start, end)
            held = seq.blocks[FULL]
            _, _, slots = kv.blocks_for(seq, FULL, start, end)
            assert slots == [held[p // 4] * 4 + p % 4 for p in range(start, end)], (start, end)
