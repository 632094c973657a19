"""The sandwich step between sublayers: post-norm the sublayer output, add it to the residual, pre-norm.

    residual ← residual + norm_post(h)        (architecture.md §2.4)
    normed   ← norm_next(residual)

Every norm here is y = x̂ · (offset + w) with x̂ = x · rsqrt(mean(x²) + eps), in fp32, cast back once
(§2.1): offset 1 for the centered sandwich norms, 0 for the final plain-scale norm. The residual add runs
in the model dtype. Without `h` (the first layer) only `normed` is computed. The Triton kernel reads each
row once and writes it twice; the reference is the modules' own arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from glimmer.model.kernels.support import launch_options, next_power_of_2, use_triton

MAX_TRITON_WIDTH = 32768


@dataclass(frozen=True)
class NormSpec:
    weight: torch.Tensor
    eps: float
    offset: float  # 1.0 for (1 + w) norms, 0.0 for plain-scale ones
    # offset + w in fp32, formed once (the reference forms it on every call, with the same bits)
    scale: torch.Tensor = field(init=False, compare=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "scale", self.offset + self.weight.float())


def residual_norm(
    h: torch.Tensor | None, residual: torch.Tensor, post: NormSpec | None, following: NormSpec
) -> tuple[torch.Tensor, torch.Tensor]:
    """(new residual, following-normed new residual); h and post are None for the first layer's input."""
    if use_triton(residual) and residual.shape[-1] <= MAX_TRITON_WIDTH and residual.is_contiguous():
        return residual_norm_triton(h, residual, post, following)
    return residual_norm_torch(h, residual, post, following)


def rms_norm_torch(x: torch.Tensor, spec: NormSpec) -> torch.Tensor:
    # the modules' arithmetic op for op (in place where that changes no bit): few ops for the CPU's small rows
    y = x if x.dtype == torch.float32 else x.float()
    y = (y * y.pow(2).mean(-1, keepdim=True).add_(spec.eps).rsqrt_()).mul_(spec.scale)
    return y if x.dtype == torch.float32 else y.to(x.dtype)


def residual_norm_torch(
    h: torch.Tensor | None, residual: torch.Tensor, post: NormSpec | None, following: NormSpec
) -> tuple[torch.Tensor, torch.Tensor]:
    if h is not None:
        residual = rms_norm_torch(h, post).add_(residual)
    return residual, rms_norm_torch(residual, following)


def residual_norm_triton(
    h: torch.Tensor | None, residual: torch.Tensor, post: NormSpec | None, following: NormSpec
) -> tuple[torch.Tensor, torch.Tensor]:
    from glimmer.model.kernels.jit import residual_norm as impl

    rows, width = residual.shape
    normed = torch.empty_like(residual)
    new_residual = torch.empty_like(residual) if h is not None else residual
    if rows == 0:
        return new_residual, normed
    block = next_power_of_2(width)
    first = post if post is not None else following
    impl.residual_norm[(rows,)](
        h if h is not None else residual, residual, first.weight, following.weight, new_residual, normed,
        width, first.eps, first.offset, following.eps, following.offset,
        HAS_H=h is not None, BLOCK=block, num_warps=min(16, max(1, block // 512)), **launch_options(residual),
    )
    return new_residual, normed
