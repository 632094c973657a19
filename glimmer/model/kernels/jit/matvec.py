"""Triton kernel of `glimmer.model.kernels.linear` (see there for the contract)."""

from __future__ import annotations

import triton
import triton.language as tl

from glimmer.model.kernels.jit import wait_for_previous_kernel


@triton.jit
def matvec(
    X, W, Bias, Out, N, K, stride_w,
    HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    PDL: tl.constexpr,
):
    """BLOCK_N output features: their weight rows streamed once, BLOCK_K columns at a time, summed in fp32."""
    wait_for_previous_kernel(PDL)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_valid = rows < N
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = W + rows[:, None].to(tl.int64) * stride_w + offs_k[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            w = tl.load(w_ptrs + k0, mask=rows_valid[:, None], other=0.0)
            x = tl.load(X + k0 + offs_k)
        else:
            k_valid = offs_k < K - k0
            w = tl.load(w_ptrs + k0, mask=rows_valid[:, None] & k_valid[None, :], other=0.0)
            x = tl.load(X + k0 + offs_k, mask=k_valid, other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    y = tl.sum(acc, 1)
    if HAS_BIAS:
        y += tl.load(Bias + rows, mask=rows_valid, other=0.0).to(tl.float32)
    tl.store(Out + rows, y.to(Out.dtype.element_ty), mask=rows_valid)
