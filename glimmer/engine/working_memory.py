"""Device memory the engine's steps need beside the weights and the KV cache, measured before the cache exists.

On a GPU the KV cache takes what `gpu_memory_utilization` leaves after the weights. What a step allocates while
it runs must still fit beside it: a prefill chunk's activations, a full decode batch's logits, the vision encoder
on the largest image or video, the sampler's float32 copies of the logits, the encoder's cache of features, and
the outputs each captured CUDA graph keeps in its pool. This file measures the first three, the steps on a
stand-in cache of one spare block per group (their padding rows read and write only that block, as the captured
graphs' padding rows do), and counts the others from their shapes, so `LLMEngine` can leave that much free when it
sizes the cache.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import torch

from glimmer.engine.cuda_graphs import batch_size_ladder
from glimmer.engine.kv_cache_manager import KVCacheLayout, KVCacheManager, page_geometry
from glimmer.engine.model_runner import PROMPT_LOGITS_ROWS
from glimmer.engine.scheduler import ScheduledStep
from glimmer.engine.step_inputs import build_step_inputs
from glimmer.errors import ConfigError, option_and_keyword
from glimmer.model.kernels.tuned_gemm import allocate_kept_workspaces
from glimmer.model.muse_glimmer import MuseGlimmerForConditionalGeneration

SAMPLER_ROW_COPIES = 6
"""Float32 vocabulary-wide rows the sampler holds at once per sampled row, at most (sampler.py: the widened
logits, their constrained or penalized copy, probabilities, the top-p sort's values and order, noise)."""


@dataclass(frozen=True)
class WorkingMemory:
    """Bytes, beyond what is allocated when measured: `prefill`, the peak of the largest prefill chunk (as one
    sequence, and spread over every sequence a step may hold) with its logits; `decode`, that of an eager decode
    step of every sequence with its logits; `sampler`, the sampler's float32 rows for every sequence;
    `graph_outputs`, the logits every captured decode graph keeps (0 without graphs); `vision`, the vision
    encoder's peak on the largest item, its pixels included; `encoder_cache`, the cached features at most."""

    prefill: int
    decode: int
    sampler: int
    graph_outputs: int
    vision: int = 0
    encoder_cache: int = 0

    @property
    def steps(self) -> int:
        """What an eager step needs at its peak beside the captured graphs' pool (a prefill step encodes its
        images before its forward runs, beside the features cached)."""
        return max(self.prefill, self.decode, self.vision) + self.sampler + self.encoder_cache

    @property
    def total(self) -> int:
        """All of it: an eager step beside a pool that holds the largest decode step and every graph's outputs."""
        return self.steps + (self.decode + self.graph_outputs if self.graph_outputs else 0)


def device_free_bytes(device: torch.device) -> int:
    """Free memory on `device` once the allocator's cache of freed blocks is handed back: blocks freed at load
    (the unfused projections, say) stay reserved by PyTorch, and `mem_get_info` counts them as used."""
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info(device)[0]


def _peak_bytes(device: torch.device, run: Callable[[], object]) -> int:
    """The most memory `run` allocated at once beyond what was allocated before it (what it returns included,
    freed once measured)."""
    device_free_bytes(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    run()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base


@contextmanager
def _out_of_memory_refused(step: str, fix: str) -> Iterator[None]:
    """ConfigError naming `step` and `fix` for a measuring step the GPU cannot hold beside the weights: torch's
    OutOfMemoryError came out of the engine's construction as a traceback naming no setting."""
    try:
        yield
    except torch.OutOfMemoryError as exc:
        found = str(exc).split(". ")[:2]  # "CUDA out of memory. Tried to allocate 2.44 GiB"
        raise ConfigError(f"the GPU cannot run {step} beside the weights ({'. '.join(found)}), so no KV cache "
                          f"could be sized; {fix}, or free GPU memory") from None


def graph_output_bytes(max_num_seqs: int, query_lens: tuple[int, ...], vocab_size: int, element: int) -> int:
    """The logits the decode graphs keep, one (size, vocab) tensor per captured batch size (graphs of 1 + k tokens
    per sequence keep only hidden states; their logits are computed outside)."""
    return sum(batch_size_ladder(max_num_seqs)) * vocab_size * element if 1 in query_lens else 0


@torch.inference_mode()
def measure_working_memory(
    model: MuseGlimmerForConditionalGeneration, device: torch.device, dtype: torch.dtype, *, block_size: int,
    max_num_seqs: int, max_num_batched_tokens: int, capture_layers: tuple[int, ...] = (),
    query_lens: tuple[int, ...] = (1,), graphs: bool = True, vision_grids: tuple[tuple[int, int, int], ...] = (),
    encoder_cache_rows: int = 0,
) -> WorkingMemory:
    """Run the largest steps over padding rows on a stand-in cache, and the vision encoder on each of
    `vision_grids` (patch grids t, h, w), and measure their peaks (see the module)."""
    allocate_kept_workspaces(device)  # what products keep for good is then missing from the free memory measured
    text = model.config.text
    geometry = page_geometry(text)
    kv = KVCacheManager(KVCacheLayout(block_size, geometry.chunk_pages, geometry.pages_per_block, text.sliding_window),
                        enable_prefix_caching=False)
    null_blocks = dict.fromkeys(geometry.pages_per_block, 1)
    shape = (2, block_size, text.num_key_value_heads, text.head_dim)
    kv_caches = {i: (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
                 for i in range(text.num_hidden_layers)}

    def peak(num_seqs: int, tokens_each: int, logits_rows: int) -> int:
        inputs = build_step_inputs(ScheduledStep([], []), kv, null_blocks, num_seqs, padding_tokens=tokens_each)

        def step() -> object:
            flat = inputs.flat.to(device)
            tables = {g: t.to(device) for g, t in inputs.tables.items()}
            input_ids, ctx = inputs.context(flat, tables, block_size, kv_caches)
            ctx.capture_layers = capture_layers
            final = model(input_ids, ctx)
            return ctx.captured_outputs(final, text.num_hidden_layers), model.compute_logits(final[-logits_rows:])

        return _peak_bytes(device, step)

    chunk = max_num_batched_tokens
    spread = min(max_num_seqs, chunk)
    with _out_of_memory_refused(f"a prefill chunk of max_num_batched_tokens={chunk} tokens",
                                f"lower max_num_batched_tokens ({option_and_keyword('--max-num-batched-tokens')}): a "
                                "longer prompt is prefilled in chunks of that many tokens, so it needs no more"):
        # a prompt scored for logprobs takes PROMPT_LOGITS_ROWS rows of logits at once
        prefill = max(peak(1, chunk, min(chunk, PROMPT_LOGITS_ROWS)), peak(spread, chunk // spread, spread))
    with _out_of_memory_refused(f"a decode step of max_num_seqs={max_num_seqs} sequences",
                                f"lower max_num_seqs ({option_and_keyword('--max-num-seqs')})"):
        decode = peak(max_num_seqs, 1, max_num_seqs)
    kv_caches.clear()

    def encode(grid: tuple[int, int, int]) -> object:
        vision = model.config.vision
        # float32 patch rows, as the media processor gives them
        pixels = torch.zeros((math.prod(grid), vision.patch_temporal * 3 * vision.patch_size**2), device=device)
        return model.encode_vision(pixels, torch.tensor([grid], device=device))

    with _out_of_memory_refused("the vision encoder on the largest image or video item the media limits allow",
                                "lower the media limits (--max-image-side, --max-video-frames; media_limits=)"):
        vision = max((_peak_bytes(device, partial(encode, grid)) for grid in vision_grids), default=0)
    device_free_bytes(device)
    element = torch.empty((), dtype=dtype).element_size()
    return WorkingMemory(
        prefill=prefill, decode=decode, sampler=SAMPLER_ROW_COPIES * max_num_seqs * text.vocab_size * 4,
        graph_outputs=graph_output_bytes(max_num_seqs, query_lens, text.vocab_size, element) if graphs else 0,
        vision=vision, encoder_cache=encoder_cache_rows * text.hidden_size * element,
    )
