"""Decode steps replayed from captured CUDA graphs, for every batch size up to max_num_seqs and any context.

A decode step (one new token per sequence, no media) launches hundreds of small kernels; on a GPU their
launch cost, not the arithmetic, would set the speed. A CUDA graph records one such step and replays it
with a single launch. Graphs are captured lazily, one per size of a ladder (1, 2, 4, 8, then every 8,
as vLLM does); a batch runs in the smallest size that holds it, padded with rows that read and write
only the spare "null" block of each pool.

The attention kernels read the paged cache in place through the block tables, so one graph serves every
context length: its tables are as wide as max_model_len needs, and each step copies in only the columns
it uses (columns past a row's length are never read). The inputs live in static buffers shared by all
graphs; a step fills them with one copy of the flat fields and one per block table (`step_inputs`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from glimmer.engine.kv_cache_manager import KVCacheManager
from glimmer.engine.scheduler import ScheduledStep
from glimmer.engine.step_inputs import StepInputs
from glimmer.model.kernels.paged_attention import triton_supports
from glimmer.model.kernels.support import use_triton
from glimmer.model.muse_glimmer import MuseGlimmerForConditionalGeneration

logger = logging.getLogger(__name__)


def batch_size_ladder(max_num_seqs: int) -> tuple[int, ...]:
    """1, 2, 4, 8, 16, 24, …: the captured batch sizes; the last one holds max_num_seqs."""
    sizes = [s for s in (1, 2, 4) if s < max_num_seqs]
    sizes += range(8, max_num_seqs + 8, 8)
    return tuple(s for s in sizes if s < max_num_seqs + 8)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor


class DecodeGraphs:
    def __init__(
        self,
        model: MuseGlimmerForConditionalGeneration,
        kv_caches: dict[int, tuple[torch.Tensor, torch.Tensor]],
        kv: KVCacheManager,
        null_blocks: dict[str, int],
        max_num_seqs: int,
        max_blocks: dict[str, int],
        device: torch.device,
    ):
        self.model = model
        self.kv_caches = kv_caches
        self.kv = kv
        self.null_blocks = null_blocks
        self.device = device
        self.sizes = batch_size_ladder(max_num_seqs)
        self.groups = tuple(kv.pools)
        largest = self.sizes[-1]
        self._flat = torch.zeros(StepInputs.flat_size(largest, largest, len(self.groups)), dtype=torch.int64,
                                 device=device)
        self._tables = {g: torch.full((largest, max_blocks[g]), null_blocks[g], dtype=torch.int64, device=device)
                        for g in self.groups}
        self._graphs: dict[int, _Graph] = {}
        self._last_inputs: dict[int, StepInputs] = {}
        self._pool = torch.cuda.graph_pool_handle()

    @staticmethod
    def supported(kv_caches: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> bool:
        """Graphs need the in-place attention kernels (the reference gathers whole tables: too wide to capture)."""
        key_cache = next(iter(kv_caches.values()))[0]
        probe = key_cache.new_empty((1, key_cache.shape[2], key_cache.shape[3]))
        return use_triton(key_cache) and triton_supports(probe, key_cache)

    def padded_size(self, num_seqs: int) -> int:
        return next(s for s in self.sizes if s >= num_seqs)

    def can_run(self, step: ScheduledStep) -> bool:
        return (
            len(step.seqs) <= self.sizes[-1]
            and all(n == 1 for n in step.num_new_tokens)
            and all(step.samples(i) for i in range(len(step.seqs)))
            # decode positions lie after the media of a prompt, except while a preempted one recomputes
            and not any(item.overlaps(seq.num_computed_tokens, seq.num_computed_tokens + 1)
                        for seq in step.seqs for item in seq.multimodal)
        )

    def run(self, inputs: StepInputs) -> torch.Tensor:
        """Logits (padded batch, vocab) of one decode step laid out for `padded_size`; the caller checked
        `can_run`."""
        size = inputs.num_seqs
        self._load(inputs)
        graph = self._graphs.get(size)
        if graph is None:
            graph = self._graphs[size] = self._capture(inputs)
        graph.graph.replay()
        self._last_inputs[size] = inputs
        return graph.logits

    def _load(self, inputs: StepInputs) -> None:
        self._flat[: inputs.flat.numel()].copy_(inputs.flat, non_blocking=True)
        for group, table in inputs.tables.items():
            self._tables[group][: inputs.num_seqs, : table.shape[1]].copy_(table, non_blocking=True)

    @property
    def captured_sizes(self) -> tuple[int, ...]:
        return tuple(sorted(self._graphs))

    def replay(self, size: int) -> None:
        """Replay the last step run at `size` again, inputs included (to time the GPU side alone).

        The buffers are shared by every size, so that step's inputs are copied back first. The replay
        rewrites that step's KV slots: call it only while no request runs (benchmarks).
        """
        self._load(self._last_inputs[size])
        self._graphs[size].graph.replay()

    @torch.inference_mode()
    def _capture(self, inputs: StepInputs) -> _Graph:
        size = inputs.num_seqs
        tables = {g: self._tables[g][:size] for g in self.groups}

        def forward() -> torch.Tensor:
            input_ids, ctx = inputs.context(self._flat[: inputs.flat.numel()], tables, self.kv.block_size,
                                            self.kv_caches)
            return self.model.compute_logits(self.model(input_ids, ctx))

        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            forward()  # warm-up: kernel compilation and lazy initializations must not happen inside the capture
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = forward()
        logger.info("captured a decode CUDA graph for batch size %d", size)
        return _Graph(graph, logits)
