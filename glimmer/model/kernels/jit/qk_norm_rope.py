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
    USE_ROPE: tl.constexpr, PDL: tl.constexpr,
):
    """One (token, head): heads [0, NUM_HEADS) are query heads, the rest key heads (which also copy v)."""
    wait_for_previous_kernel(PDL)
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    dtype = QOut.dtype.element_ty
    HALF: tl.constexpr = HEAD_DIM // 2
    offs = tl.arange(0, HALF)
    row = QKVG + token * stride_t
    is_query = head < NUM_HEADS
    base = head * HEAD_DIM  # k heads follow the q heads directly
    x1 = tl.load(row + base + offs).to(tl.float32)
    x2 = tl.load(row + base + HALF + offs).to(tl.float32)
    inv_rms = 1.0 / tl.sqrt((tl.sum(x1 * x1, 0) + tl.sum(x2 * x2, 0)) / HEAD_DIM + eps)
    y1 = _round(x1 * inv_rms, dtype)
    y2 = _round(x2 * inv_rms, dtype)
    if is_query:
        y1 = _round(y1 * q_scale, dtype)
        y2 = _round(y2 * q_scale, dtype)
    if USE_ROPE:
        cs = token * stride_cs
        c1 = tl.load(Cos + cs + offs).to(tl.float32)
        c2 = tl.load(Cos + cs + HALF + offs).to(tl.float32)
        s1 = tl.load(Sin + cs + offs).to(tl.float32)
        s2 = tl.load(Sin + cs + HALF + offs).to(tl.float32)
        # x·cos + rotate_half(x)·sin, rotate_half(x) = (−x2, x1); each product and the sum rounded
        r1 = _round(_round(y1 * c1, dtype) + _round(-y2 * s1, dtype), dtype)
        r2 = _round(_round(y2 * c2, dtype) + _round(y1 * s2, dtype), dtype)
        y1 = r1
        y2 = r2
    if is_query:
        out = QOut + token * stride_qn + head * stride_qh
        tl.store(out + offs, y1.to(dtype))
        tl.store(out + HALF + offs, y2.to(dtype))
    else:
        kv_head = head - NUM_HEADS
        slot = tl.load(Slots + token)
        block = slot // BLOCK_SIZE
        offset = slot % BLOCK_SIZE
        k_out = KCache + block * stride_kb + offset * stride_ks + kv_head * stride_kh
        tl.store(k_out + offs, y1.to(dtype))
        tl.store(k_out + HALF + offs, y2.to(dtype))
        v_in = row + (NUM_HEADS + NUM_KV_HEADS + kv_head) * HEAD_DIM
        v_out = VCache + block * stride_vb + offset * stride_vs + kv_head * stride_vh
        tl.store(v_out + offs, tl.load(v_in + offs))
        tl.store(v_out + HALF + offs, tl.load(v_in + HALF + offs))
