"""What each quantizer writes in place of a Linear's `weight`, and a checkpoint's Linears rewritten so: the weights
of the refusals of quantized checkpoints and drafters whose config.json does not say so."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def quantized_tensors(module: str, weight: torch.Tensor, scheme: str) -> dict[str, torch.Tensor]:
    """What `scheme`'s quantizer writes in place of `module.weight`:
    - "nvfp4": compressed-tensors NVFP4 (weight_packed, its weight_scale and weight_global_scale);
    - "gptq", "awq": AutoGPTQ's or AutoAWQ's qweight (int32, eight 4-bit codes a word), qzeros and scales (GPTQ adds
      g_idx); "gptq-symmetric": a GPTQ export without qzeros, the zero point implied;
    - "int4": compressed-tensors pack-quantized W4A16, eight codes an int32 word, a bf16 scale per 32 inputs and the
      weight's shape; "mxfp4": two E2M1 codes a byte as NVFP4, a U8 exponent per 32 inputs, no global scale;
    - "fp8", "int8": the weight in 8 bits beside a weight_scale; "fp8-block": DeepSeek-style FP8 blocks, beside a
      weight_scale_inv."""
    rows, columns = weight.shape
    if scheme == "nvfp4":
        from glimmer.checkpoint.compressed_tensors import quantize_nvfp4

        return dict(zip((f"{module}.weight_packed", f"{module}.weight_scale", f"{module}.weight_global_scale"),
                        quantize_nvfp4(weight), strict=True))
    if scheme in ("gptq", "awq", "gptq-symmetric"):
        packed = {f"{module}.qweight": torch.zeros(columns // 8, rows, dtype=torch.int32)}
        if scheme != "gptq-symmetric":
            packed[f"{module}.qzeros"] = torch.zeros(1, rows // 8, dtype=torch.int32)
        packed[f"{module}.scales"] = torch.ones(1, rows, dtype=torch.float16)
        if scheme == "gptq":
            packed[f"{module}.g_idx"] = torch.zeros(columns, dtype=torch.int32)
        return packed
    if scheme == "int4":
        return {f"{module}.weight_packed": torch.zeros(rows, columns // 8, dtype=torch.int32),
                f"{module}.weight_scale": torch.ones(rows, columns // 32, dtype=torch.bfloat16),
                f"{module}.weight_shape": torch.tensor([rows, columns])}
    if scheme == "mxfp4":
        return {f"{module}.weight_packed": torch.zeros(rows, columns // 2, dtype=torch.uint8),
                f"{module}.weight_scale": torch.full((rows, columns // 32), 127, dtype=torch.uint8)}
    dtype = torch.int8 if scheme == "int8" else torch.float8_e4m3fn
    scale = "weight_scale_inv" if scheme == "fp8-block" else "weight_scale"
    return {f"{module}.weight": weight.clamp(-1, 1).to(dtype),
            f"{module}.{scale}": torch.ones(rows, 1, dtype=torch.float32)}


def quantize_linears(weights: Path, is_linear: Callable[[str], bool], scheme: str) -> None:
    """Rewrite the safetensors file `weights`, each weight `is_linear` names as `scheme`'s quantizer writes it."""
    quantized = {}
    for name, tensor in load_file(str(weights)).items():
        if is_linear(name):
            quantized |= quantized_tensors(name.removesuffix(".weight"), tensor, scheme)
        else:
            quantized[name] = tensor
    save_file(quantized, str(weights))
