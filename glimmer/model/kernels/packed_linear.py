"""A projection whose weight is pre-packed for the CPU's matrix library: y = x · Wᵀ + b.

oneDNN, which ships inside PyTorch's x86 builds, can reorder a weight once into its own blocked layout for its
matrix products. Whether that beats `F.linear` on the dense weight depends on the machine and the row count: on
some CPUs the dense product streams a decode step's weights at a third of the memory rate and the packed one at
close to it (2–3× fewer milliseconds per decode step), on others (a 2-vCPU Intel Xeon) the dense product is
1.3–1.5× faster at 1–8 rows and the packed one at 16 or more. So the engine times both on the model's own weights
at load (`packing_pays`) and packs only where it pays (`engine.model_loader.prepare_for_cpu`). The reorder keeps
one copy: the packed one replaces the dense weight, so the model's memory does not grow.

`F.linear` is the reference. The packed product sums in another order, so results agree to fp32 (or
bf16) rounding, not bit for bit; `GLIMMER_KERNELS=torch` keeps the dense weights and the reference.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence

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


PROBE_BYTES = 256 << 20
"""Weights the probe streams at most: more than a CPU's caches hold, so it times memory-bound products as a decode
step runs them, and a fraction of a second even for a large model."""


PACKING_MARGIN = 0.9
"""Packing must be this much faster (its time at most 0.9 of the dense one's): where the two are within timing noise
the dense weights stay, so that restarts on a busy machine do not flip between them (results would move by float32
rounding from one start to the next)."""


def probe_weights(weights: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The weights a load-time timing streams: the first ones, up to PROBE_BYTES."""
    chosen, total = [], 0
    for weight in weights:
        if total >= PROBE_BYTES:
            break
        chosen.append(weight.detach())
        total += weight.numel() * weight.element_size()
    return chosen


def fastest_seconds(ways: dict[str, Callable[[], object]], repeats: int = 5) -> dict[str, float]:
    """The load-time timings' measure: seconds of each way's call, the fastest of `repeats` calls interleaved among
    the ways, after one untimed call each (first touch of weights and caches, primitive creation)."""
    for way in ways.values():
        way()
    best = dict.fromkeys(ways, float("inf"))
    for _ in range(repeats):
        for name, way in ways.items():
            start = time.perf_counter()
            way()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def packing_pays(weights: Sequence[torch.Tensor], rows: Sequence[int], repeats: int = 5) -> bool:
    """Whether products with these weights packed for oneDNN take clearly less time than `F.linear` on them
    (PACKING_MARGIN), summed over one product of each row count in `rows`, over `probe_weights`."""
    chosen = probe_weights(weights)
    if not chosen:
        return False
    packed = [PackedLinear(w, None) for w in chosen]
    inputs = {n: [torch.randn(n, w.shape[1]).to(w.dtype) for w in chosen] for n in rows}
    seconds = fastest_seconds({
        "dense": lambda: [F.linear(x, w) for n in rows for x, w in zip(inputs[n], chosen, strict=True)],
        "packed": lambda: [p(x) for n in rows for x, p in zip(inputs[n], packed, strict=True)],
    }, repeats)
    return seconds["packed"] < PACKING_MARGIN * seconds["dense"]
