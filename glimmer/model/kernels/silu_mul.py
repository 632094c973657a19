"""The MLP's activation on a fused gate|up projection: silu(gate) · up (architecture.md §2.4).

The reference computes silu in the model dtype, then the product, each rounded once; so do the kernels (Triton on
CUDA, C for float32 on the CPU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from glimmer.model.kernels import cpu
from glimmer.model.kernels.support import launch_options, use_triton

BLOCK = 1024


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up (N, 2I) = [gate | up] → (N, I)."""
    if use_triton(gate_up) and gate_up.is_contiguous():
        return silu_mul_triton(gate_up)
    if gate_up.dim() == 2 and gate_up.is_contiguous() and gate_up.shape[1] % 2 == 0 and cpu.runs(gate_up):
        return silu_mul_cpu(gate_up)
    return silu_mul_torch(gate_up)


def silu_mul_torch(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def silu_mul_cpu(gate_up: torch.Tensor, lib=None) -> torch.Tensor:
    lib = cpu.library() if lib is None else lib
    rows, width = gate_up.shape
    out = gate_up.new_empty((rows, width // 2))
    lib.glimmer_silu_mul(gate_up.data_ptr(), rows, width // 2, out.data_ptr(), cpu.threads())
    return out


def probe_cpu(lib) -> str | None:
    """The C kernel against the reference (cpu.library's load-time check), tails of the exponential included."""
    gate_up = torch.randn(3, 64, generator=torch.Generator().manual_seed(0)) * 4
    gate_up[0, :4] = torch.tensor([-100.0, 100.0, -87.0, 89.0])
    if not torch.allclose(silu_mul_cpu(gate_up, lib=lib), silu_mul_torch(gate_up), rtol=1e-5, atol=1e-6):
        return "silu_mul"
    return None


def silu_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:
    from glimmer.model.kernels.jit import silu_mul as impl

    rows, width = gate_up.shape
    half = width // 2
    out = torch.empty((rows, half), dtype=gate_up.dtype, device=gate_up.device)
    if rows:
        impl.silu_mul[(rows, -(-half // BLOCK))](gate_up, out, half, BLOCK=BLOCK, num_warps=4,
                                                 **launch_options(gate_up))
    return out
