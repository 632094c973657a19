"""Decode steps replayed from captured CUDA graphs, for every batch size up to max_num_seqs and any context.

A decode step (one new token per sequence, no media) launches hundreds of small kernels; on a GPU their
launch cost, not the arithmetic, would set the speed. A CUDA graph records one such step and replays it
with a single launch. One graph per size of a ladder (1, 2, 4, 8, then every 8, as vLLM does), all captured
when the engine starts (`capture_graphs`: a batch that shrinks as its requests finish would otherwise
pay a capture at each new size, while it runs); a batch runs in the smallest size that holds it, padded with
rows that read and write only the spare "null" block of each pool.

The attention kernels read the paged cache in place through the block tables, so one graph serves every
context length: its tables are as wide as max_model_len needs, and each step copies in only the columns
it uses (columns past a row's length are never read). The inputs live in static buffers shared by all
graphs; a step fills them with one copy of the flat fields and one per block table (`step_inputs`).

With speculative decoding a step verifies k proposed tokens per sequence: every sequence computes
q = 1 + k tokens. Such a step is a graph of its own, per (batch size, q); it returns the final hidden
states, and the logits are computed outside it (B · q rows of the vocabulary would otherwise stay
allocated in every graph). These too are captured at start-up, for every k the draft policy can choose
(draft_policy.py): captured on first use, each stalled its batch (80–150 ms at the 30B on an H200, against
20–33 ms steps). Steps whose sequences compute different numbers of tokens run eagerly. Every
graph also returns the outputs of the layers a drafter reads (`capture_layers`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from glimmer.engine.kv_cache_manager import KVCacheManager
from glimmer.engine.scheduler import ScheduledStep
from glimmer.engine.step_inputs import StepInputs, build_step_inputs, target_groups
from glimmer.model.kernels.paged_attention import triton_supports
from glimmer.model.kernels.support import side_stream, use_triton
from glimmer.model.kernels.tuned_gemm import cublas_only, forgo
from glimmer.model.muse_glimmer import MuseGlimmerForConditionalGeneration

logger = logging.getLogger(__name__)


def batch_size_ladder(max_num_seqs: int) -> tuple[int, ...]:
    """1, 2, 4, 8, 16, 24, …: the captured batch sizes; the last one holds max_num_seqs."""
    sizes = [s for s in (1, 2, 4) if s < max_num_seqs]
    sizes += range(8, max_num_seqs + 8, 8)
    return tuple(s for s in sizes if s < max_num_seqs + 8)


STEP_MIN_GAIN = 0.005  # a batch size keeps its chosen products only if they make its decode step this much faster
SHARED_POOL = object()  # `_capture`'s default: the memory pool every kept graph shares


def record(forward: Callable[[], object], device: torch.device, pool: tuple | None
           ) -> tuple[Callable[[], None], object]:
    """Capture `forward` into a CUDA graph (in `pool`, or a private pool freed with the graph when None); returns
    (its replay, what the captured forward returned).

    Every warm-up and capture runs on one side stream per device (kernels.support.side_stream): the caching
    allocator reuses a freed block only on the stream that freed it, so with a stream per capture no warm-up reused
    the memory of the one before; and a capture on PyTorch's own capture stream allocated that stream's cuBLAS
    workspace in the graph's pool."""
    stream = side_stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        forward()  # warm-up: kernel compilation and lazy initializations must not happen inside the capture
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        outputs = forward()
    return graph.replay, outputs


