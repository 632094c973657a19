"""Attention of a flat batch: write this step's keys and values into the paged cache, then attend.

The attention itself is `glimmer.model.kernels.paged_attention`, which picks an in-place Triton kernel on
CUDA and the plain torch reference elsewhere. A forward without a cache (tests, one-shot scoring) lets
each sequence attend to its own new tokens with the reference.
"""

from __future__ import annotations

import torch

from glimmer.model.context import ForwardContext
from glimmer.model.kernels.paged_attention import dense_attention, to_padded, visibility_mask
from glimmer.model.kernels.paged_attention import paged_attention as attend_paged


def write_kv_cache(
    key_cache: torch.Tensor, value_cache: torch.Tensor, slot_mapping: torch.Tensor, key: torch.Tensor,
    value: torch.Tensor,
) -> None:
    """Store each new token's key and value at its flat slot (block · block_size + offset)."""
    num_kv_heads, head_dim = key_cache.shape[2], key_cache.shape[3]
    key_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key)
    value_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value)


def paged_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    ctx: ForwardContext,
    layer_idx: int,
    group_name: str,
    sliding_window: int | None,
    scale: float,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal (optionally sliding-window) GQA attention for a flat batch, gated when `gate` is given.

    query (N, q_heads, d); key/value (N, kv_heads, d) for the new tokens. Returns (N, q_heads · d).
    """
    caches = ctx.kv_caches.get(layer_idx)
    if caches is None:
        mask = visibility_mask(ctx, None, sliding_window)
        return dense_attention(query, to_padded(key, ctx), to_padded(value, ctx), mask, ctx, scale, gate)
    key_cache, value_cache = caches
    group = ctx.groups[group_name]
    write_kv_cache(key_cache, value_cache, group.slot_mapping, key, value)
    return attend_paged(query, key_cache, value_cache, group, ctx, sliding_window, scale, gate)
