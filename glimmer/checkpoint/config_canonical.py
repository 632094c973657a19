"""The reader of the canonical config.json layouts (`config_layouts.py`): `muse_glimmer` with a `text_config`
(and a `vision_config` or none) and the text-only `muse_glimmer_text`, as the reference's save_pretrained
writes them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from glimmer.checkpoint.config import (
    TEXT_SIZE_FIELDS,
    VISION_SIZE_FIELDS,
    ModelConfig,
    TextConfig,
    VisionConfig,
    is_number,
    reference_text_layer_types,
    reference_vision_layer_types,
)
from glimmer.checkpoint.config_build import build_model_config, build_text_config, construct
from glimmer.checkpoint.config_common_fields import (
    TEXT_DEFAULTS,
    TEXT_MODEL_TYPE,
    VISION_LAYER_NORM_EPS,
    VISION_MODEL_TYPE,
    VISION_PATH_FIELDS,
    check_rope_flag_type,
    read_rope_parameters,
    read_shared_text_fields,
    read_vision_path_fields,
)
from glimmer.checkpoint.config_fields import (
    MISSING,
    Fields,
    Notes,
    Section,
    checked_bool,
    layer_count,
    positive_int,
    square_grid,
)
from glimmer.checkpoint.config_layer_patterns import explicit_layer_types, read_nope_sources, resolve_nope

_CANONICAL_HEAD_DEFAULTS = {
    "qk_scale_factor": 3.87,
    "output_multiplier": 0.19611613513818404,
    "final_logit_softcapping": 20.0,
}

# the canonical layout states pos_emb_size as a height and a width, as the reference does (they must be equal)
_VISION_SIZE_FIELDS = (
    *(name for name in VISION_SIZE_FIELDS if name != "pos_emb_size"), "pos_emb_height", "pos_emb_width"
)


def read_canonical(raw: Mapping[str, Any], notes: Notes) -> ModelConfig:
    top = Section(raw, "", notes)
    top.ignore("model_type", "text_config")
    text_section = Section(raw["text_config"], "text_config", notes)
    text_reader = _read_canonical_text_fields(text_section)

    _, vision_raw = top.get("vision_config")
    vision_reader = None
    head = Fields(top)
    if vision_raw is not None and vision_raw is not MISSING:
        if not isinstance(vision_raw, Mapping):
            raise notes.error(f"vision_config must be a JSON object or null, got {type(vision_raw).__name__}")
        vision_reader = read_canonical_vision_fields(Section(vision_raw, "vision_config", notes))
        read_vision_path_fields(head, ("image_token_id",), ("out_hidden_size",), ("projector_hidden_size",))
    else:
        top.ignore(*VISION_PATH_FIELDS)  # nothing to attach them to: a text-only config keeps them None
    tie_name, tie = top.get("tie_word_embeddings")
    check_rope_flag_type(top)
    top.finish()
    notes.raise_if_missing()
    text = _tie_as_the_composite_model(text_reader(), top.path(tie_name), tie, notes)
    vision = vision_reader() if vision_reader else None
    return build_model_config(text, vision, head, notes)


def _tie_as_the_composite_model(text: TextConfig, name: str, tie: Any, notes: Notes) -> TextConfig:
    """The reference's MuseGlimmerForConditionalGeneration ties lm_head to embed_tokens only when its own top-level
    `tie_word_embeddings` is true; it ignores `text_config.tie_word_embeddings` and saves an untied lm_head."""
    tied = tie not in (MISSING, None) and checked_bool(tie, name, notes)
    if text.tie_word_embeddings and not tied:
        notes.warnings.append(
            "text_config.tie_word_embeddings=true is ignored, as transformers ignores it in a muse_glimmer config: "
            f"lm_head.weight is read from the checkpoint; set {name}=true to tie lm_head to embed_tokens"
        )
    return replace(text, tie_word_embeddings=tied)


def read_canonical_text(raw: Mapping[str, Any], notes: Notes) -> ModelConfig:
    section = Section(raw, "", notes)
    section.ignore("model_type")
    text_reader = _read_canonical_text_fields(section)
    notes.raise_if_missing()
    return build_model_config(text_reader(), None, Fields(section), notes)


def _read_canonical_text_fields(section: Section) -> Callable[[], TextConfig]:
    """Read a canonical text section now; the returned builder derives and validates once nothing is missing."""
    notes = section.notes
    fields = _sub_config_fields(section, TEXT_MODEL_TYPE, TEXT_SIZE_FIELDS)
    fields.read("hidden_activation", default="silu")
    theta, scaling = read_shared_text_fields(
        fields, TEXT_DEFAULTS | _CANONICAL_HEAD_DEFAULTS, ("rope_parameters", "rope_theta", "rope_scaling")
    )
    check_rope_flag_type(section)
    nope_sources = read_nope_sources(section)
    _, layer_types = section.get("layer_types")
    section.finish()

    def build() -> TextConfig:
        n = layer_count(fields.values["num_hidden_layers"], fields.names["num_hidden_layers"], notes)
        head_dim = positive_int(fields.values["head_dim"], fields.names["head_dim"], notes)
        qk = fields.values["qk_scale_factor"]
        if is_number(qk) and qk >= math.sqrt(head_dim):
            raise notes.error(
                f"{fields.names['qk_scale_factor']}={qk!r} is at least √head_dim={math.sqrt(head_dim):.4g}, so it "
                "looks like the raw vendor convention (3.87·√head_dim, 43.78 for the release). The canonical layout "
                "stores the folded multiplier applied after QK-norm on top of 1/√head_dim (3.87 for the release): "
                "divide the value by √head_dim, or label the file with the flat/vendor schema it came from"
            )
        rope_layers = resolve_nope(nope_sources, n, theta, canonical=True, notes=notes)
        # only an absent or null list is derived: an empty one is refused, as the reference refuses it
        types = explicit_layer_types(layer_types, section.path("layer_types"), notes)
        types = reference_text_layer_types(n) if types is None else types
        fields.names["layer_types"] = section.path("layer_types")
        return build_text_config(fields, theta, scaling, rope_layers, types, qk)

    return build


def read_canonical_vision_fields(section: Section) -> Callable[[], VisionConfig]:
    notes = section.notes
    fields = _sub_config_fields(section, VISION_MODEL_TYPE, _VISION_SIZE_FIELDS)
    fields.read("hidden_act", default="gelu")
    fields.read("layer_norm_eps", default=VISION_LAYER_NORM_EPS)
    theta_name, theta, _, _ = read_rope_parameters(section, ("rope_parameters", "rope_theta", "rope_scaling"),
                                                "axial", required=False)
    fields.names["rope_theta"] = theta_name
    _, layer_types = section.get("layer_types")
    section.ignore("max_position_embeddings")  # pos_emb_height × width; unused by the reference (§1.2)
    section.finish()

    def build() -> VisionConfig:
        values = fields.values
        pos_emb_size = square_grid(
            values["pos_emb_height"],
            fields.names["pos_emb_height"],
            values["pos_emb_width"],
            fields.names["pos_emb_width"],
            notes,
        )
        fields.names["pos_emb_size"] = fields.names["pos_emb_height"]
        fields.names["layer_types"] = section.path("layer_types")
        n = layer_count(values["num_hidden_layers"], fields.names["num_hidden_layers"], notes)
        # only an absent or null list is derived: an empty one is refused, as the reference refuses it
        types = explicit_layer_types(layer_types, section.path("layer_types"), notes)
        types = reference_vision_layer_types(n) if types is None else types
        kwargs = {name: values[name] for name in _VISION_SIZE_FIELDS if not name.startswith("pos_emb")}
        return construct(
            VisionConfig,
            fields.names,
            notes,
            **kwargs,
            pos_emb_size=pos_emb_size,
            rope_theta=theta,
            layer_norm_eps=values["layer_norm_eps"],
            hidden_act=values["hidden_act"],
            layer_types=types,
        )

    return build


def _sub_config_fields(section: Section, expected_model_type: str, sizes: Sequence[str]) -> Fields:
    """A canonical text or vision section's fields: its model_type checked, then its sizes read (all required)."""
    _, model_type = section.get("model_type")
    if model_type is not MISSING and model_type != expected_model_type:
        raise section.notes.error(
            f"{section.path('model_type')}={model_type!r} is not a Muse Glimmer sub-config; expected "
            f"{expected_model_type!r}"
        )
    fields = Fields(section)
    for name in sizes:
        fields.read(name)
    return fields
