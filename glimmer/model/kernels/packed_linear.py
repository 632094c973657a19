"""A projection whose weight is pre-packed for the CPU's matrix library: y = x · Wᵀ + b.

On the CPU, `F.linear` hands every call to a general matrix product that re-reads the weight in its
stored row order; at decode shapes (a handful of rows against a large weight) that streams the weight at
a third of the memory bandwidth. oneDNN, which ships inside PyTorch's x86 builds, can reorder a weight
once into its own blocked layout, after which a product reads it at close to the memory rate — 2–3× fewer
milliseconds per decode step on a small model (bench/cpu_decode.py). The reorder keeps one copy: the
packed one replaces the dense weight, so the model's memory does not grow.

`F.linear` is the reference. The packed product sums in another order, so results agree to fp32 (or
bf16) rounding, not bit for bit; `GLIMMER_KERNELS=torch` keeps the dense weights and the reference.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from glimmer.model.kernels.support import references_forced

PACKED_DTYPES = (torch.float32, torch.bfloat16)
BATCH_HINT = 64
"""Rows the packed layout is tuned for (oneDNN's hint; any row count works): decode batches are small."""


class PackedLinear:
    """One packed weight (out_features, in_features) and its bias, applied to rows of any leading shape."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        self.out_features, self.in_features = weight.shape
        self.dtype = weight.dtype
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), BATCH_HINT)
        self.bias = None if bias is None else bias.detach().clone()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def __repr__(self) -> str:
        return f"PackedLinear(in={self.in_features}, out={self.out_features}, {self.dtype})"


@functools.cache
def _packing_works(dtype: torch.dtype) -> bool:
    """oneDNN is in this build, takes this dtype, and its product agrees with F.linear on a random probe."""
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 64, generator=generator).to(dtype)
    bias = torch.randn(48, generator=generator).to(dtype)
    rows = torch.randn(3, 64, generator=generator).to(dtype)
    try:
        got = PackedLinear(weight, bias)(rows)
    except (RuntimeError, AttributeError, NotImplementedError):
        return False
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    return got.shape == (3, 48) and torch.allclose(got.float(), F.linear(rows, weight, bias).float(),
                                                   rtol=tolerance, atol=tolerance)


def packs(device: torch.device | str, dtype: torch.dtype) -> bool:
    """Whether weights on `device` in `dtype` are packed: the CPU, a packed dtype, oneDNN working, and
    GLIMMER_KERNELS not set to torch."""
    if references_forced():
        return False
    return torch.device(device).type == "cpu" and dtype in PACKED_DTYPES and _packing_works(dtype)


def can_pack(weight: torch.Tensor) -> bool:
    return packs(weight.device, weight.dtype)
