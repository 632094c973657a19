"""Where each canonical parameter comes from, for every weight layout Glimmer reads.

A layout is a table of rules, data rather than code: a rule maps a canonical parameter name (the names
of `glimmer.model`, identical to the canonical HF export) to the source tensor that holds it, and says
how to cut it out of a fused tensor and whether its rows must be permuted from the interleaved RoPE
layout. The RoPE layout is a property of the weight layout (architecture.md §5.4, §14.6): the native
vendor export is interleaved and is permuted on load; both HF exports are already rotate-half. Nothing
is ever guessed per tensor.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from glimmer.checkpoint.config import DrafterConfig, ModelConfig
from glimmer.errors import CheckpointError

CANONICAL = "canonical"
LEGACY = "legacy"
NATIVE = "native"
WEIGHT_LAYOUTS = (CANONICAL, LEGACY, NATIVE)
# the DFlash drafter's two layouts (architecture.md §10.2)
DRAFTER_CANONICAL = "drafter"
DRAFTER_NATIVE = "drafter-native"

ROPE_LAYOUT = {CANONICAL: "rotate-half", LEGACY: "rotate-half", NATIVE: "interleaved (permuted to rotate-half on load)"}
# the `rope_is_neox_style` value a config beside each layout's weights may carry (true = rotate-half)
ROPE_IS_NEOX_STYLE = {CANONICAL: True, LEGACY: True, NATIVE: False}


@dataclass(frozen=True)
class Rule:
    """canonical name pattern → source name template (`\\1`… refer to the pattern's groups).

    fused: the parts stacked along dim 0 in the source, as the config fields giving their row counts,
        and the position of this parameter's part among them.
    rope_heads: if set, the rows are per-head interleaved RoPE pairs to permute to rotate-half; the value
        names the config field giving the number of heads (or is the number itself).
    """

    target: str
    source: str
    fused: tuple[tuple[str, ...], int] | None = None
    rope_heads: str | int | None = None


_LM = r"model\.language_model\."
_VT = r"model\.vision_tower\."

_LEGACY_RULES = (
    Rule(_LM + r"embed_tokens\.weight", "model.embed_tokens.weight"),
    Rule(_LM + r"norm\.weight", "model.norm.weight"),
    Rule(r"lm_head\.weight", "lm_head.weight"),
    Rule(
        _LM + r"layers\.(\d+)\.self_attn\.(q|k|v|o|gate)_proj\.(weight|bias)",
        r"model.layers.\1.self_attn.\2_proj.\3",
    ),
    Rule(_LM + r"layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight", r"model.layers.\1.mlp.\2_proj.weight"),
    # the legacy export names its sandwich norms differently: post_attn_norm is the true post-attention
    # norm and its post_attention_layernorm is really the PRE-feedforward norm (§15.2)
    Rule(_LM + r"layers\.(\d+)\.input_layernorm\.weight", r"model.layers.\1.input_layernorm.weight"),
    Rule(_LM + r"layers\.(\d+)\.post_attention_layernorm\.weight", r"model.layers.\1.post_attn_norm.weight"),
    Rule(_LM + r"layers\.(\d+)\.pre_feedforward_layernorm\.weight", r"model.layers.\1.post_attention_layernorm.weight"),
    Rule(_LM + r"layers\.(\d+)\.post_feedforward_layernorm\.weight", r"model.layers.\1.post_ffn_norm.weight"),
    # the legacy export is text-only; a vision path, if present, keeps its canonical names
    Rule(r"(model\.vision_.*)", r"\1"),
)

# native fused projections: qkv_proj stacks [q, k, v, gate]; fc1 stacks [gate, up] (§5.2)
_QKVG = ("q_size", "kv_size", "kv_size", "q_size")
_GATE_UP = ("intermediate_size", "intermediate_size")
_NATIVE_RULES = (
    Rule(_LM + r"embed_tokens\.weight", "tok_embeddings.weight"),
    Rule(_LM + r"norm\.weight", "output.norm.weight"),
    Rule(r"lm_head\.weight", "output.weight"),
    Rule(r"model\.vision_projection\.weight", "vision_projection.weight"),
    Rule(_LM + r"layers\.(\d+)\.self_attn\.q_proj\.weight", r"layers.\1.attention.qkv_proj.weight",
         fused=(_QKVG, 0), rope_heads="num_attention_heads"),
    Rule(_LM + r"layers\.(\d+)\.self_attn\.k_proj\.weight", r"layers.\1.attention.qkv_proj.weight",
         fused=(_QKVG, 1), rope_heads="num_key_value_heads"),
    Rule(_LM + r"layers\.(\d+)\.self_attn\.v_proj\.weight", r"layers.\1.attention.qkv_proj.weight", fused=(_QKVG, 2)),
    Rule(_LM + r"layers\.(\d+)\.self_attn\.gate_proj\.weight", r"layers.\1.attention.qkv_proj.weight",
         fused=(_QKVG, 3)),
    Rule(_LM + r"layers\.(\d+)\.self_attn\.o_proj\.weight", r"layers.\1.attention.o_proj.weight"),
    Rule(_LM + r"layers\.(\d+)\.input_layernorm\.weight", r"layers.\1.attention.qkv_proj.norm.weight"),
    Rule(_LM + r"layers\.(\d+)\.post_attention_layernorm\.weight", r"layers.\1.post_attn_norm.weight"),
    Rule(_LM + r"layers\.(\d+)\.pre_feedforward_layernorm\.weight", r"layers.\1.feed_forward.norm.weight"),
    Rule(_LM + r"layers\.(\d+)\.post_feedforward_layernorm\.weight", r"layers.\1.post_ffn_norm.weight"),
    Rule(_LM + r"layers\.(\d+)\.mlp\.gate_proj\.weight", r"layers.\1.feed_forward.fc1_weight",
         fused=(_GATE_UP, 0)),
    Rule(_LM + r"layers\.(\d+)\.mlp\.up_proj\.weight", r"layers.\1.feed_forward.fc1_weight", fused=(_GATE_UP, 1)),
    Rule(_LM + r"layers\.(\d+)\.mlp\.down_proj\.weight", r"layers.\1.feed_forward.fc2_weight"),
    Rule(_VT + r"patch_embedder\.position_embedding_table\.weight", "vision_encoder.positional_embedding_vlm"),
    Rule(_VT + r"patch_embedder\.patch_embedding\.weight", "vision_encoder.conv1_linear.weight"),
    Rule(_VT + r"(ln_pre|ln_post)\.(weight|bias)", r"vision_encoder.\1.\2"),
    Rule(_VT + r"layers\.(\d+)\.attn\.q_proj\.(weight|bias)", r"vision_encoder.transformer.resblocks.\1.attn.wq.\2",
         rope_heads="vision.num_attention_heads"),
    Rule(_VT + r"layers\.(\d+)\.attn\.k_proj\.(weight|bias)", r"vision_encoder.transformer.resblocks.\1.attn.wk.\2",
         rope_heads="vision.num_attention_heads"),
    Rule(_VT + r"layers\.(\d+)\.attn\.v_proj\.(weight|bias)", r"vision_encoder.transformer.resblocks.\1.attn.wv.\2"),
    Rule(_VT + r"layers\.(\d+)\.attn\.proj\.(weight|bias)", r"vision_encoder.transformer.resblocks.\1.attn.wo.\2"),
    Rule(_VT + r"layers\.(\d+)\.norm1\.(weight|bias)", r"vision_encoder.transformer.resblocks.\1.ln_1.\2"),
    Rule(_VT + r"layers\.(\d+)\.norm2\.(weight|bias)", r"vision_encoder.transformer.resblocks.\1.ln_2.\2"),
    Rule(_VT + r"layers\.(\d+)\.mlp\.fc1\.(weight|bias)", r"vision_encoder.transformer.resblocks.\1.mlp.c_fc.\2"),
    Rule(_VT + r"layers\.(\d+)\.mlp\.fc2\.(weight|bias)", r"vision_encoder.transformer.resblocks.\1.mlp.c_proj.\2"),
    Rule(r"model\.vision_adapter\.fc1\.weight", "vision_adapter.c_fc.weight"),
    Rule(r"model\.vision_adapter\.fc2\.weight", "vision_adapter.c_proj.weight"),
)

# the vendor drafter file (§10.2): wqkv stacks [q, k, v], fc1 stacks [gate, up]; q/k rows and the q/k norm
# weights (one "head" spanning head_dim) are in the interleaved RoPE layout
_DRAFTER_QKV = ("q_size", "kv_size", "kv_size")
_DRAFTER_LAYER = r"layers\.(\d+)\."
_DRAFTER_NATIVE_RULES = (
    Rule(_DRAFTER_LAYER + r"self_attn\.q_proj\.weight", r"layers.\1.attention.wqkv.weight",
         fused=(_DRAFTER_QKV, 0), rope_heads="num_attention_heads"),
    Rule(_DRAFTER_LAYER + r"self_attn\.k_proj\.weight", r"layers.\1.attention.wqkv.weight",
         fused=(_DRAFTER_QKV, 1), rope_heads="num_key_value_heads"),
    Rule(_DRAFTER_LAYER + r"self_attn\.v_proj\.weight", r"layers.\1.attention.wqkv.weight", fused=(_DRAFTER_QKV, 2)),
    Rule(_DRAFTER_LAYER + r"self_attn\.(q|k)_norm\.weight", r"layers.\1.attention.\2_norm.weight", rope_heads=1),
    Rule(_DRAFTER_LAYER + r"self_attn\.o_proj\.weight", r"layers.\1.attention.wo.weight"),
    Rule(_DRAFTER_LAYER + r"mlp\.gate_proj\.weight", r"layers.\1.feed_forward.mlp.fc1_weight", fused=(_GATE_UP, 0)),
    Rule(_DRAFTER_LAYER + r"mlp\.up_proj\.weight", r"layers.\1.feed_forward.mlp.fc1_weight", fused=(_GATE_UP, 1)),
    Rule(_DRAFTER_LAYER + r"mlp\.down_proj\.weight", r"layers.\1.feed_forward.mlp.fc2_weight"),
    Rule(_DRAFTER_LAYER + r"input_layernorm\.weight", r"layers.\1.attention.input_layernorm.weight"),
    Rule(_DRAFTER_LAYER + r"post_attention_layernorm\.weight", r"layers.\1.feed_forward.mlp.layer_norm_weight"),
    Rule(r"encoder\.output_norm_enc\.weight", "hidden_norm.weight"),
    Rule(r"encoder\.fc\.weight", "W_c.weight"),
    Rule(r"norm\.weight", "norm.weight"),
)

_IDENTITY = (Rule(r"(.*)", r"\1"),)
_RULES: dict[str, tuple[Rule, ...]] = {
    CANONICAL: _IDENTITY,
    LEGACY: _LEGACY_RULES,
    NATIVE: _NATIVE_RULES,
    DRAFTER_CANONICAL: _IDENTITY,
    DRAFTER_NATIVE: _DRAFTER_NATIVE_RULES,
}

# a name that only one layout uses, checked in order
_LAYOUT_MARKERS = (
    (CANONICAL, re.compile(r"model\.language_model\.")),
    (NATIVE, re.compile(r"(layers\.\d+\.attention\.qkv_proj\.|tok_embeddings\.weight$)")),
    (LEGACY, re.compile(r"model\.layers\.\d+\.")),
)


def detect_weight_layout(names: list[str]) -> str:
    """Tell the layout from the tensor names; refuse a mixture or an unknown naming scheme."""
    found = [layout for layout, marker in _LAYOUT_MARKERS if any(marker.match(n) for n in names)]
    if len(found) == 1:
        return found[0]
    sample = ", ".join(sorted(names)[:5])
    if not found:
        raise CheckpointError(
            "unrecognized weight layout: expected the canonical HF export (model.language_model.*), the legacy "
            f"HF export (model.layers.*) or the native vendor layout (layers.N.attention.qkv_proj.*); found {sample}"
        )
    raise CheckpointError(f"the checkpoint mixes weight layouts {found}; re-export it in one layout")


@dataclass(frozen=True)
class SourceSlice:
    """One canonical parameter's place in the checkpoint."""

    source: str
    rows: tuple[int, int] | None  # [start, stop) along dim 0 of a fused source, else the whole tensor
    rope_heads: int | None


def _config_value(config: ModelConfig | DrafterConfig, field: str | int) -> int:
    if isinstance(field, int):
        return field
    if isinstance(config, DrafterConfig):
        return getattr(config, field)
    if field.startswith("vision."):
        return getattr(config.vision, field.removeprefix("vision."))
    return getattr(config.text, field)


def locate(layout: str, target: str, config: ModelConfig | DrafterConfig) -> SourceSlice | None:
    """Where `target` lives in a checkpoint of `layout`, or None if the layout has no rule for it."""
    for rule in _RULES[layout]:
        match = re.fullmatch(rule.target, target)
        if match is None:
            continue
        rows = None
        if rule.fused is not None:
            sizes, index = rule.fused
            start = sum(_config_value(config, f) for f in sizes[:index])
            rows = (start, start + _config_value(config, sizes[index]))
        heads = _config_value(config, rule.rope_heads) if rule.rope_heads is not None else None
        return SourceSlice(match.expand(rule.source), rows, heads)
    return None


def interleaved_to_rotate_half(tensor: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Per head, row (2j + c) of the interleaved layout becomes row (c·d/2 + j) — §5.4.

    Works for weights (rows × in) and biases (rows,).
    """
    head_dim = tensor.shape[0] // num_heads
    rest = tensor.shape[1:]
    return tensor.reshape(num_heads, head_dim // 2, 2, *rest).transpose(1, 2).reshape(tensor.shape)


def rotate_half_to_interleaved(tensor: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Inverse of `interleaved_to_rotate_half` (used to write native checkpoints)."""
    head_dim = tensor.shape[0] // num_heads
    rest = tensor.shape[1:]
    return tensor.reshape(num_heads, 2, head_dim // 2, *rest).transpose(1, 2).reshape(tensor.shape)
