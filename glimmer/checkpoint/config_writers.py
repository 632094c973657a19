"""The writers of config.json (`config_layouts.config_to_dict`): a `ModelConfig` in the canonical, canonical-text,
flat or vendor layout, refusing what a layout cannot express, so that reading the result gives the config back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from glimmer.checkpoint.config import ModelConfig, TextConfig, off_the_flat_pattern, reference_rope_layers
from glimmer.checkpoint.config_common_fields import (
    MODEL_TYPE,
    TEXT_MODEL_TYPE,
    VISION_LAYER_NORM_EPS,
    VISION_MODEL_TYPE,
    VISION_PATH_FIELDS,
    VISION_ROPE_THETA,
)
from glimmer.checkpoint.config_flat import FLAT_TEXT_NAMES, FLAT_VISION_NAMES
from glimmer.checkpoint.config_layer_patterns import find_period, rope_with_period, vision_types_with_period
from glimmer.errors import ConfigError


def write_canonical_text(text: TextConfig, layout: str) -> dict[str, Any]:
    root = math.sqrt(text.head_dim)
    if text.qk_scale_factor >= root:
        raise ConfigError(
            f"qk_scale_factor={text.qk_scale_factor!r} is not below √head_dim={root:.4g}, so the {layout} layout "
            "cannot hold it (a reader would take it for the raw vendor convention); use 'flat' or 'vendor'"
        )
    return {"model_type": TEXT_MODEL_TYPE} | _text_entries(
        text,
        rope={"rope_parameters": _rope_parameters(text)},
        nope={"layer_rope_theta": [text.rope_theta if rope else 0 for rope in text.rope_layers]},
        qk_scale_factor=text.qk_scale_factor,
        names={},
    )


def write_canonical(config: ModelConfig) -> dict[str, Any]:
    out: dict[str, Any] = {
        "model_type": MODEL_TYPE,
        "architectures": ["MuseGlimmerForConditionalGeneration"],
        # the tie lives at the top level, where the reference reads it, as its save_pretrained writes it
        "text_config": write_canonical_text(config.text, "canonical") | {"tie_word_embeddings": False},
        "vision_config": None,
        "tie_word_embeddings": config.text.tie_word_embeddings,
    }
    vision = config.vision
    if vision is not None:
        out["vision_config"] = {
            "model_type": VISION_MODEL_TYPE,
            "hidden_size": vision.hidden_size,
            "intermediate_size": vision.intermediate_size,
            "num_hidden_layers": vision.num_hidden_layers,
            "num_attention_heads": vision.num_attention_heads,
            "hidden_act": vision.hidden_act,
            "patch_size": vision.patch_size,
            "patch_temporal": vision.patch_temporal,
            "merge_size": vision.merge_size,
            "pos_emb_height": vision.pos_emb_size,
            "pos_emb_width": vision.pos_emb_size,
            "max_position_embeddings": vision.pos_emb_size**2,
            "layer_norm_eps": vision.layer_norm_eps,
            "rope_parameters": {"rope_type": "axial", "rope_theta": vision.rope_theta},
            "layer_types": list(vision.layer_types),
        }
        out |= {name: getattr(config, name) for name in VISION_PATH_FIELDS}
    return out


def write_flat(config: ModelConfig, *, vendor: bool) -> dict[str, Any]:
    layout = "vendor" if vendor else "flat"
    text = config.text
    root = math.sqrt(text.head_dim)
    raw_qk = text.qk_scale_factor * root
    if text.qk_scale_factor < 1 or float(f"{raw_qk / root:.12g}") != text.qk_scale_factor:
        raise ConfigError(
            f"qk_scale_factor={text.qk_scale_factor!r} cannot be written in the {layout} layout: it stores the raw "
            "value qk·√head_dim, which must be at least √head_dim and is read back to 12 significant digits; "
            "use 'canonical'"
        )
    decoupled = off_the_flat_pattern(text.layer_types, text.rope_layers)
    if decoupled:
        raise ConfigError(
            f"layers {decoupled} are full attention with RoPE or sliding-window attention without it, which the "
            f"{layout} layout cannot hold (its NoPE layers are its full-attention ones); use 'canonical'"
        )
    out = {"model_type": MODEL_TYPE} | _text_entries(
        text, rope={"rope_theta": text.rope_theta} if text.rope_scaling is None else
        {"rope_parameters": _rope_parameters(text)}, nope={}, qk_scale_factor=raw_qk, names=FLAT_TEXT_NAMES
    )
    if vendor:
        out |= {
            # native vendor weights keep the interleaved RoPE pairing (§5.4)
            "rope_is_neox_style": False,
            "use_qk_norm": True,
            "use_attn_output_gate": True,
            "normalize_tok_embeddings": True,
            "no_rope_layers": [int(rope) for rope in text.rope_layers],
        }
        period = find_period(text.rope_layers, rope_with_period)
        if period is not None:
            out["every_n_layers_nope"] = period
    elif text.rope_layers != reference_rope_layers(text.num_hidden_layers):
        raise ConfigError(
            "the flat layout has no field for a NoPE pattern other than the reference one (every 4th layer counted "
            "back from the last); write this config as 'canonical' or 'vendor'"
        )
    out["has_vision"] = config.vision is not None
    if config.vision is not None:
        out |= _write_flat_vision(config, layout)
    return out


def _rope_parameters(text: TextConfig) -> dict[str, Any]:
    if text.rope_scaling is None:
        return {"rope_type": "default", "rope_theta": text.rope_theta}
    return text.rope_scaling.as_json(text.rope_theta)


def _write_flat_vision(config: ModelConfig, layout: str) -> dict[str, Any]:
    vision = config.vision
    assert vision is not None
    fixed = {
        "rope_theta": (vision.rope_theta, VISION_ROPE_THETA),
        "layer_norm_eps": (vision.layer_norm_eps, VISION_LAYER_NORM_EPS),
    }
    for name, (value, constant) in fixed.items():
        if value != constant:
            raise ConfigError(
                f"vision_config.{name}={value!r} cannot be written in the {layout} layout, which fixes it at "
                f"{constant!r}; use 'canonical'"
            )
    period = find_period(vision.layer_types, vision_types_with_period)
    if period is None:
        raise ConfigError(
            f"vision_config.layer_types cannot be written in the {layout} layout, which only has "
            "vision_sparse_attention_factor (full attention on every k-th layer and the last); use 'canonical'"
        )
    entries = {
        "hidden_size": vision.hidden_size,
        "num_attention_heads": vision.num_attention_heads,
        "num_hidden_layers": vision.num_hidden_layers,
        "vision_mlp_ratio": vision.intermediate_size / vision.hidden_size,
        "patch_size": vision.patch_size,
        "patch_temporal": vision.patch_temporal,
        "merge_size": vision.merge_size,
        "pos_emb_height": vision.pos_emb_size,
        "pos_emb_width": vision.pos_emb_size,
        "vision_sparse_attention_factor": period,
        "out_hidden_size": config.out_hidden_size,
        "projector_hidden_size": config.projector_hidden_size,
        "image_token_id": config.image_token_id,
        "video_token_id": config.video_token_id,
        "projector_hidden_act": config.projector_hidden_act,
    }
    return {FLAT_VISION_NAMES.get(name, name): value for name, value in entries.items()}


def _text_entries(
    text: TextConfig, *, rope: dict[str, Any], nope: dict[str, Any], qk_scale_factor: float, names: Mapping[str, str]
) -> dict[str, Any]:
    """`text` as config.json entries, in the order every layout writes them, each under its name in `names` (the
    layout's alias table) or its own; `rope` (the theta), `nope` (the NoPE pattern, where the layout states it) and
    `qk_scale_factor` come in the layout's form."""
    entries = {
        "vocab_size": text.vocab_size,
        "hidden_size": text.hidden_size,
        "intermediate_size": text.intermediate_size,
        "num_hidden_layers": text.num_hidden_layers,
        "num_attention_heads": text.num_attention_heads,
        "num_key_value_heads": text.num_key_value_heads,
        "head_dim": text.head_dim,
        "hidden_activation": text.hidden_activation,
        "max_position_embeddings": text.max_position_embeddings,
        "rms_norm_eps": text.rms_norm_eps,
        "post_norm_eps": text.post_norm_eps,
        **rope,
        "sliding_window": text.sliding_window,
        "layer_types": list(text.layer_types),
        **nope,
        "qk_scale_factor": qk_scale_factor,
        "output_multiplier": text.output_multiplier,
        "final_logit_softcapping": text.final_logit_softcapping,
        "attention_bias": text.attention_bias,
        "tie_word_embeddings": text.tie_word_embeddings,
        "bos_token_id": text.bos_token_id,
        "eos_token_id": _eos_json(text.eos_token_id),
        "pad_token_id": text.pad_token_id,
    }
    return {names.get(name, name): value for name, value in entries.items()}


def _eos_json(ids: tuple[int, ...]) -> int | list[int] | None:
    if not ids:  # read from a null
        return None
    return ids[0] if len(ids) == 1 else list(ids)
