"""Device kernels, one op per file, each beside the plain-torch function it must agree with.

Each public function here dispatches: the Triton kernel on CUDA tensors and shapes it supports, the torch
reference otherwise. The model calls these and never knows which implementation ran.
"""

from glimmer.model.kernels.paged_attention import paged_attention
from glimmer.model.kernels.qk_norm_rope import qk_norm_rope_store
from glimmer.model.kernels.residual_norm import residual_norm
from glimmer.model.kernels.silu_mul import silu_mul

__all__ = ["paged_attention", "qk_norm_rope_store", "residual_norm", "silu_mul"]
