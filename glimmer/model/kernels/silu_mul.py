"""The MLP's activation on a fused gate|up projection: silu(gate) · up (architecture.md §2.4).

The reference computes silu in the model dtype, then the product, each rounded once; so does the kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from glimmer.model.kernels.support import launch_options, use_triton

BLOCK = 1024


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up (N, 2I) = [gate | up] → (N, I)."""
    if use_triton(gate_up) and gate_up.is_contiguous():
        return silu_mul_triton(gate_up)
    return silu_mul_torch(gate_up)


def silu_mul_torch(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def silu_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:
    from glimmer.model.kernels.jit import silu_mul as impl

    rows, width = gate_up.shape
    half = width // 2
    out = torch.empty((rows, half), dtype=gate_up.dtype, device=gate_up.device)
    if rows:
        impl.silu_mul[(rows, -(-half // BLOCK))](gate_up, out, half, BLOCK=BLOCK, num_warps=4,
                                                 **launch_options(gate_up))
    return out
