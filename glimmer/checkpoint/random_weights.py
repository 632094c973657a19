"""Random weights at a sane scale: the tiny test checkpoints and `load_format="dummy"` draw them alike.

Every tensor is random, norms included (architecture.md §12.2: all-ones norms hide norm bugs). Matrices
are N(0, 1/fan_in) so activations stay O(1) through any depth, embedding rows N(0, 1) (the embedding
norm rescales them), biases small; a norm weight is its neutral value (1 for plain-scale norms, 0 for
the centered 1+w norms) plus N(0, 0.3²) noise. A 52-layer model so drawn runs finite in bf16.
"""

from __future__ import annotations

import math

import torch
from torch import nn

_PLAIN_SCALE_NORMS = ("language_model.norm.weight", "ln_pre.weight", "ln_post.weight", "norm1.weight",
                      "norm2.weight")


def _is_embedding(name: str) -> bool:
    return name.endswith("embedding_table.weight") or "embed_tokens" in name


def fill_random_(
    tensor: torch.Tensor, name: str, generator: torch.Generator, *, norm_neutral: float | None = None
) -> torch.Tensor:
    """Overwrite `tensor` (the canonical parameter `name`) in place with random values; returns it.

    norm_neutral overrides the neutral value of 1-D norm weights (a DFlash drafter's norms are all plain)."""
    tensor.normal_(generator=generator)
    if _is_embedding(name):
        return tensor
    if tensor.dim() == 2:
        return tensor.div_(math.sqrt(tensor.shape[1]))
    if name.endswith(".bias"):
        return tensor.mul_(0.1)
    if norm_neutral is None:
        norm_neutral = 1.0 if name.endswith(_PLAIN_SCALE_NORMS) else 0.0
    return tensor.mul_(0.3).add_(norm_neutral)


@torch.no_grad()
def randomize_parameters_(model: nn.Module, seed: int = 0, *, norm_neutral: float | None = None) -> None:
    """Fill every parameter and buffer of `model` where it lives (on the GPU: in seconds, at any size);
    `norm_neutral` as for `fill_random_`."""
    tensors = model.state_dict(keep_vars=True)
    if not tensors:
        return
    device = next(iter(tensors.values())).device
    generator = torch.Generator(device).manual_seed(seed)
    for name, tensor in tensors.items():
        fill_random_(tensor.data, name, generator, norm_neutral=norm_neutral)
