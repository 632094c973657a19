"""When a Triton kernel may run: CUDA tensors, Triton importable, and not switched off.

`GLIMMER_KERNELS=torch` makes every dispatcher take its plain-torch reference (for A/B timing and for
bisecting a numerical difference). Triton is imported lazily: CPU installs never need it.
"""

from __future__ import annotations

import functools
import os

import torch


@functools.cache
def triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def references_forced() -> bool:
    """GLIMMER_KERNELS=torch: every op runs its plain-torch reference (no Triton, no packed CPU weights)."""
    return os.environ.get("GLIMMER_KERNELS", "").lower() == "torch"


def use_triton(*tensors: torch.Tensor) -> bool:
    """Whether the Triton version of an op should run on these tensors."""
    if not all(t.is_cuda for t in tensors):  # first: the CPU's decode step calls this hundreds of times
        return False
    return not references_forced() and triton_importable()


@functools.cache
def multiprocessor_count(device_index: int) -> int:
    if not torch.cuda.is_available():
        return 132  # Triton's interpreter on the CPU (tests): size grids as for an H200
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())
