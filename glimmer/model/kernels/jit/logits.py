"""Triton kernel of `glimmer.model.kernels.logits` (see there for the contract)."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

from glimmer.model.kernels.jit import wait_for_previous_kernel


@triton.jit
def softcap(Logits, count, multiplier, inv_cap, cap, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """In place: cap · tanh((x · multiplier) · (1 / cap)), each op in float32 and rounded to the logits' dtype, as
    torch's four kernels compute it (a division by a host scalar runs as a product with its float32 reciprocal;
    tanh is CUDA's tanhf). `fused_softcap_exact` checks it on every 16-bit input."""
    wait_for_previous_kernel(PDL)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < count
    dtype = Logits.dtype.element_ty
    x = tl.load(Logits + offs, mask=mask, other=0.0)
    x = (x.to(tl.float32) * multiplier).to(dtype)
    x = (x.to(tl.float32) * inv_cap).to(dtype)
    x = x.to(tl.float32)
    # Triton links libdevice flushing subnormals, CUDA's tanhf keeps them: below 2^-20, tanhf(x) is x
    x = tl.where(tl.abs(x) < 9.5367431640625e-07, x, libdevice.tanh(x)).to(dtype)
    x = (x.to(tl.float32) * cap).to(dtype)
    tl.store(Logits + offs, x, mask=mask)
