"""Quantized weights a checkpoint stores: those Glimmer dequantizes on load (their scheme and size on disk), and the
quantizers' tensors found in a safetensors directory whatever its config says, which the target's reader and the
drafter's refuse where no quantization_config describes them."""

from __future__ import annotations

from dataclasses import dataclass

from glimmer.checkpoint.safetensors_files import SafetensorsCheckpoint


@dataclass(frozen=True)
class QuantizedStorage:
    """A checkpoint's quantized weights as stored: their scheme ("NVFP4 W4A16", "GGUF Q4_K/Q6_K", "MLX affine
    4-bit") and their tensors' bytes on disk, which the host-memory refusal names beside the dequantized size."""

    scheme: str
    bytes_on_disk: int


# compressed-tensors' name for a quantized Linear's packed codes (`M.weight_packed`), in place of `M.weight`
WEIGHT_PACKED = "weight_packed"
# compressed-tensors' FP8 and INT8 weights: stored as `weight` in 8 bits beside a scale of one of these names
_8_BIT_DTYPES = ("F8_E4M3", "F8_E5M2", "I8")
_8_BIT_SCALES = ("weight_scale", "weight_scale_inv")

# the kinds of quantized weights find_quantized_weights tells apart
PACKED, GPTQ_OR_AWQ, EIGHT_BIT = "compressed-tensors packed", "GPTQ or AWQ packed", "8-bit"


@dataclass(frozen=True)
class QuantizedWeights:
    """A quantizer's tensors in place of Linear weights: the first of `kind` (sorted by name) and how many more."""
    kind: str  # PACKED (weight_packed), GPTQ_OR_AWQ (qweight) or EIGHT_BIT (weight in 8 bits)
    first: str
    more: int
    scale: str = ""  # EIGHT_BIT: the name of the scale beside `first` (weight_scale or weight_scale_inv)


def find_quantized_weights(files: SafetensorsCheckpoint) -> QuantizedWeights | None:
    """The quantized Linear weights among `files`' tensors, whatever their config says, or None: GPTQ's or AWQ's
    `qweight`s, FP8 or INT8 `weight`s beside their scale (compressed-tensors' float- and int-quantized formats keep
    the name `weight`; DeepSeek-style FP8 blocks name the scale `weight_scale_inv`), compressed-tensors'
    `weight_packed`s; the first kind found in that order."""
    qweights = sorted(name for name in files.tensors if name.endswith(".qweight"))
    if qweights:
        return QuantizedWeights(GPTQ_OR_AWQ, qweights[0], len(qweights) - 1)
    eight_bit = sorted((name, scale) for name, info in files.tensors.items()
                       if name.endswith(".weight") and info.dtype in _8_BIT_DTYPES
                       for scale in _8_BIT_SCALES if f"{name.removesuffix('.weight')}.{scale}" in files.tensors)
    if eight_bit:
        return QuantizedWeights(EIGHT_BIT, eight_bit[0][0], len(eight_bit) - 1, scale=eight_bit[0][1])
    packed = sorted(name for name in files.tensors if name.endswith(f".{WEIGHT_PACKED}"))
    if packed:
        return QuantizedWeights(PACKED, packed[0], len(packed) - 1)
    return None


def describe_quantized_weights(found: QuantizedWeights, files: SafetensorsCheckpoint) -> str:
    """The first of `found`, how many more and, for 8-bit weights, their dtype and scale: "x.weight and 13 more, of
    dtype F8_E4M3 beside their weight_scale"."""
    shown = found.first + (f" and {found.more} more" if found.more else "")
    if found.kind == EIGHT_BIT:
        shown += f", of dtype {files.tensors[found.first].dtype} beside their {found.scale}"
    return shown
