"""Triton kernel of `glimmer.model.kernels.qk_norm_rope` (see there for the contract)."""

from __future__ import annotations

import triton
import triton.language as tl

from glimmer.model.kernels.jit import wait_for_previous_kernel


@triton.jit
def _round(x, dtype: tl.constexpr):
    """x rounded to the model dtype and back to fp32: where the reference stores an intermediate."""
    return x.to(dtype).to(tl.float32)


@triton.jit
def qk_norm_rope_store(
    QKVG, stride_t, Cos, Sin, stride_cs, QOut, stride_qn, stride_qh,
    KCache, VCache, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, Slots,
    eps, q_scale,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEADS: tl.constexpr, USE_ROPE: tl.constexpr, PDL: tl.constexpr,
):
    """One token's heads [h0, h0 + HEADS) of the NUM_HEADS query heads followed by the key heads (which also
    copy their v head): each row of the tile is one head, normed, scaled, rotated and stored on its own."""
    wait_for_previous_kernel(PDL)
    token = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * HEADS + tl.arange(0, HEADS)
    dtype = QOut.dtype.element_ty
    HALF: tl.constexpr = HEAD_DIM // 2
    offs = tl.arange(0, HALF)
    row = QKVG + token * stride_t
    valid = heads < NUM_HEADS + NUM_KV_HEADS
    is_query = heads < NUM_HEADS
    is_key = valid & (heads >= NUM_HEADS)
    cols = heads[:, None] * HEAD_DIM + offs[None, :]  # k heads follow the q heads directly
    x1 = tl.load(row + cols, mask=valid[:, None], other=0.0).to(tl.float32)
    x2 = tl.load(row + HALF + cols, mask=valid[:, None], other=0.0).to(tl.float32)
    inv_rms = 1.0 / tl.sqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / HEAD_DIM + eps)
    y1 = _round(x1 * inv_rms[:, None], dtype)
    y2 = _round(x2 * inv_rms[:, None], dtype)
    y1 = tl.where(is_query[:, None], _round(y1 * q_scale, dtype), y1)
    y2 = tl.where(is_query[:, None], _round(y2 * q_scale, dtype), y2)
    if USE_ROPE:
        cs = token * stride_cs
        c1 = tl.load(Cos + cs + offs).to(tl.float32)[None, :]
        c2 = tl.load(Cos + cs + HALF + offs).to(tl.float32)[None, :]
        s1 = tl.load(Sin + cs + offs).to(tl.float32)[None, :]
        s2 = tl.load(Sin + cs + HALF + offs).to(tl.float32)[None, :]
        # x·cos + rotate_half(x)·sin, rotate_half(x) = (−x2, x1); each product and the sum rounded
        r1 = _round(_round(y1 * c1, dtype) + _round(-y2 * s1, dtype), dtype)
        r2 = _round(_round(y2 * c2, dtype) + _round(y1 * s2, dtype), dtype)
        y1 = r1
        y2 = r2
    q_out = QOut + token * stride_qn + heads[:, None] * stride_qh + offs[None, :]
    tl.store(q_out, y1.to(dtype), mask=is_query[:, None])
    tl.store(q_out + HALF, y2.to(dtype), mask=is_query[:, None])
    kv_head = tl.where(is_key, heads - NUM_HEADS, 0)
    slot = tl.load(Slots + token)
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    k_out = KCache + block * stride_kb + offset * stride_ks + kv_head[:, None] * stride_kh + offs[None, :]
    tl.store(k_out, y1.to(dtype), mask=is_key[:, None])
    tl.store(k_out + HALF, y2.to(dtype), mask=is_key[:, None])
    v_in = row + (NUM_HEADS + NUM_KV_HEADS + kv_head[:, None]) * HEAD_DIM + offs[None, :]
    v_out = VCache + block * stride_vb + offset * stride_vs + kv_head[:, None] * stride_vh + offs[None, :]
    tl.store(v_out, tl.load(v_in, mask=is_key[:, None]), mask=is_key[:, None])
    tl.store(v_out + HALF, tl.load(v_in + HALF, mask=is_key[:, None]), mask=is_key[:, None])
