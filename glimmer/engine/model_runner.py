"""Runs scheduled steps on the model: owns the KV tensors, lays out the batch, computes logits.

The scheduler decides which tokens run; this file turns that decision into tensors (flat token ids,
positions, per-group block tables and slot mappings in a `ForwardContext`, laid out once by
`step_inputs`) and back into logits: one row for each sequence whose chunk reaches its last token, or,
with speculative decoding, one row for each of its last 1 + k positions (the last token and the k proposed
after it). For a drafter it also returns the outputs of the requested decoder layers at every computed
position. Decode and verification steps replay captured CUDA graphs where they can (`cuda_graphs`).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from glimmer.engine.cache_keys import encoder_key
from glimmer.engine.cuda_graphs import DecodeGraphs
from glimmer.engine.kv_cache_manager import KVCacheLayout, KVCacheManager, page_geometry
from glimmer.engine.model_loader import projection_weights
from glimmer.engine.sampler import TokenLogprobs, scored_token_logprobs
from glimmer.engine.scheduler import ScheduledStep
from glimmer.engine.sequence import MultimodalItem, Sequence
from glimmer.engine.step_inputs import StepInputs, build_step_inputs
from glimmer.model.context import ForwardContext
from glimmer.model.kernels.logits import FUSED_DTYPES, fused_softcap_exact
from glimmer.model.kernels.paged_attention import prefill_warmup_batches
from glimmer.model.kernels.support import dependent_launch, triton_missing_warning, use_triton
from glimmer.model.kernels.tuned_gemm import choose_products
from glimmer.model.muse_glimmer import MuseGlimmerForConditionalGeneration

logger = logging.getLogger(__name__)


PROMPT_LOGITS_ROWS = 512
"""Prompt positions scored per slice: bounds the (rows, vocab) logits held at once."""


@dataclass
class StepLogits:
    """What one step computed. logits: for each sequence index in `sampling`, 1 + (its proposed tokens)
    rows, in that order. prompt_logprobs: for sequences scoring their prompt, the logprobs of the prompt
    tokens this step's chunk predicts. hidden: per layer the drafter reads (in the order asked), its output
    at every token of the step (flat order; a CUDA graph's padding rows follow the real ones); the last
    decoder layer's is the final-normed state, as the reference reports it (§10.1)."""

    logits: torch.Tensor
    sampling: list[int]
    prompt_logprobs: dict[int, list[TokenLogprobs]]
    hidden: list[torch.Tensor] = field(default_factory=list)


def prompt_positions_scored(seq: Sequence, num_new_tokens: int) -> range:
    """Positions of a chunk whose logits predict a prompt token, for a sequence that wants prompt logprobs
    (position p predicts token p + 1; the last prompt position predicts the first generated token)."""
    if not seq.scores_prompt:
        return range(0)
    start = seq.num_computed_tokens
    return range(start, min(start + num_new_tokens, len(seq.prompt_token_ids) - 1))


class EncoderCache:
    """Vision features by content hash (and cache salt: `cache_keys.encoder_key`), so an image repeated across
    requests or turns is encoded once, and shared only among requests with the same salt. Holds at
    most `max_items` items and `max_rows` feature rows (None: no bound) together, dropping the least recently
    used first; the item just put always stays, however large."""

    def __init__(self, max_items: int = 256, max_rows: int | None = None):
        self.max_items = max_items
        self.max_rows = max_rows
        self._items: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self._rows = 0

    def get(self, key: bytes) -> torch.Tensor | None:
        if key in self._items:
            self._items.move_to_end(key)
        return self._items.get(key)

    def put(self, key: bytes, value: torch.Tensor) -> None:
        if key in self._items:
            self._rows -= self._items[key].shape[0]
        self._items[key] = value
        self._rows += value.shape[0]
        self._items.move_to_end(key)
        while len(self._items) > 1 and (len(self._items) > self.max_items
                                        or (self.max_rows is not None and self._rows > self.max_rows)):
            self._rows -= self._items.popitem(last=False)[1].shape[0]


class ModelRunner:
    def __init__(
        self,
        model: MuseGlimmerForConditionalGeneration,
        layout: KVCacheLayout,
        kv: KVCacheManager,
        device: torch.device,
        dtype: torch.dtype,
        *,
        max_num_seqs: int = 256,
        max_model_len: int | None = None,
        use_cuda_graphs: bool = True,
        capture_layers: tuple[int, ...] = (),
        query_lens: tuple[int, ...] = (1,),
        progress: bool = False,
        token_count: int | None = None,
        encoder_cache_rows: int | None = None,
    ):
        """query_lens: the tokens per sequence of the decode-shaped steps to replay from CUDA graphs, all captured
        here: 1 (decode) and, with speculative decoding, 1 + k for each k the draft policy can choose.
        token_count: the tokenizer's ids (logit columns from here on are vocabulary padding: never a prompt
        logprob's alternative, never counted in its rank); None: every column is a token.
        encoder_cache_rows: the vision feature rows the encoder cache may hold (`EncoderCache`)."""
        self.model = model
        self.token_count = token_count
        self.capture_layers = capture_layers
        self.kv = kv
        self.device = device
        self.dtype = dtype
        self.block_size = layout.block_size
        text = model.config.text
        geometry = page_geometry(text)
        chunk = layout.chunk_pages
        # a spare chunk's worth of pages past the pool's, owned by no sequence: padding rows of captured steps read
        # and write there (a last chunk with fewer pages keeps its missing pages out of use: block_pool.py)
        shape = (layout.num_pages + chunk, layout.block_size, text.num_key_value_heads, text.head_dim)
        pages = [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
                 for _ in range(geometry.page_layers)]
        # a layer's cache: its page tensor from its offset within a block on, so block id b (a chunk's first page,
        # or a page) reads page b + offset of that tensor; the kernels see one (pages, block_size, kv heads, head
        # dim) tensor per layer as before
        self.kv_caches: dict[int, tuple[torch.Tensor, torch.Tensor]] = {
            layer: (pages[tensor][0][offset:], pages[tensor][1][offset:])
            for layer, (tensor, offset) in sorted(geometry.placement.items())
        }
        self.null_blocks = dict.fromkeys(layout.pages_per_block, layout.num_pages)
        self.encoder_cache = EncoderCache(max_rows=encoder_cache_rows)
        self.graphs: DecodeGraphs | None = None
        key_cache = next(iter(self.kv_caches.values()))[0]
        missing_triton = triton_missing_warning(device)
        if missing_triton is not None:
            logger.warning(missing_triton)
        if use_triton(key_cache):
            dependent_launch(device.index or 0)  # probed now, before any graph capture (kernels.support)
            if dtype in FUSED_DTYPES:  # likewise the fused soft-cap's exactness (kernels/logits.py)
                fused_softcap_exact(device.index or 0, dtype, text.output_multiplier, text.final_logit_softcapping)
        in_place_attention = device.type == "cuda" and DecodeGraphs.supported(self.kv_caches)
        if in_place_attention and use_cuda_graphs:
            max_blocks = kv.blocks_needed_for(max_model_len or text.max_position_embeddings)
            self.graphs = DecodeGraphs(model, self.kv_caches, kv, self.null_blocks, max_num_seqs, max_blocks, device,
                                       capture_layers=capture_layers, max_query_len=max(query_lens))
            # before any capture: each graph records the product chosen for its batch size (kernels/tuned_gemm.py)
            choices = choose_products([*projection_weights(model), model.lm_head.weight], self.graphs.sizes, progress)
            check = {c.shape.rows for c in choices if c.measured and c.algo_hex is not None}
            self.graphs.capture_graphs(query_lens, progress, check_products=check)
        if in_place_attention:
            self._compile_prefill_kernels()

    def _multimodal_inputs(
        self, step: ScheduledStep, flat_len: int
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Vision rows for the placeholder positions computed in this step, in flat token order, and where
        they go."""
        pieces: list[tuple[int, torch.Tensor]] = []
        mask = torch.zeros(flat_len, dtype=torch.bool)
        offset = 0
        for seq, n in zip(step.seqs, step.num_new_tokens, strict=True):
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            for item in seq.multimodal:
                slices = item.feature_slices(start, end)
                if not slices:
                    continue
                features = self._features(item, seq.params.cache_salt)
                for position, row, count in slices:
                    flat = offset + position - start
                    pieces.append((flat, features[row : row + count]))
                    mask[flat : flat + count] = True
            offset += n
        if not pieces:
            return None, None
        pieces.sort(key=lambda piece: piece[0])
        return torch.cat([rows for _, rows in pieces]), mask.to(self.device)

    def _features(self, item: MultimodalItem, cache_salt: str | None) -> torch.Tensor:
        key = encoder_key(item.content_hash, cache_salt)
        cached = self.encoder_cache.get(key)
        if cached is None:
            pixels = item.pixel_values.to(self.device)
            grid = item.grid_thw.to(self.device)
            cached = torch.cat(self.model.encode_vision(pixels, grid))
            self.encoder_cache.put(key, cached)
        return cached

    def _device_context(self, inputs: StepInputs, input_ids: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, ForwardContext]:
        """(input_ids, ForwardContext) of an eagerly run step, its inputs copied to the device. `input_ids`: a
        decode step's tokens already on the device (`execute`), written over the zeros `inputs` holds for them."""
        flat = inputs.flat.to(self.device, non_blocking=True)
        if input_ids is not None:
            flat[: input_ids.shape[0]].copy_(input_ids)  # the ids lead the flat fields, one per decode sequence
        tables = {g: t.to(self.device, non_blocking=True) for g, t in inputs.tables.items()}
        return inputs.context(flat, tables, self.block_size, self.kv_caches)

    @torch.inference_mode()
    def _compile_prefill_kernels(self) -> None:
        """Run one prefill step of padding rows (two tokens each, written to the null blocks) for each batch of
        `prefill_warmup_batches`: every attention variant a prefill or mixed step can launch is compiled now,
        not in the middle of serving, where one compile stalls every request of the batch."""
        text = self.model.config.text
        started = time.perf_counter()
        batches = prefill_warmup_batches(text.num_attention_heads, text.num_key_value_heads, text.head_dim,
                                         self.dtype, self.device)
        for num_seqs in batches:
            inputs = build_step_inputs(ScheduledStep([], []), self.kv, self.null_blocks, num_seqs, padding_tokens=2)
            self.model(*self._device_context(inputs))
        torch.cuda.synchronize(self.device)
        logger.info("compiled the prefill kernels (%d warm-up steps) in %.1f s", len(batches),
                    time.perf_counter() - started)

    @torch.inference_mode()
    def execute(self, step: ScheduledStep, input_ids: torch.Tensor | None = None) -> StepLogits:
        """Run one step: logits for the sequences that sample (see `StepLogits`), the prompt logprobs of
        sequences that score their prompt, and the captured layers.

        `input_ids`: a decode step's input tokens as a device tensor, one per sequence (the tokens the step
        before sampled, not yet read by the host: `lookahead.py`)."""
        on_device = input_ids is not None
        if self.graphs is not None and self.graphs.can_run(step):
            q = self.graphs.query_len(step)
            inputs = build_step_inputs(step, self.kv, self.null_blocks, self.graphs.padded_size(len(step.seqs)), q,
                                       ids_on_device=on_device)
            logits, hidden = self.graphs.run(inputs, len(step.seqs), input_ids)
            return StepLogits(logits, list(range(len(step.seqs))), {}, hidden)
        inputs = build_step_inputs(step, self.kv, self.null_blocks, ids_on_device=on_device)
        input_ids, ctx = self._device_context(inputs, input_ids)
        ctx.capture_layers = self.capture_layers
        mm_embeds, mm_mask = self._multimodal_inputs(step, inputs.num_tokens)
        final = self.model(input_ids, ctx, mm_embeds, mm_mask)
        hidden = ctx.captured_outputs(final, self.model.config.text.num_hidden_layers)
        prompt_logprobs = self._prompt_logprobs(step, final)
        sampling = [i for i in range(len(step.seqs)) if step.samples(i)]
        if not sampling:
            logits = final.new_zeros((0, 0))
        elif len(sampling) == len(step.seqs) and inputs.max_query_len == 1:
            logits = self.model.compute_logits(final)
        else:
            ends = list(itertools.accumulate(step.num_new_tokens))
            rows = [r for i in sampling for r in range(ends[i] - 1 - step.spec_tokens(i), ends[i])]
            logits = self.model.compute_logits(final[torch.tensor(rows, dtype=torch.int64, device=self.device)])
        return StepLogits(logits, sampling, prompt_logprobs, hidden)

    def _prompt_logprobs(self, step: ScheduledStep, hidden: torch.Tensor) -> dict[int, list[TokenLogprobs]]:
        """Per step row that scores its prompt: the logprobs of the prompt tokens this step's rows predict."""
        scored_rows: dict[int, list[TokenLogprobs]] = {}
        row_start = 0
        for i, (seq, n) in enumerate(zip(step.seqs, step.num_new_tokens, strict=True)):
            scored = prompt_positions_scored(seq, n)
            if scored:
                first_row = row_start + scored.start - seq.num_computed_tokens
                scored_rows[i] = self._score(seq, hidden[first_row : first_row + len(scored)], scored)
            row_start += n
        return scored_rows

    def _score(self, seq: Sequence, hidden: torch.Tensor, positions: range) -> list[TokenLogprobs]:
        """Logprobs of the prompt tokens at `positions + 1`, from the hidden states at `positions`."""
        k = seq.params.prompt_logprobs or 0
        scored: list[TokenLogprobs] = []
        for offset in range(0, len(positions), PROMPT_LOGITS_ROWS):
            rows = hidden[offset : offset + PROMPT_LOGITS_ROWS]
            targets = [seq.prompt_token_ids[p + 1] for p in positions[offset : offset + PROMPT_LOGITS_ROWS]]
            scored.extend(scored_token_logprobs(self.model.compute_logits(rows), targets, k, self.token_count))
        return scored
