"""Triton JIT kernels, one file per op; imported only when a dispatcher in `glimmer.model.kernels` runs one."""
