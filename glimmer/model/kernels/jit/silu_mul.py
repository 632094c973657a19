"""Triton kernel of `glimmer.model.kernels.silu_mul` (see there for the contract)."""

from __future__ import annotations

import triton
import triton.language as tl

from glimmer.model.kernels.jit import wait_for_previous_kernel


@triton.jit
def silu_mul(GateUp, Out, half, BLOCK: tl.constexpr, PDL: tl.constexpr):
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < half
    dtype = Out.dtype.element_ty
    g = tl.load(GateUp + row * 2 * half + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(GateUp + row * 2 * half + half + cols, mask=mask, other=0.0).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    tl.store(Out + row * half + cols, (s * u).to(dtype), mask=mask)
