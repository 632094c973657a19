"""Quantized weights a checkpoint stores, which Glimmer dequantizes on load."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class QuantizedStorage:
    """A checkpoint's quantized weights as stored: their scheme ("NVFP4 W4A16", "GGUF Q4_K/Q6_K", "MLX affine
    4-bit") and their tensors' bytes on disk, which the host-memory refusal names beside the dequantized size."""

    scheme: str
    bytes_on_disk: int
