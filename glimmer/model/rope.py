"""RoPE inverse frequencies and attention factor for each rope_type the reference reads (architecture.md §2.5).

Each formula is transformers 5.23's table at the model's construction (its ROPE_INIT_FUNCTIONS), computed in the
same float32 torch operations and order so the bits agree. The reference recomputes two types with the sequence
length: 'dynamic' only past max_position_embeddings, where Glimmer never runs (max_model_len is at most that), and
'longrope' past its original length, where `RopeScaling.exact_positions` stops Glimmer; so one table, independent of
the sequence, serves every step, cached or not.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from glimmer.checkpoint.config import RopeScaling
from glimmer.errors import ConfigError

_CPU = torch.device("cpu")  # explicit, so a model built under a meta-device context still gets real values


def _exponents(head_dim: int, count_to: int | None = None) -> torch.Tensor:
    """2j / head_dim for j = 0 … count_to/2 − 1 (count_to: head_dim unless given), in float32."""
    end = head_dim if count_to is None else count_to
    return torch.arange(0, end, 2, dtype=torch.int64, device=_CPU).float() / head_dim


def _default(theta: float, head_dim: int) -> torch.Tensor:
    return 1.0 / (theta ** _exponents(head_dim))


def _linear(scaling: RopeScaling, theta: float, head_dim: int, max_positions: int) -> tuple[torch.Tensor, float]:
    return _default(theta, head_dim) / scaling.factor, 1.0


def _dynamic(scaling: RopeScaling, theta: float, head_dim: int, max_positions: int) -> tuple[torch.Tensor, float]:
    # NTK-aware base for a sequence of max_position_embeddings, the longest Glimmer runs (the base factor is 1 there,
    # computed as the reference computes it, so its float rounding is the reference's too)
    length = max_positions
    base = theta * ((scaling.factor * length / max_positions) - (scaling.factor - 1)) ** (head_dim / (head_dim - 2))
    return _default(base, head_dim), 1.0


def _yarn(scaling: RopeScaling, theta: float, head_dim: int, max_positions: int) -> tuple[torch.Tensor, float]:
    original = scaling.original_length(max_positions)
    factor = scaling.factor if scaling.factor is not None else max_positions / original

    def mscale(scale: float, coefficient: float = 1) -> float:
        return 1.0 if scale <= 1 else 0.1 * coefficient * math.log(scale) + 1.0

    attention = scaling.attention_factor
    if attention is None:
        if scaling.mscale and scaling.mscale_all_dim:
            attention = float(mscale(factor, scaling.mscale) / mscale(factor, scaling.mscale_all_dim))
        else:
            attention = mscale(factor)
    fast, slow = scaling.beta_fast or 32, scaling.beta_slow or 1

    def dimension_of(rotations: float) -> float:  # the dimension that turns `rotations` times over `original`
        return (head_dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = dimension_of(fast), dimension_of(slow)
    if scaling.truncate is not False:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # as the reference, against a zero-width ramp
    ramp = torch.clamp((torch.arange(head_dim // 2, dtype=torch.float32, device=_CPU) - low) / (high - low), 0, 1)
    extrapolated_share = 1 - ramp
    position_frequencies = theta ** _exponents(head_dim)
    extrapolated = 1.0 / position_frequencies
    interpolated = 1.0 / (factor * position_frequencies)
    return interpolated * (1 - extrapolated_share) + extrapolated * extrapolated_share, attention


def _longrope(scaling: RopeScaling, theta: float, head_dim: int, max_positions: int) -> tuple[torch.Tensor, float]:
    original = scaling.original_length(max_positions)
    factor = scaling.factor if scaling.factor is not None else max_positions / original
    attention = scaling.attention_factor
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    # the short factors: Glimmer runs up to the original length only (RopeScaling.exact_positions)
    short = torch.tensor(scaling.short_factor, dtype=torch.float32, device=_CPU)
    return 1.0 / (short * theta ** _exponents(head_dim)), attention


def _llama3(scaling: RopeScaling, theta: float, head_dim: int, max_positions: int) -> tuple[torch.Tensor, float]:
    inv_freq = _default(theta, head_dim)
    factor, low, high = scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor
    original = scaling.original_length(max_positions)
    low_wavelength, high_wavelength = original / low, original / high
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > low_wavelength, inv_freq / factor, inv_freq)
    smooth = (original / wavelength - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelength < high_wavelength) * ~(wavelength > low_wavelength)
    return torch.where(medium, smoothed, scaled), 1.0


def _proportional(scaling: RopeScaling, theta: float, head_dim: int, max_positions: int
                  ) -> tuple[torch.Tensor, float]:
    proportion = scaling.partial_rotary_factor if scaling.partial_rotary_factor is not None else 1.0
    rotated_pairs = int(proportion * head_dim // 2)
    rotated = 1.0 / (theta ** _exponents(head_dim, count_to=2 * rotated_pairs))
    still = head_dim // 2 - rotated_pairs  # pairs of frequency 0: cos 1, sin 0, left as they are
    if still > 0:
        rotated = torch.cat((rotated, torch.zeros(still, dtype=torch.float32, device=_CPU)))
    factor = scaling.factor if scaling.factor is not None else 1.0
    return rotated / factor, 1.0


_TABLES: dict[str, Callable[[RopeScaling, float, int, int], tuple[torch.Tensor, float]]] = {
    "linear": _linear,
    "dynamic": _dynamic,
    "yarn": _yarn,
    "longrope": _longrope,
    "llama3": _llama3,
    "proportional": _proportional,
}


def rope_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None, max_positions: int
                     ) -> tuple[torch.Tensor, float]:
    """(inverse frequencies (head_dim/2,) float32 on the CPU, attention factor multiplying cos and sin).

    Raises ConfigError naming rope_parameters where the scaling's numbers give no finite table."""
    if scaling is None:
        return _default(theta, head_dim), 1.0
    inv_freq, attention = _TABLES[scaling.rope_type](scaling, theta, head_dim, max_positions)
    if not (bool(torch.isfinite(inv_freq).all()) and math.isfinite(attention)):
        raise ConfigError(f"text_config.rope_parameters (rope_type {scaling.rope_type!r}) give RoPE frequencies that "
                          "are not finite; check its factors")
    return inv_freq, float(attention)
