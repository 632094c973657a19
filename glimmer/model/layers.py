"""Building blocks of the Muse Glimmer text decoder: its three RMSNorm kinds, rotary tables, the MLP.

Each formula follows architecture.md §2 to the dtype: where the reference computes in fp32 and casts
back, so do we, in the same order, because bf16 parity depends on where the rounding happens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from glimmer.checkpoint.config import RopeScaling
from glimmer.model.kernels.linear import linear
from glimmer.model.kernels.packed_linear import PackedLinear, can_pack
from glimmer.model.kernels.residual_norm import NormSpec
from glimmer.model.kernels.silu_mul import silu_mul
from glimmer.model.rope import rope_frequencies


def weightless_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """y = x · (mean(x²) + eps)^(−1/2), in fp32, cast back — the embed, QK and perception norms (§2.1.1).

    The reference uses `pow(·, −0.5)` rather than `rsqrt`; we keep it for bit-parity.
    """
    h = x if x.dtype == torch.float32 else x.float()  # (a no-op cast is still a dispatched op on the CPU)
    h = h * torch.pow(h.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    return h if x.dtype == torch.float32 else h.to(x.dtype)


class ScaledRMSNorm(nn.Module):
    """Plain-scale RMSNorm, y = x̂ · w: the final norm only (§2.1.2). No 1+w here — pitfall §14.1."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.pow(h.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)
        return (h * self.weight.float()).to(x.dtype)

    @property
    def spec(self) -> NormSpec:
        return NormSpec(self.weight, self.eps, offset=0.0)


class CenteredRMSNorm(nn.Module):
    """Gemma-style y = x̂ · (1 + w), multiplied in fp32 before the downcast: the four sandwich norms (§2.1.3)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).to(x.dtype)

    @property
    def spec(self) -> NormSpec:
        return NormSpec(self.weight, self.eps, offset=1.0)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"


class NormedEmbedding(nn.Embedding):
    """Token embedding followed by a weightless RMSNorm, with no √H scale (§2.2).

    The norm is not folded into the table because the DFlash drafter needs the raw rows (§11);
    `raw()` returns them.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, eps: float):
        super().__init__(num_embeddings, embedding_dim)
        self.eps = eps

    def raw(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return weightless_rms_norm(self.raw(input_ids), self.eps)


class RotaryTable(nn.Module):
    """RoPE tables in the rotate-half layout used by HF-layout weights (§2.5.4): the default type, or a scaled one
    (`glimmer.model.rope`), whose attention factor multiplies cos and sin.

    One table from the global theta serves every RoPE layer; per-layer thetas only mark NoPE layers.
    cos/sin are computed in fp32 and cast to the activation dtype before use, as the reference does.
    The inverse frequencies are computed on the CPU at construction (like the reference's, so every device gets the
    same bits) and kept as a plain tensor, not a buffer, so a model materialized from the meta device needs no
    buffer initialization.
    """

    def __init__(self, head_dim: int, theta: float, scaling: RopeScaling | None = None,
                 max_position_embeddings: int | None = None):
        super().__init__()
        if scaling is not None and max_position_embeddings is None:
            raise ValueError("a scaled RoPE table needs max_position_embeddings")
        cpu_inv_freq, self.attention_scaling = rope_frequencies(head_dim, theta, scaling, max_position_embeddings or 0)
        self._inv_freq: dict[torch.device, torch.Tensor] = {torch.device("cpu"): cpu_inv_freq}

    def inv_freq(self, device: torch.device) -> torch.Tensor:
        if device not in self._inv_freq:
            self._inv_freq[device] = self._inv_freq[torch.device("cpu")].to(device)
        return self._inv_freq[device]

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq(positions.device)[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        cos, sin = angles.cos(), angles.sin()
        if self.attention_scaling != 1.0:  # yarn's and longrope's factor, in fp32 before the cast (§2.5.4)
            cos, sin = cos * self.attention_scaling, sin * self.attention_scaling
        return cos.to(dtype), sin.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (tokens, heads, head_dim); cos/sin: (tokens, head_dim). Pairs (j, j + d/2)."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


def fuse_linears(*linears: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) for linears that share an input, so they run as one GEMM.

    Each linear's parameters become views of the fused tensors: state_dict names and values are unchanged
    and no memory is duplicated. A linear without a bias contributes zeros when another has one.
    """
    weight = torch.cat([m.weight.detach() for m in linears])
    bias = None
    if any(m.bias is not None for m in linears):
        bias = torch.cat([m.bias.detach() if m.bias is not None else weight.new_zeros(m.out_features)
                          for m in linears])
    offset = 0
    for m in linears:
        rows = slice(offset, offset + m.out_features)
        m.weight = nn.Parameter(weight[rows], requires_grad=False)
        if m.bias is not None:
            m.bias = nn.Parameter(bias[rows], requires_grad=False)
        offset += m.out_features
    return weight, bias


def release_packed(*linears: nn.Linear) -> None:
    """Drop dense weights that now live on only as packed copies, so the model's memory does not double.

    Shapes stay (on the meta device) for `repr` and shape checks; the modules' own forward can no longer run.
    """
    for m in linears:
        m.weight = nn.Parameter(torch.empty(m.weight.shape, dtype=m.weight.dtype, device="meta"), requires_grad=False)
        if m.bias is not None:
            m.bias = nn.Parameter(torch.empty(m.bias.shape, dtype=m.bias.dtype, device="meta"), requires_grad=False)


class GatedMLP(nn.Module):
    """down_proj(silu(gate_proj(x)) · up_proj(x)), no biases (§2.4)."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.gate_up_weight: torch.Tensor | PackedLinear | None = None
        self.down_packed: PackedLinear | None = None

    def fuse_projections(self) -> None:
        """gate_proj and up_proj as one GEMM (the weights stay the modules' tensors, as views)."""
        if self.gate_up_weight is None:
            self.gate_up_weight, _ = fuse_linears(self.gate_proj, self.up_proj)

    def pack_projections(self) -> None:
        """After `fuse_projections`, on the CPU: both products read weights packed for oneDNN, which replace the
        dense ones (only the fused forward runs after this)."""
        if isinstance(self.gate_up_weight, torch.Tensor) and can_pack(self.gate_up_weight):
            self.gate_up_weight = PackedLinear(self.gate_up_weight, None)
            self.down_packed = PackedLinear(self.down_proj.weight, None)
            release_packed(self.gate_proj, self.up_proj, self.down_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_weight is not None:  # rows of any leading shape, as one matrix for the fused kernel
            rows = x.reshape(-1, x.shape[-1])
            down = self.down_packed if self.down_packed is not None else self.down_proj.weight
            return linear(silu_mul(linear(rows, self.gate_up_weight)), down).view(*x.shape[:-1], -1)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
