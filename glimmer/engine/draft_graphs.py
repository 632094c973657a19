"""Drafter steps of decoding batches replayed from CUDA graphs (cuda_graphs.py does the same for the target).

In a decoding batch every sequence brings 1 … T new context rows (the positions its last step committed,
with those that steps without proposals left pending) and denoises one block of T = block_size rows.
Padding each sequence's context to T rows gives the step a fixed shape per batch bucket and block-table
width, so the drafter's few hundred kernels replay as one launch. Padding rows write into a null block of
the drafter's cache that no sequence owns; padding sequences read nothing but it. A step that only writes
context (once a sequence holds a block's worth of pending positions: draft_context.py) is a graph of its
own, without blocks. Other steps (a prompt's context, sequences that do not all decode) run eagerly.
Table widths come in powers of two, the last one cut to the most blocks a windowed drafter's block can
read (the released drafter's 2,049 visible positions: 130 blocks of 16, not 256).

The graphs are captured when the engine starts (`capture_graphs`), every batch bucket and every width:
captured on first use, each stalled its batch (80–220 ms at the 30B on an H200). Their memory is bounded:
the drafter gathers at most `drafter.GATHER_BLOCKS` blocks of context at once.
`eager_replay` runs the same static-buffer forward without capturing (tests without CUDA).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from glimmer.engine.cuda_graphs import batch_size_ladder, record
from glimmer.model.drafter import DFlashDrafter, DraftStep

logger = logging.getLogger(__name__)

WIDTH_BUCKETS = tuple(2**i for i in range(2, 12))


def bucket(value: int, buckets: tuple[int, ...]) -> int | None:
    return next((b for b in buckets if b >= value), None)


@dataclass
class DraftLayout:
    """One drafter step as lists: each sequence's new context rows (positions, cache slots, rows of the
    target's hidden states) and, for the sequences that draft, the block's anchor and what it sees."""

    context_positions: list[list[int]] = field(default_factory=list)
    context_slots: list[list[int]] = field(default_factory=list)
    context_rows: list[list[int]] = field(default_factory=list)
    anchor_ids: list[int] = field(default_factory=list)
    anchor_positions: list[int] = field(default_factory=list)
    tables: list[list[int]] = field(default_factory=list)
    table_starts: list[int] = field(default_factory=list)


@dataclass
class _Graph:
    states: torch.Tensor
    context_positions: torch.Tensor
    context_slots: torch.Tensor
    ids: torch.Tensor
    block_positions: torch.Tensor
    tables: torch.Tensor
    starts: torch.Tensor
    lens: torch.Tensor
    replay: Callable[[], None] = lambda: None
    out: torch.Tensor | None = None


class DraftGraphs:
    def __init__(
        self,
        drafter: DFlashDrafter,
        embed: Callable[[torch.Tensor], torch.Tensor],
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        null_block: int,
        max_num_seqs: int,
        device: torch.device,
        eager_replay: bool = False,
        *,
        widest: int | None = None,
    ):
        """widest: the most cache blocks a block's visible context spans (a windowed drafter); None: unbounded."""
        self.drafter = drafter
        self.embed = embed
        self.kv_caches = kv_caches
        self.null_block = null_block
        self.cache_block_size = kv_caches[0][0].shape[1]
        self.block = drafter.config.block_size
        self.mask_token_id = drafter.config.mask_token_id
        self.device = device
        self.batch_buckets = batch_size_ladder(max_num_seqs)
        self.width_buckets = WIDTH_BUCKETS
        if widest is not None and widest <= WIDTH_BUCKETS[-1]:
            self.width_buckets = (*(w for w in WIDTH_BUCKETS if w < widest), widest)
        self._graphs: dict[tuple[int, int], _Graph] = {}
        # one buffer for every graph's context rows, the target's hidden states at the drafter's target layers (a
        # step fills its own graph's rows just before its replay): one each would take 36 GB at the 30B's 280
        # shapes with max_num_seqs=256
        config = drafter.config
        self._states = torch.zeros((self.batch_buckets[-1] * self.block,
                                    len(config.target_layer_ids) * config.hidden_size),
                                   dtype=kv_caches[0][0].dtype, device=device)
        self._pool = None if eager_replay else torch.cuda.graph_pool_handle()

    def can_run(self, layout: DraftLayout) -> bool:
        """Every sequence brings context (at most one block's worth) and either every one drafts (the same
        sequences, in order: the caller checks) or none does."""
        n = len(layout.context_rows)
        return (
            n > 0
            and len(layout.anchor_ids) in (0, n)
            and all(0 < len(rows) <= self.block for rows in layout.context_rows)
            and bucket(n, self.batch_buckets) is not None
            and (not layout.anchor_ids or bucket(max(map(len, layout.tables)), self.width_buckets) is not None)
        )

    def run(self, layout: DraftLayout, states: torch.Tensor) -> torch.Tensor:
        """The blocks' final hidden states (B, T, H), B = 0 when none drafts; the caller checked `can_run`.
        states: the context rows' concatenated target hidden states, indexed by layout.context_rows."""
        drafting = len(layout.anchor_ids)
        batch = bucket(len(layout.context_rows), self.batch_buckets)
        width = bucket(max(map(len, layout.tables)), self.width_buckets) if drafting else 0
        key = (batch, width)
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._capture(batch, width)
            self._graphs[key] = graph
        self._fill(graph, layout, states)
        graph.replay()
        return graph.out[:drafting]

    def capture_graphs(self, progress: bool = False) -> None:
        """Capture now every batch bucket's context-only graph and its drafting graph at every width, over padding
        sequences alone, largest first so the smaller ones reuse their memory in the pool."""
        started = time.perf_counter()
        shapes = sorted(((batch, width) for batch in self.batch_buckets for width in (0, *self.width_buckets)
                         if (batch, width) not in self._graphs), key=lambda shape: (-shape[0] * shape[1], -shape[0]))
        for batch, width in tqdm(shapes, desc="Capturing drafter CUDA graphs", unit="graph", disable=not progress):
            self._graphs[(batch, width)] = self._capture(batch, width)
        logger.info("captured %d drafter CUDA graphs (batch sizes %d to %d, %d to %d blocks of context) in %.1f s",
                    len(shapes), self.batch_buckets[0], self.batch_buckets[-1], self.width_buckets[0],
                    self.width_buckets[-1], time.perf_counter() - started)

    def _fill(self, graph: _Graph, layout: DraftLayout, states: torch.Tensor) -> None:
        t, cbs = self.block, self.cache_block_size
        padding = graph.lens.shape[0] - len(layout.context_rows)
        null_slots = [self.null_block * cbs + j % cbs for j in range(t)]
        rows, positions, slots = [], [], []
        for seq_rows, seq_positions, seq_slots in zip(layout.context_rows, layout.context_positions,
                                                      layout.context_slots, strict=True):
            pad = t - len(seq_rows)
            rows += seq_rows + [0] * pad
            positions += seq_positions + [0] * pad
            slots += seq_slots + null_slots[len(seq_rows):]
        rows += [0] * (t * padding)
        positions += [0] * (t * padding)
        slots += null_slots * padding
        index = torch.tensor(rows, dtype=torch.int64).to(self.device, non_blocking=True)
        torch.index_select(states, 0, index, out=graph.states)
        graph.context_positions.copy_(torch.tensor(positions), non_blocking=True)
        graph.context_slots.copy_(torch.tensor(slots), non_blocking=True)
        if not graph.tables.shape[1]:
            return  # nothing drafts: the graph only caches the context
        batch, width = graph.tables.shape
        ids = [[a] + [self.mask_token_id] * (t - 1) for a in layout.anchor_ids] + [[0] * t] * padding
        graph.ids.copy_(torch.tensor(ids), non_blocking=True)
        anchors = layout.anchor_positions + [0] * padding
        graph.block_positions.copy_(torch.tensor([list(range(a, a + t)) for a in anchors]), non_blocking=True)
        tables = [row + [self.null_block] * (width - len(row)) for row in layout.tables]
        graph.tables.copy_(torch.tensor(tables + [[self.null_block] * width] * padding), non_blocking=True)
        graph.starts.copy_(torch.tensor(layout.table_starts + [0] * padding), non_blocking=True)
        # context positions before the anchor exist; padding sequences see no cached key
        graph.lens.copy_(torch.tensor(layout.anchor_positions + [0] * padding), non_blocking=True)

    @torch.inference_mode()
    def _capture(self, batch: int, width: int) -> _Graph:
        """A graph for `batch` sequences of a block's worth of context rows each, and their blocks when width > 0."""
        t, device = self.block, self.device
        blocks = batch if width else 0
        zeros = lambda *shape: torch.zeros(shape, dtype=torch.int64, device=device)  # noqa: E731
        graph = _Graph(
            states=self._states[: batch * t],
            context_positions=zeros(batch * t),
            context_slots=torch.full((batch * t,), self.null_block * self.cache_block_size,
                                     dtype=torch.int64, device=device),
            ids=zeros(blocks, t),
            block_positions=torch.arange(t, device=device).repeat(blocks, 1),
            tables=torch.full((blocks, width), self.null_block, dtype=torch.int64, device=device),
            starts=zeros(blocks),
            lens=zeros(batch),
        )

        def forward() -> None:
            step = DraftStep(self.cache_block_size, graph.context_positions, graph.context_slots,
                             graph.block_positions, graph.tables, graph.starts, graph.lens[:blocks])
            graph.out = self.drafter.forward_paged(graph.states, self.embed(graph.ids), step, self.kv_caches)

        if self._pool is None:  # eager replay (tests without CUDA): every replay runs the forward again
            forward()
            graph.replay = forward
        else:
            graph.replay, _ = record(forward, device, self._pool)
        logger.debug("captured a drafter CUDA graph for batch %d, block-table width %d", batch, width)
        return graph
