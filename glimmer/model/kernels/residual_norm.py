"""The sandwich step between sublayers: post-norm the sublayer output, add it to the residual, pre-norm.

    residual ← residual + norm_post(h)        (architecture.md §2.4)
    normed   ← norm_next(residual)

Every norm here is y = x̂ · (offset + w) with x̂ = x · rsqrt(mean(x²) + eps), in fp32, cast back once
(§2.1): offset 1 for the centered sandwich norms, 0 for the final plain-scale norm. The residual add runs
in the model dtype. Without `h` (the first layer) only `normed` is computed. The Triton kernel reads each
row once and writes it twice; the C kernel (float32 on the CPU, `kernels/cpu`) does the same in one call; the
reference is the modules' own arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from glimmer.model.kernels import cpu
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
    if cpu_supports(h, residual, post, following):
        return residual_norm_cpu(h, residual, post, following)
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


def cpu_supports(h: torch.Tensor | None, residual: torch.Tensor, post: NormSpec | None, following: NormSpec) -> bool:
    width = residual.shape[-1]
    return (
        residual.dim() == 2
        and residual.is_contiguous()
        and (h is None or (h.shape == residual.shape and h.is_contiguous()))
        and following.scale.numel() == width
        and (post is None or post.scale.numel() == width)
        and cpu.runs(residual, following.scale, *([] if h is None else [h, post.scale]))
    )


def residual_norm_cpu(
    h: torch.Tensor | None, residual: torch.Tensor, post: NormSpec | None, following: NormSpec, lib=None
) -> tuple[torch.Tensor, torch.Tensor]:
    lib = cpu.library() if lib is None else lib
    rows, width = residual.shape
    out_residual = residual if h is None else torch.empty_like(residual)
    normed = torch.empty_like(residual)
    lib.glimmer_residual_norm(cpu.pointer(h), residual.data_ptr(), None if post is None else post.scale.data_ptr(),
                              0.0 if post is None else post.eps, following.scale.data_ptr(), following.eps, rows,
                              width, out_residual.data_ptr(), normed.data_ptr(), cpu.threads())
    return out_residual, normed


def probe_cpu(lib) -> str | None:
    """The C kernel against the reference on random rows (cpu.library's load-time check)."""
    generator = torch.Generator().manual_seed(0)
    h, residual = torch.randn(3, 40, generator=generator), torch.randn(3, 40, generator=generator)
    post = NormSpec(torch.randn(40, generator=generator), 1e-6, 1.0)
    following = NormSpec(torch.randn(40, generator=generator), 1e-8, 0.0)
    for args in ((h, residual, post, following), (None, residual, None, following)):
        got, want = residual_norm_cpu(*args, lib=lib), residual_norm_torch(*args)
        if not all(torch.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(got, want, strict=True)):
            return "residual_norm"
    return None


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