@dataclass
class _Graph:
    replay: Callable[[], None]
    logits: torch.Tensor | None  # q == 1: computed in the graph
    final: torch.Tensor | None  # q > 1: the final-normed hidden states, for logits outside
    hidden: list[torch.Tensor]  # the outputs of the captured layers


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
        *,
        capture_layers: tuple[int, ...] = (),
        max_query_len: int = 1,
        eager_replay: bool = False,
    ):
        self.model = model
        self.kv_caches = kv_caches
        self.kv = kv
        self.null_blocks = null_blocks
        self.device = device
        self.capture_layers = capture_layers
        self.max_query_len = max_query_len
        self.sizes = batch_size_ladder(max_num_seqs)
        self.groups = target_groups(kv)
        largest = self.sizes[-1]
        self._flat = torch.zeros(StepInputs.flat_size(largest, largest * max_query_len, len(self.groups)),
                                 dtype=torch.int64, device=device)
        # a verification graph's rows reach q − 1 positions further
        extra = -(-(max_query_len - 1) // kv.block_size)
        self._tables = {g: torch.full((largest, max_blocks[g] + extra), null_blocks[g], dtype=torch.int64,
                                      device=device) for g in self.groups}
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self._last_inputs: dict[int, StepInputs] = {}
        self._pool = None if eager_replay else torch.cuda.graph_pool_handle()

    @staticmethod
    def supported(kv_caches: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> bool:
        """Graphs need the in-place attention kernels (the reference gathers whole tables: too wide to capture)."""
        key_cache = next(iter(kv_caches.values()))[0]
        probe = key_cache.new_empty((1, key_cache.shape[2], key_cache.shape[3]))
        return use_triton(key_cache) and triton_supports(probe, key_cache)

    def padded_size(self, num_seqs: int) -> int:
        return next(s for s in self.sizes if s >= num_seqs)

    def query_len(self, step: ScheduledStep) -> int:
        """Tokens per sequence of a step these graphs can run (see `can_run`)."""
        return step.num_new_tokens[0]

    def can_run(self, step: ScheduledStep) -> bool:
        q = step.num_new_tokens[0]
        return (
            len(step.seqs) <= self.sizes[-1]
            and q <= self.max_query_len
            and all(n == q for n in step.num_new_tokens)
            # every sequence computes its last token and q − 1 proposed ones: all q rows are sampled
            and all(step.samples(i) and step.spec_tokens(i) == q - 1 for i in range(len(step.seqs)))
            # decode positions lie after the media of a prompt, except while a preempted one recomputes
            and not any(item.overlaps(seq.num_computed_tokens, seq.num_computed_tokens + q)
                        for seq in step.seqs for item in seq.multimodal)
        )

    def run(self, inputs: StepInputs, num_seqs: int, input_ids: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits of the first `num_seqs` sequences of a step laid out for `padded_size` (q rows each) and the
        captured layers' outputs (padded rows included); the caller checked `can_run`. `input_ids`: a decode
        step's input tokens on the device, in place of the zeros `inputs` holds for them."""
        size, q = inputs.num_seqs, inputs.max_query_len
        self._load(inputs)
        if input_ids is not None:
            self._flat[:num_seqs].copy_(input_ids)
        graph = self._graphs.get((size, q))
        if graph is None:
            graph = self._graphs[(size, q)] = self._capture(inputs)
        graph.replay()
        if q == 1:
            self._last_inputs[size] = inputs
            return graph.logits[:num_seqs], graph.hidden
        return self.model.compute_logits(graph.final[: num_seqs * q]), graph.hidden

    def _load(self, inputs: StepInputs) -> None:
        self._flat[: inputs.flat.numel()].copy_(inputs.flat, non_blocking=True)
        for group, table in inputs.tables.items():
            self._tables[group][: inputs.num_seqs, : table.shape[1]].copy_(table, non_blocking=True)

    def capture_graphs(self, query_lens: tuple[int, ...] = (1,), progress: bool = False,
                       check_products: Collection[int] = ()) -> None:
        """Capture now the graph of every ladder size for each tokens-per-sequence q of `query_lens` (1: decode,
        1 + k: verifying k proposed tokens; those above max_query_len are left out), most tokens first so the
        smaller ones reuse their memory in the shared pool. Each is captured over padding rows alone.

        check_products: batch sizes whose products were just chosen (kernels/tuned_gemm.py): their decode step is
        timed with those products and with F.linear before any graph is captured (a verification graph of q
        tokens per sequence runs products of size × q rows, which a decode size's check may give up), and the
        choices are kept only if the step is faster with them (`keep_products_if_faster`)."""
        started = time.perf_counter()
        if self._pool is not None:
            for size in sorted(set(check_products) & set(self.sizes)):
                self.keep_products_if_faster(
                    build_step_inputs(ScheduledStep([], []), self.kv, self.null_blocks, size, padding_tokens=1))
        shapes = sorted(((size, q) for size in self.sizes for q in set(query_lens) if q <= self.max_query_len
                         and (size, q) not in self._graphs), key=lambda shape: (-shape[0] * shape[1], -shape[1]))
        for size, q in tqdm(shapes, desc="Capturing CUDA graphs", unit="graph", disable=not progress):
            self.run(build_step_inputs(ScheduledStep([], []), self.kv, self.null_blocks, size, padding_tokens=q), 0)
        logger.info("captured %d CUDA graphs (batch sizes %d to %d, tokens per sequence %s) in %.1f s", len(shapes),
                    self.sizes[0], self.sizes[-1], sorted({q for _, q in shapes}), time.perf_counter() - started)

    @property
    def captured_sizes(self) -> tuple[int, ...]:
        """Batch sizes with a captured decode (one token per sequence) graph."""
        return tuple(sorted(size for size, q in self._graphs if q == 1))

    def replay(self, size: int) -> None:
        """Replay the last step run at `size` again, inputs included (to time the GPU side alone).

        The buffers are shared by every size, so that step's inputs are copied back first. The replay
        rewrites that step's KV slots: call it only while no request runs (benchmarks).
        """
        self._load(self._last_inputs[size])
        self._graphs[(size, 1)].replay()

    def keep_products_if_faster(self, inputs: StepInputs, replays: int = 6) -> None:
        """Time this padding-row decode step from two graphs, one with the products chosen for its batch size and
        one with F.linear, replayed alternately; where the chosen ones do not make the step `STEP_MIN_GAIN`
        faster, they are forgone (for good: the cache file records it). A product timed alone can be faster and
        the step around it not: the kernels beside it change how its start and its end overlap."""
        device_index = self.device.index or 0
        self._load(inputs)
        chosen = self._capture(inputs, pool=None).replay  # private pools: freed with the graphs
        with cublas_only(device_index, inputs.num_seqs):
            plain = self._capture(inputs, pool=None).replay
        times: dict[Callable[[], None], list[float]] = {chosen: [], plain: []}
        for _ in range(replays):
            for replay, spent in times.items():
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                replay()
                end.record()
                end.synchronize()
                spent.append(start.elapsed_time(end))
        chosen_ms, plain_ms = min(times[chosen]), min(times[plain])
        logger.debug("batch %d decode step: %.3f ms with the chosen products, %.3f with F.linear", inputs.num_seqs,
                     chosen_ms, plain_ms)
        if chosen_ms > (1 - STEP_MIN_GAIN) * plain_ms:
            forgo(device_index, inputs.num_seqs, f"the decode step took {chosen_ms:.3f} ms with it and "
                  f"{plain_ms:.3f} with F.linear")

    @torch.inference_mode()
    def _capture(self, inputs: StepInputs, pool: object = SHARED_POOL) -> _Graph:
        size, q = inputs.num_seqs, inputs.max_query_len
        tables = {g: self._tables[g][:size] for g in self.groups}
        num_layers = self.model.config.text.num_hidden_layers

        def forward() -> _Graph:
            input_ids, ctx = inputs.context(self._flat[: inputs.flat.numel()], tables, self.kv.block_size,
                                            self.kv_caches)
            ctx.capture_layers = self.capture_layers
            final = self.model(input_ids, ctx)
            logits = self.model.compute_logits(final) if q == 1 else None
            return _Graph(lambda: None, logits, None if q == 1 else final, ctx.captured_outputs(final, num_layers))

        if pool is SHARED_POOL:
            pool = self._pool
        if self._pool is None:  # eager replay (tests without CUDA): every replay runs the forward again
            graph = forward()

            def replay() -> None:
                fresh = forward()
                graph.logits, graph.final, graph.hidden = fresh.logits, fresh.final, fresh.hidden
        else:
            replay, graph = record(forward, self.device, pool)
        graph.replay = replay
        logger.debug("captured a CUDA graph for batch size %d, %d token(s) per sequence", size, q)
        return graph
