"""Decode steps replayed from captured CUDA graphs.

A decode step (one new token per sequence, no media) launches well over a thousand small kernels; on a
GPU their launch cost, not the arithmetic, sets the speed. A CUDA graph records one such step for a fixed
batch size and block-table width and replays it with a single launch. Inputs live in static buffers that
each step overwrites; rows beyond the real batch are padding that attends to, and writes into, a spare
"null" block of each KV pool, which no sequence ever owns.

Graphs are captured lazily, per (batch bucket, full-attention block bucket), the first time a step needs
one. Steps that do not fit (prefill chunks, media, very long contexts) run eagerly.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from glimmer.engine.kv_cache_manager import SLIDING, KVCacheManager
from glimmer.engine.scheduler import ScheduledStep
from glimmer.model.context import ForwardContext, KVGroupView
from glimmer.model.muse_glimmer import MuseGlimmerForConditionalGeneration

logger = logging.getLogger(__name__)

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
MAX_FULL_BLOCKS = 2048  # contexts beyond 2048 blocks (32k tokens at block size 16) decode eagerly


def _bucket(value: int, buckets: tuple[int, ...]) -> int | None:
    return next((b for b in buckets if b >= value), None)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    tables: dict[str, torch.Tensor]
    starts: dict[str, torch.Tensor]
    slots: dict[str, torch.Tensor]
    logits: torch.Tensor


class DecodeGraphs:
    def __init__(
        self,
        model: MuseGlimmerForConditionalGeneration,
        kv_caches: dict[int, tuple[torch.Tensor, torch.Tensor]],
        kv: KVCacheManager,
        null_blocks: dict[str, int],
        max_num_seqs: int,
        device: torch.device,
    ):
        self.model = model
        self.kv_caches = kv_caches
        self.kv = kv
        self.null_blocks = null_blocks
        self.device = device
        self.batch_buckets = tuple(b for b in BATCH_BUCKETS if b < max_num_seqs) + (
            _bucket(max_num_seqs, BATCH_BUCKETS) or max_num_seqs,)
        bs = kv.block_size
        self.sliding_width = -(-kv.sliding_window // bs) + 1
        self.full_buckets = tuple(2**i for i in range(2, 12) if 2**i <= MAX_FULL_BLOCKS)
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self._pool = torch.cuda.graph_pool_handle()

    def _widths(self, step: ScheduledStep) -> dict[str, int] | None:
        bs = self.kv.block_size
        need = max(-(-(s.num_computed_tokens + 1) // bs) for s in step.seqs)
        full = _bucket(need, self.full_buckets)
        if full is None:
            return None
        return {group: (self.sliding_width if group == SLIDING else full) for group in self.kv.pools}

    def can_run(self, step: ScheduledStep) -> bool:
        return (
            all(n == 1 for n in step.num_new_tokens)
            and all(step.samples(i) for i in range(len(step.seqs)))
            # decode positions lie after the media of a prompt, except while a preempted one recomputes
            and not any(item.overlaps(seq.num_computed_tokens, seq.num_computed_tokens + 1)
                        for seq in step.seqs for item in seq.multimodal)
            and _bucket(len(step.seqs), self.batch_buckets) is not None
            and self._widths(step) is not None
        )

    def run(self, step: ScheduledStep) -> torch.Tensor:
        """Logits (B, vocab) of one decode step; the caller checked `can_run`."""
        widths = self._widths(step)
        batch = _bucket(len(step.seqs), self.batch_buckets)
        key = (batch, widths.get("full", 0))
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._capture(batch, widths)
            self._graphs[key] = graph
        self._fill(graph, step, widths)
        graph.graph.replay()
        return graph.logits[: len(step.seqs)]

    def _fill(self, graph: _Graph, step: ScheduledStep, widths: dict[str, int]) -> None:
        bs = self.kv.block_size
        batch = graph.input_ids.shape[0]
        real = len(step.seqs)
        ids = [seq.token_at(seq.num_computed_tokens) for seq in step.seqs] + [0] * (batch - real)
        positions = [seq.num_computed_tokens for seq in step.seqs] + [0] * (batch - real)
        graph.input_ids.copy_(torch.tensor(ids), non_blocking=True)
        graph.positions.copy_(torch.tensor(positions), non_blocking=True)
        graph.seq_lens.copy_(torch.tensor([p + 1 for p in positions]), non_blocking=True)
        for group in self.kv.pools:
            null = self.null_blocks[group]
            rows, starts, slots = [], [], []
            for seq in step.seqs:
                row, start, new_slots = self.kv.step_blocks(seq, group, 1)
                rows.append(row + [null] * (widths[group] - len(row)))
                starts.append(start)
                slots.extend(new_slots)
            for _ in range(batch - real):
                rows.append([null] * widths[group])
                starts.append(0)
                slots.append(null * bs)
            graph.tables[group].copy_(torch.tensor(rows), non_blocking=True)
            graph.starts[group].copy_(torch.tensor(starts), non_blocking=True)
            graph.slots[group].copy_(torch.tensor(slots), non_blocking=True)

    @torch.inference_mode()
    def _capture(self, batch: int, widths: dict[str, int]) -> _Graph:
        device = self.device
        zeros = lambda *shape: torch.zeros(shape, dtype=torch.int64, device=device)  # noqa: E731
        graph = _Graph(
            graph=torch.cuda.CUDAGraph(),
            input_ids=zeros(batch),
            positions=zeros(batch),
            seq_lens=torch.ones(batch, dtype=torch.int64, device=device),
            tables={g: torch.full((batch, w), self.null_blocks[g], dtype=torch.int64, device=device)
                    for g, w in widths.items()},
            starts={g: zeros(batch) for g in widths},
            slots={g: torch.full((batch,), self.null_blocks[g] * self.kv.block_size, dtype=torch.int64,
                                 device=device) for g in widths},
            logits=torch.empty(0),
        )

        def forward() -> torch.Tensor:
            ctx = ForwardContext(
                query_start_loc=torch.arange(batch + 1, device=device),
                seq_lens=graph.seq_lens,
                positions=graph.positions,
                max_query_len=1,
                kv_caches=self.kv_caches,
                groups={g: KVGroupView(self.kv.block_size, graph.tables[g], graph.starts[g], graph.slots[g])
                        for g in widths},
            )
            return self.model.compute_logits(self.model(graph.input_ids, ctx))

        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            forward()  # warm-up: lazy initializations must not happen inside the capture
        torch.cuda.current_stream(device).wait_stream(stream)
        with torch.cuda.graph(graph.graph, pool=self._pool):
            graph.logits = forward()
        logger.info("captured a decode CUDA graph for batch %d, block widths %s", batch, widths)
        return graph
