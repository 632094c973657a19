"""Runs scheduled steps on the model: owns the KV tensors, lays out the batch, computes logits.

The scheduler decides which tokens run; this file turns that decision into tensors (flat token ids,
positions, per-group block tables and slot mappings in a `ForwardContext`) and back into the hidden
states of the positions that need a next token.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from glimmer.checkpoint.config import TextConfig
from glimmer.engine.cuda_graphs import DecodeGraphs
from glimmer.engine.kv_cache_manager import FULL, SLIDING, KVCacheLayout, KVCacheManager
from glimmer.engine.scheduler import ScheduledStep
from glimmer.engine.sequence import MultimodalItem
from glimmer.model.context import ForwardContext, KVGroupView
from glimmer.model.muse_glimmer import MuseGlimmerForConditionalGeneration


def kv_bytes_per_block(text: TextConfig, group: str, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block of `group` occupies across all of the group's layers (keys and values)."""
    layers = text.full_attention_layers if group == FULL else text.sliding_attention_layers
    element = torch.empty((), dtype=dtype).element_size()
    return len(layers) * 2 * block_size * text.num_key_value_heads * text.head_dim * element


class EncoderCache:
    """Vision features by content hash, so an image repeated across requests or turns is encoded once."""

    def __init__(self, max_items: int = 256):
        self.max_items = max_items
        self._items: OrderedDict[int, torch.Tensor] = OrderedDict()

    def get(self, key: int) -> torch.Tensor | None:
        if key in self._items:
            self._items.move_to_end(key)
        return self._items.get(key)

    def put(self, key: int, value: torch.Tensor) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.max_items:
            self._items.popitem(last=False)


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
        use_cuda_graphs: bool = True,
    ):
        self.model = model
        self.kv = kv
        self.device = device
        self.dtype = dtype
        self.block_size = layout.block_size
        text = model.config.text
        shape_tail = (layout.block_size, text.num_key_value_heads, text.head_dim)
        self.kv_caches: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # one spare block per pool, owned by no sequence: padding rows of captured steps write there
        self.null_blocks = dict(layout.num_blocks)
        for i, kind in enumerate(text.layer_types):
            group = SLIDING if kind == "sliding_attention" else FULL
            shape = (layout.num_blocks[group] + 1, *shape_tail)
            self.kv_caches[i] = (
                torch.zeros(shape, dtype=dtype, device=device),
                torch.zeros(shape, dtype=dtype, device=device),
            )
        self.encoder_cache = EncoderCache()
        self.graphs: DecodeGraphs | None = None
        if device.type == "cuda" and use_cuda_graphs:
            self.graphs = DecodeGraphs(model, self.kv_caches, kv, self.null_blocks, max_num_seqs, device)

    def _group_view(self, group: str, step: ScheduledStep) -> KVGroupView:
        rows: list[list[int]] = []
        starts: list[int] = []
        slots: list[int] = []
        for seq, n in zip(step.seqs, step.num_new_tokens, strict=True):
            visible, start, new_slots = self.kv.step_blocks(seq, group, n)
            rows.append(visible)
            starts.append(start)
            slots.extend(new_slots)
        width = max(len(r) for r in rows)
        table = [r + [0] * (width - len(r)) for r in rows]  # padding keys lie past seq_lens: masked
        return KVGroupView(
            block_size=self.block_size,
            block_tables=torch.tensor(table, dtype=torch.int64, device=self.device),
            kv_start_pos=torch.tensor(starts, dtype=torch.int64, device=self.device),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=self.device),
        )

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
                features = self._features(item)
                for position, row, count in slices:
                    flat = offset + position - start
                    pieces.append((flat, features[row : row + count]))
                    mask[flat : flat + count] = True
            offset += n
        if not pieces:
            return None, None
        pieces.sort(key=lambda piece: piece[0])
        return torch.cat([rows for _, rows in pieces]), mask.to(self.device)

    def _features(self, item: MultimodalItem) -> torch.Tensor:
        cached = self.encoder_cache.get(item.content_hash)
        if cached is None:
            pixels = item.pixel_values.to(self.device)
            grid = item.grid_thw.to(self.device)
            cached = torch.cat(self.model.encode_vision(pixels, grid))
            self.encoder_cache.put(item.content_hash, cached)
        return cached

    @torch.inference_mode()
    def execute(self, step: ScheduledStep) -> tuple[torch.Tensor, list[int]]:
        """Run one step; returns next-token logits (one row per sampling sequence) and their indices."""
        if self.graphs is not None and self.graphs.can_run(step):
            return self.graphs.run(step), list(range(len(step.seqs)))
        positions = [
            list(range(seq.num_computed_tokens, seq.num_computed_tokens + n))
            for seq, n in zip(step.seqs, step.num_new_tokens, strict=True)
        ]
        token_ids = [seq.token_at(p) for seq, pos in zip(step.seqs, positions, strict=True) for p in pos]
        query_start = [0]
        for n in step.num_new_tokens:
            query_start.append(query_start[-1] + n)
        ctx = ForwardContext(
            query_start_loc=torch.tensor(query_start, dtype=torch.int64, device=self.device),
            seq_lens=torch.tensor(
                [s.num_computed_tokens + n for s, n in zip(step.seqs, step.num_new_tokens, strict=True)],
                dtype=torch.int64,
                device=self.device,
            ),
            positions=torch.tensor([p for pos in positions for p in pos], dtype=torch.int64, device=self.device),
            max_query_len=max(step.num_new_tokens),
            kv_caches=self.kv_caches,
            groups={group: self._group_view(group, step) for group in self.kv.pools},
        )
        mm_embeds, mm_mask = self._multimodal_inputs(step, len(token_ids))
        input_ids = torch.tensor(token_ids, dtype=torch.int64, device=self.device)
        hidden = self.model(input_ids, ctx, mm_embeds, mm_mask)
        sampling = [i for i in range(len(step.seqs)) if step.samples(i)]
        last_rows = torch.tensor([query_start[i + 1] - 1 for i in sampling], dtype=torch.int64, device=self.device)
        logits = self.model.compute_logits(hidden[last_rows]) if sampling else hidden.new_zeros((0, 0))
        return logits, sampling

