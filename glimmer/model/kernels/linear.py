"""A projection, y = x · Wᵀ + b: the one entry point the model's projections call.

Three implementations, picked per call:
- a weight packed for the CPU's matrix library (`PackedLinear`, see packed_linear.py) runs its own product;
- one row on a GPU in bf16 or fp16 (every projection of a batch-1 decode step, and the lm_head) runs a Triton
  GEMV: each program streams BLOCK_N weight rows once, BLOCK_K columns at a time, sums in fp32 and rounds once,
  with the bias added in fp32 before the rounding, as cuBLAS's epilogue does. cuBLAS picks split-K kernels for
  some of these shapes (a second reduction kernel each) and reads the smaller weights at 3.2–3.5 TB/s on an
  H200; this kernel reads every shape of the 30B at 4.2–4.4 TB/s, and it is launched as a dependent launch
  (support.py), so the gap before it overlaps the kernel ahead of it;
- a shape the engine measured at start-up where one of cuBLASLt's algorithms beats cuBLAS's default (a decode
  step's few rows; tuned_gemm.py) runs that algorithm;
- anything else is `F.linear`, the reference.

The GEMV sums in another order than cuBLAS, so a bf16 output can differ from `F.linear`'s by one rounding step
(as cuBLAS's own kernels for different batch sizes differ from each other); float32 always takes `F.linear`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from glimmer.model.kernels.packed_linear import PackedLinear
from glimmer.model.kernels.support import launch_options, multiprocessor_count, next_power_of_2, use_triton
from glimmer.model.kernels.tuned_gemm import tuned_linear, tuned_product

MATVEC_DTYPES = (torch.bfloat16, torch.float16)
# (BLOCK_N, BLOCK_K, warps): the wide tile reads most shapes fastest; an H200 holds about 4 of its programs per
# SM at once, and where that leaves a last wave of a few programs (the 30B's q|k|v|gate: 544 programs against
# 528 places, 40 µs instead of 28) the narrow tile's finer grain is faster (measured on an H200, µs per weight:
# q|k|v|gate 39.8 → 28.5, against o 15.7, gate|up 117.4, down 69.0, lm_head 581 with the wide tile)
WIDE_TILE = (16, 256, 4)
NARROW_TILE = (8, 512, 8)
WIDE_TILE_PROGRAMS_PER_SM = 4


def linear(x: torch.Tensor, weight: torch.Tensor | PackedLinear, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., in) · Wᵀ + b → (..., out), with a dense weight (out, in) or a packed one (its bias is its own)."""
    if isinstance(weight, PackedLinear):
        return weight(x)
    if use_triton(x, weight) and matvec_supports(x, weight, bias):
        return matvec_triton(x, weight, bias)
    product = tuned_product(x, weight, bias)
    if product is not None:
        return tuned_linear(x, weight, product)
    return F.linear(x, weight, bias)


def matvec_supports(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether the GEMV computes this product (any device: the caller checks for CUDA). It has no backward, so a
    product that autograd records stays with `F.linear`."""
    tracked = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))
    return (
        not tracked
        and x.numel() == x.shape[-1]  # one row, whatever the leading shape
        and x.dtype in MATVEC_DTYPES
        and weight.dtype == x.dtype
        and (bias is None or (bias.dtype == x.dtype and bias.is_contiguous()))
        and x.stride(-1) == 1
        and weight.stride(-1) == 1
        and weight.shape[1] == x.shape[-1]
    )


def matvec_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    from glimmer.model.kernels.jit import matvec as impl

    out_features, in_features = weight.shape
    out = torch.empty((*x.shape[:-1], out_features), dtype=x.dtype, device=x.device)
    block_n, block_k, warps = matvec_tile(out_features, multiprocessor_count(x.device.index or 0))
    block_k = min(block_k, next_power_of_2(in_features))
    impl.matvec[(-(-out_features // block_n),)](
        x, weight, bias if bias is not None else weight, out, out_features, in_features, weight.stride(0),
        HAS_BIAS=bias is not None, BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=in_features % block_k == 0,
        num_warps=warps, **launch_options(x),
    )
    return out


def matvec_tile(out_features: int, multiprocessors: int) -> tuple[int, int, int]:
    """The tile for a weight of `out_features` rows: the wide one unless it leaves a last wave under a quarter full.

    A function of the shape and the GPU only, so a weight is always summed in the same order."""
    programs = -(-out_features // WIDE_TILE[0])
    wave = WIDE_TILE_PROGRAMS_PER_SM * multiprocessors
    if programs > wave and programs % wave and programs % wave < wave // 4:
        return NARROW_TILE
    return WIDE_TILE
