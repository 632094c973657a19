"""Attention over a paged KV cache, in plain torch (the reference path every device can run).

Queries of a step arrive flat (N tokens of B sequences); keys and values are written into the cache,
then each sequence's visible blocks are gathered and attended with one batched
`scaled_dot_product_attention` call. Device kernels may replace this function; they must agree
with it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from glimmer.model.context import ForwardContext, KVGroupView


def _token_layout(ctx: ForwardContext) -> tuple[torch.Tensor, torch.Tensor]:
    """The (N,) sequence index and row-within-sequence of every token, computed once per step."""
    if "seq_of_token" not in ctx.derived:
        n = ctx.positions.shape[0]
        device = ctx.positions.device
        seq_of_token = torch.repeat_interleave(
            torch.arange(ctx.num_seqs, device=device), ctx.query_lens, output_size=n
        )
        ctx.derived["seq_of_token"] = seq_of_token
        ctx.derived["row_of_token"] = torch.arange(n, device=device) - ctx.query_start_loc[seq_of_token]
    return ctx.derived["seq_of_token"], ctx.derived["row_of_token"]


def _to_padded(flat: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
    """(N, …) → (B, max_query_len, …), zero-filled."""
    seq_of_token, row_of_token = _token_layout(ctx)
    padded = flat.new_zeros((ctx.num_seqs, ctx.max_query_len, *flat.shape[1:]))
    padded[seq_of_token, row_of_token] = flat
    return padded


def _visibility_mask(
    ctx: ForwardContext, group_name: str, group: KVGroupView | None, sliding_window: int | None
) -> torch.Tensor:
    """(B, 1, Tq, Tk) boolean mask shared by all layers of a group in this step.

    With a cache the keys are the group's gathered blocks; without one, each sequence's own new tokens.
    """
    key = f"mask:{group_name}:{group is not None}"
    if key in ctx.derived:
        return ctx.derived[key]
    query_pos = _to_padded(ctx.positions, ctx)
    rows = torch.arange(ctx.max_query_len, device=query_pos.device)
    query_valid = rows[None, :] < ctx.query_lens[:, None]
    if group is not None:
        num_keys = group.block_tables.shape[1] * group.block_size
        key_pos = group.kv_start_pos[:, None] + torch.arange(num_keys, device=query_pos.device)[None, :]
        key_valid = key_pos < ctx.seq_lens[:, None]
    else:
        key_pos, key_valid = query_pos, query_valid
    visible = key_valid[:, None, :] & (key_pos[:, None, :] <= query_pos[:, :, None])
    if sliding_window is not None:
        visible &= key_pos[:, None, :] > query_pos[:, :, None] - sliding_window
    # padded query rows must see something, or softmax over an empty row yields NaN
    visible[:, :, 0] |= ~query_valid
    ctx.derived[key] = visible[:, None, :, :]
    return ctx.derived[key]


def paged_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    ctx: ForwardContext,
    layer_idx: int,
    group_name: str,
    sliding_window: int | None,
    scale: float,
) -> torch.Tensor:
    """Causal (optionally sliding-window) GQA attention for a flat batch.

    query (N, q_heads, d); key/value (N, kv_heads, d) for the new tokens. Returns (N, q_heads, d).
    A query at position p sees keys j ≤ p, and with a window W only p − W < j ≤ p (§2.6).
    Query head h reads key head ⌊h / group⌋ (contiguous groups, §2.5.6).
    """
    caches = ctx.kv_caches.get(layer_idx)
    if caches is not None:
        key_cache, value_cache = caches
        group = ctx.groups[group_name]
        num_kv_heads, head_dim = key_cache.shape[2], key_cache.shape[3]
        key_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, group.slot_mapping, key)
        value_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, group.slot_mapping, value)
        blocks_k = key_cache[group.block_tables]
        blocks_v = value_cache[group.block_tables]
        b, m, bs = blocks_k.shape[:3]
        keys = blocks_k.reshape(b, m * bs, num_kv_heads, head_dim)
        values = blocks_v.reshape(b, m * bs, num_kv_heads, head_dim)
        mask = _visibility_mask(ctx, group_name, group, sliding_window)
    else:
        keys, values = _to_padded(key, ctx), _to_padded(value, ctx)
        mask = _visibility_mask(ctx, group_name, None, sliding_window)

    out = F.scaled_dot_product_attention(
        _to_padded(query, ctx).transpose(1, 2),
        keys.transpose(1, 2),
        values.transpose(1, 2),
        attn_mask=mask,
        scale=scale,
        enable_gqa=query.shape[1] != key.shape[1],
    )
    seq_of_token, row_of_token = _token_layout(ctx)
    return out.transpose(1, 2)[seq_of_token, row_of_token]
