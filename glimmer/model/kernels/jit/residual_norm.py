"""Triton kernel of `glimmer.model.kernels.residual_norm` (see there for the contract)."""

from __future__ import annotations

import triton
import triton.language as tl

from glimmer.model.kernels.jit import wait_for_previous_kernel


@triton.jit
def residual_norm(
    H, Residual, WPost, WNext, ResidualOut, Normed, width, eps_post, offset_post, eps_next, offset_next,
    HAS_H: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0).to(tl.int64) * width
    cols = tl.arange(0, BLOCK)
    mask = cols < width
    dtype = Normed.dtype.element_ty
    x = tl.load(Residual + row + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_H:
        h = tl.load(H + row + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(WPost + cols, mask=mask, other=0.0).to(tl.float32)
        h = h * (1.0 / tl.sqrt(tl.sum(h * h, 0) / width + eps_post)) * (offset_post + w)
        x = (x + h.to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        tl.store(ResidualOut + row + cols, x.to(dtype), mask=mask)
    w = tl.load(WNext + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * (1.0 / tl.sqrt(tl.sum(x * x, 0) / width + eps_next)) * (offset_next + w)
    tl.store(Normed + row + cols, y.to(dtype), mask=mask)
