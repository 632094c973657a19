"""The drafter context left pending by steps without proposals (glimmer/engine/draft_context.py)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from glimmer.engine.draft_context import CommittedContext, PendingContext
from glimmer.engine.kv_cache_manager import DRAFT

BLOCK = 4  # the KV cache's block size here


def _seq(computed: int, blocks: list[int | None]) -> SimpleNamespace:
    return SimpleNamespace(num_computed_tokens=computed, blocks={DRAFT: blocks}, is_finished=False)


def _decode_step(pending: PendingContext, seqs, hidden) -> bool:
    """Every sequence committed one position (its last computed); hidden rows in sequence order."""
    return pending.defer(CommittedContext(list(seqs), [s.num_computed_tokens - 1 for s in seqs], [1] * len(seqs),
                                          list(range(len(seqs))), hidden))


def _advance(seqs) -> None:
    for seq in seqs:
        seq.num_computed_tokens += 1


def test_pending_rows_come_back_with_their_hidden_states_in_position_order():
    a, b = _seq(10, [0, 1, 2]), _seq(6, [3, 4])
    pending = PendingContext(max_rows=3, block_size=BLOCK)
    states = []
    for step in range(3):
        hidden = [torch.full((2, 2), 10.0 * step + i) for i in range(2)]  # two target layers
        assert _decode_step(pending, [a, b], hidden)
        states.append(torch.cat(hidden, dim=-1))
        _advance([a, b])
    assert pending.first_pending(a) == 9 and pending.first_pending(b) == 5
    assert not _decode_step(pending, [a, b], hidden)  # a fourth row would exceed max_rows: nothing is kept
    new = [torch.full((2, 2), 99.0) for _ in range(2)]
    rows = pending.take(CommittedContext([a], [12], [1], [0], new))
    assert rows.seqs == [a, b] and rows.starts == [9, 5]
    assert [len(r) for r in rows.rows] == [4, 3]
    expected_a = torch.stack([states[s][0] for s in range(3)] + [torch.cat(new, dim=-1)[0]])
    assert torch.equal(rows.states[rows.rows[0]], expected_a)
    assert torch.equal(rows.states[rows.rows[1]], torch.stack([states[s][1] for s in range(3)]))
    assert pending.num_pending == 0 and pending.first_pending(a) is None


def test_a_finished_sequence_leaves_nothing_behind():
    a, b = _seq(10, [0, 1, 2]), _seq(6, [3, 4])
    pending = PendingContext(max_rows=3, block_size=BLOCK)
    _decode_step(pending, [a, b], [torch.zeros(2, 2)])
    pending.drop(a)
    assert pending.first_pending(a) is None and pending.first_pending(b) == 5
    b.is_finished = True
    rows = pending.take(CommittedContext([], [], [], [], [torch.zeros(0, 2)]))
    assert rows.seqs == [] and rows.states is None


def test_a_preempted_or_recomputed_sequence_loses_its_pending_rows():
    a = _seq(10, [0, 1, 2])
    pending = PendingContext(max_rows=3, block_size=BLOCK)
    _decode_step(pending, [a], [torch.zeros(1, 2)])
    a.blocks, a.num_computed_tokens = {}, 0  # preempted: blocks freed, to be recomputed
    assert pending.take(CommittedContext([], [], [], [], [torch.zeros(0, 2)])).seqs == []
    a.blocks, a.num_computed_tokens = {DRAFT: [5, 6, 7]}, 9
    _decode_step(pending, [a], [torch.zeros(1, 2)])  # position 8 pending
    # recomputed from position 4 on (a prefix hit of one block): the pending row does not continue, it is replaced
    rows = pending.take(CommittedContext([a], [4], [5], [0], [torch.ones(5, 2)]))
    assert rows.starts == [4] and len(rows.rows[0]) == 5


def test_pending_positions_whose_block_left_the_window_are_not_written():
    a = _seq(8, [0, 1])
    pending = PendingContext(max_rows=5, block_size=BLOCK)
    for _ in range(3):  # positions 7, 8, 9
        _decode_step(pending, [a], [torch.arange(2.0)[None]])
        _advance([a])
        a.blocks[DRAFT].append(len(a.blocks[DRAFT])) if a.num_computed_tokens % BLOCK == 1 else None
    a.blocks[DRAFT][1] = None  # block 1 (positions 4 … 7) released: no later block sees position 7
    rows = pending.take(CommittedContext([a], [10], [1], [0], [torch.arange(2.0)[None]]))
    assert rows.starts == [8] and len(rows.rows[0]) == 3
