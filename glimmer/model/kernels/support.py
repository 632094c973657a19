"""When a Triton kernel may run: CUDA tensors, Triton importable, and not switched off.

`GLIMMER_KERNELS=torch` makes every dispatcher take its plain-torch reference (for A/B timing and for
bisecting a numerical difference). Triton is imported lazily: CPU installs never need it.

On Hopper and newer GPUs the kernels are launched as programmatic dependent launches: a kernel may be
scheduled while the one before it drains, and waits (`griddepcontrol.wait`) for that one's completion and
memory before it reads or writes anything, so only the launch latency overlaps, never the work. A decode step
at batch 1 is some 600 kernels of a few microseconds each, and the gap between two of them is a large part
of theirs. `GLIMMER_PDL=0` launches them plainly (for A/B timing).
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


@functools.cache
def dependent_launch(device_index: int) -> bool:
    """Whether kernels on this GPU launch as programmatic dependent launches (see the module's docstring)."""
    if os.environ.get("GLIMMER_PDL", "1") == "0" or not torch.cuda.is_available():
        return False
    if torch.cuda.get_device_capability(device_index)[0] < 9:
        return False
    try:
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: F401
    except ImportError:  # a Triton without grid dependency control
        return False
    return True


def launch_options(tensor: torch.Tensor) -> dict[str, bool]:
    """The keyword arguments every kernel launch passes: the kernel's PDL switch and Triton's launch flag."""
    pdl = dependent_launch(tensor.device.index or 0)
    return {"PDL": pdl, "launch_pdl": pdl}
