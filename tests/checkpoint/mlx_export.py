"""Test support: package a tiny safetensors checkpoint as a version-1 MLX artifact with `mlx` itself
(`mx.quantize`, `mx.save_safetensors`), following the packing glimmer/checkpoint/mlx.py documents: vendor
names, +1 folded into the four per-layer norms, the gate fused into q_proj per head, MLX affine quantization.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import torch

from glimmer.checkpoint.config_layouts import config_to_dict, load_config
from glimmer.checkpoint.weight_layouts import rotate_half_to_interleaved

NORMS = {"input_layernorm": "input_layernorm", "post_attention_layernorm": "post_attn_norm",
         "pre_feedforward_layernorm": "post_attention_layernorm", "post_feedforward_layernorm": "post_ffn_norm"}
SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
              "chat_template.jinja")


def mlx_tensors(state: dict[str, torch.Tensor], checkpoint: Path, interleaved: bool) -> dict[str, np.ndarray]:
    text = load_config(checkpoint).text
    heads, kv_heads, d = text.num_attention_heads, text.num_key_value_heads, text.head_dim
    out = {"model.embed_tokens.weight": state["model.language_model.embed_tokens.weight"],
           "model.norm.weight": state["model.language_model.norm.weight"], "lm_head.weight": state["lm_head.weight"]}
    for i in range(text.num_hidden_layers):
        src, dst = f"model.language_model.layers.{i}.", f"model.layers.{i}."
        q, k = state[src + "self_attn.q_proj.weight"], state[src + "self_attn.k_proj.weight"]
        if interleaved:
            q, k = rotate_half_to_interleaved(q, heads), rotate_half_to_interleaved(k, kv_heads)
        gate = state[src + "self_attn.gate_proj.weight"]
        out[dst + "self_attn.q_proj.weight"] = torch.stack(
            [q.reshape(heads, d, -1), gate.reshape(heads, d, -1)], dim=1).reshape(2 * heads * d, -1)
        out[dst + "self_attn.k_proj.weight"] = k
        for name in ("v_proj", "o_proj"):
            out[dst + f"self_attn.{name}.weight"] = state[src + f"self_attn.{name}.weight"]
        for name in ("gate_proj", "up_proj", "down_proj"):
            out[dst + f"mlp.{name}.weight"] = state[src + f"mlp.{name}.weight"]
        for canonical, stored in NORMS.items():
            out[dst + f"{stored}.weight"] = state[src + f"{canonical}.weight"] + 1.0
    return {name: tensor.numpy() for name, tensor in out.items()}


def export_mlx_artifact(checkpoint: Path, out: Path, state: dict[str, torch.Tensor], *, bits: int | None = None,
                        group_size: int = 32, interleaved: bool = False, version: int = 1) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, mx.array] = {}
    for name, array in mlx_tensors(state, checkpoint, interleaved).items():
        if bits is not None and array.ndim == 2:
            weight, scales, biases = mx.quantize(mx.array(array), group_size=group_size, bits=bits)
            module = name.removesuffix(".weight")
            arrays |= {f"{module}.weight": weight, f"{module}.scales": scales, f"{module}.biases": biases}
        else:
            arrays[name] = mx.array(array)
    mx.save_safetensors(str(out / "model.safetensors"), arrays)
    config = config_to_dict(load_config(checkpoint), "vendor") | {
        "muse_glimmer_mlx_format": version, "rope_is_neox_style": not interleaved}
    if bits is not None:
        config["quantization"] = {"group_size": group_size, "bits": bits}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for name in SIDE_FILES:
        shutil.copy(checkpoint / name, out / name)
    return out
