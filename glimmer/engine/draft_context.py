"""The drafter context that steps without proposals leave for later (lazy catch-up).

The drafter's keys and values of a committed position are read only by later blocks of its sequence, so a
step that proposes nothing need not run the drafter at all: it keeps a copy of the target hidden states of
the positions it committed (one copy per step, a few MB at batch 64), and the next step that proposes writes
them with its own context rows in one drafter forward. A step without proposals also writes them when some
sequence would otherwise hold more than `max_rows` pending positions, so that a catch-up never brings more
than one block's worth of context per sequence (the shape the drafter's CUDA graphs take) and the copies stay
bounded.

A sequence's pending positions are dropped when it finishes or is preempted (`drop`: preemption frees the
drafter blocks they were meant for, and a re-admission resuming where they end must not write them into a block
it shares from the prefix cache), and when it computes them again; a pending position whose drafter block was
released (it left the drafter's window) is dropped too: no later block can see it. Until
its positions are written, a block of the sequence is not complete in every group, so the engine registers
blocks in the prefix cache only before `first_pending` (kv_cache_manager.register_computed_blocks); a sequence that
ends with a full block still waiting writes its positions then (`SpeculativeDecoder.complete_full_blocks`), as no
later step would.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from glimmer.engine.kv_cache_manager import DRAFT
from glimmer.engine.sequence import Sequence


@dataclass
class CommittedContext:
    """The positions a step committed, with the target hidden states the drafter reads.

    For sequence i, positions starts[i] … starts[i] + counts[i] − 1 were committed; their hidden states
    are rows rows[i] … rows[i] + counts[i] − 1 of each tensor of `hidden` (the step's flat token order),
    one tensor per target layer of the drafter, in its `target_layer_ids` order.
    """

    seqs: list[Sequence]
    starts: list[int]
    counts: list[int]
    rows: list[int]
    hidden: list[torch.Tensor]

    def flat_rows(self) -> list[int]:
        return [r for row, count in zip(self.rows, self.counts, strict=True) for r in range(row, row + count)]

    def states(self, rows: list[int]) -> torch.Tensor:
        """(len(rows), k·H): the concatenated hidden states of step rows `rows` (a copy)."""
        if rows and rows == list(range(rows[0], rows[0] + len(rows))):  # a decode step: one slice, no index
            return torch.cat([h[rows[0] : rows[0] + len(rows)] for h in self.hidden], dim=-1)
        index = torch.tensor(rows, dtype=torch.int64).to(self.hidden[0].device, non_blocking=True)
        return torch.cat([h[index] for h in self.hidden], dim=-1)


@dataclass
class ContextRows:
    """The context positions one drafter forward writes: sequence i's positions starts[i] … starts[i] +
    len(rows[i]) − 1, whose concatenated target hidden states are rows rows[i] of `states`."""

    seqs: list[Sequence] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    rows: list[list[int]] = field(default_factory=list)
    states: torch.Tensor | None = None


@dataclass
class _Pending:
    seq: Sequence
    start: int  # positions start … end − 1
    end: int
    rows: list[int]  # their rows of the stash (the chunks, concatenated)


class PendingContext:
    def __init__(self, max_rows: int, block_size: int):
        self.max_rows = max_rows
        self.block_size = block_size  # the KV cache's
        self._chunks: list[torch.Tensor] = []
        self._num_rows = 0
        self._seqs: dict[int, _Pending] = {}

    @property
    def num_pending(self) -> int:
        return sum(p.end - p.start for p in self._seqs.values())

    def first_pending(self, seq: Sequence) -> int | None:
        """The first committed position of `seq` whose drafter keys/values are not written yet (None: none)."""
        pending = self._seqs.get(id(seq))
        return pending.start if pending is not None and pending.seq is seq else None

    def drop(self, seq: Sequence) -> None:
        """Forget the pending positions of `seq` (it finished or was preempted); the copies go with the last
        sequence's."""
        pending = self._seqs.get(id(seq))
        if pending is not None and pending.seq is seq:
            del self._seqs[id(seq)]
            if not self._seqs:
                self._chunks, self._num_rows = [], 0

    def _continued(self, seq: Sequence, start: int) -> _Pending | None:
        """seq's pending positions if its new ones (from `start`) continue them."""
        pending = self._seqs.get(id(seq))
        return pending if pending is not None and pending.seq is seq and pending.end == start else None

    def defer(self, context: CommittedContext) -> bool:
        """Keep the step's committed positions pending if every sequence stays within `max_rows`; False (and
        nothing kept) if one would not."""
        extended = []
        for seq, start, count in zip(context.seqs, context.starts, context.counts, strict=True):
            pending = self._continued(seq, start)
            if count + (pending.end - pending.start if pending is not None else 0) > self.max_rows:
                return False
            extended.append(pending)
        rows = context.flat_rows()
        if not rows:
            return True
        offset = self._num_rows
        for seq, start, count, pending in zip(context.seqs, context.starts, context.counts, extended, strict=True):
            if pending is None:  # none yet, or left over from before a recomputation: start afresh
                self._seqs[id(seq)] = _Pending(seq, start, start + count, list(range(offset, offset + count)))
            else:
                pending.end += count
                pending.rows.extend(range(offset, offset + count))
            offset += count
        self._chunks.append(context.states(rows))
        self._num_rows = offset
        return True

    def take(self, context: CommittedContext) -> ContextRows:
        """Every live pending position (of every sequence) and the step's committed ones, to write in one drafter
        forward; nothing stays pending. The step's sequences come first, in order."""
        live = {}
        for key, pending in self._seqs.items():
            first, rows = self._live(pending)
            if rows:
                live[key] = (pending, first, rows)
        stash = self._stash() if live else None
        offset = stash.shape[0] if stash is not None else 0
        out = ContextRows()
        for seq, start, count in zip(context.seqs, context.starts, context.counts, strict=True):
            pending, first, rows = live.pop(id(seq), (None, start, []))
            if pending is None or pending.seq is not seq or pending.end != start:  # none, or rolled back since
                first, rows = start, []
            out.seqs.append(seq)
            out.starts.append(first)
            out.rows.append(rows + list(range(offset, offset + count)))
            offset += count
        for pending, first, rows in live.values():  # sequences that did not run this step
            out.seqs.append(pending.seq)
            out.starts.append(first)
            out.rows.append(rows)
        new_rows = context.flat_rows()
        new = context.states(new_rows) if new_rows else None
        parts = [t for t in (stash, new) if t is not None]
        out.states = parts[0] if len(parts) == 1 else torch.cat(parts) if parts else None
        self._chunks, self._num_rows, self._seqs = [], 0, {}
        return out

    def _stash(self) -> torch.Tensor:
        return self._chunks[0] if len(self._chunks) == 1 else torch.cat(self._chunks)

    def _live(self, pending: _Pending) -> tuple[int, list[int]]:
        """The first pending position still worth writing and the stash rows from there on: the sequence runs,
        holds the position's drafter block and has not been rolled back before it (preemption resets what it
        has computed). What is dropped is a prefix (blocks leave the window oldest first) or a suffix."""
        seq = pending.seq
        held = seq.blocks.get(DRAFT) if not seq.is_finished else None
        if not held:
            return pending.end, []
        bs = self.block_size
        first = pending.start
        while first < pending.end and (first // bs >= len(held) or held[first // bs] is None):
            first += 1
        end = min(pending.end, seq.num_computed_tokens)
        return first, pending.rows[first - pending.start : max(first, end) - pending.start]
