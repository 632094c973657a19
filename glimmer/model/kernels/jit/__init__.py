"""Triton JIT kernels, one file per op; imported only when a dispatcher in `glimmer.model.kernels` runs one."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def wait_for_previous_kernel(PDL: tl.constexpr):
    """First statement of every kernel: under programmatic dependent launch (`support.dependent_launch`), wait
    until the kernel before it has finished and its writes are visible, then let the next kernel be scheduled
    (it waits the same way, so nothing it touches overlaps this one's work). Without PDL: nothing."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
