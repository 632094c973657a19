"""The reader of the flat config.json schemas (`config_layouts.py`): the legacy converter's **flat** layout and
the **vendor** one, which share every field name, store `qk_scale_factor` raw and describe vision with
`vision_*` keys (or a canonical `vision_config` object).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from glimmer.checkpoint.config import (
    TEXT_SIZE_FIELDS,
    ModelConfig,
    VisionConfig,
    is_finite_number,
    is_number,
    off_the_flat_pattern,
)
from glimmer.checkpoint.config_build import build_model_config, build_text_config, construct
from glimmer.checkpoint.config_canonical import read_canonical_vision_fields
from glimmer.checkpoint.config_common_fields import (
    TEXT_DEFAULTS,
    VISION_LAYER_NORM_EPS,
    VISION_PATH_FIELDS,
    VISION_ROPE_THETA,
    check_rope_flag_type,
    read_shared_text_fields,
    read_vision_path_fields,
)
from glimmer.checkpoint.config_fields import (
    MISSING,
    Fields,
    Notes,
    Section,
    layer_count,
    positive_int,
    square_grid,
)
from glimmer.checkpoint.config_layer_patterns import (
    NOPE_PERIOD,
    differences,
    explicit_layer_types,
    read_nope_sources,
    resolve_nope,
    types_from_window_pattern,
    vision_types_with_period,
)

# Processor and packaging facts some flat configs carry (video sampling, mlx-lm's custom model file).
_FLAT_IGNORED_KEYS = tuple("vid_start_id vid_end_id vid_frame_sep_id video_num_frames video_sampling_fps".split())

# The flat schemas' alias tables, for the reader here and the writer (config_writers.py) alike: field → its name in
# the flat schemas, where the two differ. A text field is also read under its own name; a vision field is not.
FLAT_TEXT_NAMES = {"hidden_activation": "hidden_act", "final_logit_softcapping": "output_soft_cap_temp"}
FLAT_VISION_NAMES = {
    # VisionConfig (pos_emb_size as the canonical layout's height and width)
    "hidden_size": "vision_latent_dim",
    "num_attention_heads": "vision_heads",
    "num_hidden_layers": "vision_layers",
    "patch_size": "vision_patch_size",
    "patch_temporal": "vision_patch_temporal",
    "merge_size": "vision_downsample_factor",
    "pos_emb_height": "vision_pos_emb_grid_h",
    "pos_emb_width": "vision_pos_emb_grid_w",
    # ModelConfig's vision path
    "image_token_id": "patch_token_id",
    "out_hidden_size": "vision_output_dim",
    "projector_hidden_size": "vision_adapter_dim",
}
# VisionConfig sizes the flat schemas state under another name; each fixes a weight shape, so all are required
_FLAT_VISION_SIZES = (
    "hidden_size", "num_attention_heads", "num_hidden_layers", "patch_size", "patch_temporal", "merge_size"
)
# Any of these keys present: the flat config describes its vision tower with vision_* keys
_FLAT_VISION_KEYS = (
    *(FLAT_VISION_NAMES[name] for name in _FLAT_VISION_SIZES),
    "vision_mlp_ratio",
    FLAT_VISION_NAMES["pos_emb_height"],
    FLAT_VISION_NAMES["pos_emb_width"],
    "vision_sparse_attention_factor",
    FLAT_VISION_NAMES["out_hidden_size"],
    FLAT_VISION_NAMES["projector_hidden_size"],
)


def read_flat(raw: Mapping[str, Any], notes: Notes) -> ModelConfig:
    section = Section(raw, "", notes)
    section.ignore("model_type", "text_config", *_FLAT_IGNORED_KEYS)
    check_rope_flag_type(section)
    fields = Fields(section)
    for name in TEXT_SIZE_FIELDS:
        fields.read(name)
    fields.read("hidden_activation", FLAT_TEXT_NAMES["hidden_activation"], "hidden_activation", default="silu")
    fields.read("qk_scale_factor")
    fields.read("output_multiplier")
    fields.read("final_logit_softcapping", FLAT_TEXT_NAMES["final_logit_softcapping"], "final_logit_softcapping")
    theta, scaling = read_shared_text_fields(fields, TEXT_DEFAULTS, ("rope_theta", "rope_parameters", "rope_scaling"))
    nope_sources = read_nope_sources(section)
    _, layer_types = section.get("layer_types")
    _, window_pattern = section.get("sliding_window_pattern")

    head = Fields(section)
    vision_reader = _read_flat_vision(section, head)
    section.finish()
    notes.raise_if_missing()

    n = layer_count(fields.values["num_hidden_layers"], fields.names["num_hidden_layers"], notes)
    head_dim = positive_int(fields.values["head_dim"], fields.names["head_dim"], notes)
    qk = _fold_raw_qk(fields.values["qk_scale_factor"], fields.names["qk_scale_factor"], head_dim, notes)
    rope_layers = resolve_nope(nope_sources, n, theta, canonical=False, notes=notes)
    types = explicit_layer_types(layer_types, section.path("layer_types"), notes)
    fields.names["layer_types"] = "layer_types"
    if window_pattern is not MISSING:
        from_pattern = types_from_window_pattern(window_pattern, n, fields.values["sliding_window"], notes)
        if types is not None and types != from_pattern:
            raise notes.error(
                f"layer_types disagrees with sliding_window_pattern at layers {differences(types, from_pattern)}; "
                "make them agree or remove sliding_window_pattern"
            )
        if types is None:
            types, fields.names["layer_types"] = from_pattern, "sliding_window_pattern"
    if types is None:  # an empty list is refused by TextConfig, as the reference refuses it
        types = tuple("sliding_attention" if rope else "full_attention" for rope in rope_layers)
    _check_one_pattern(types, rope_layers, fields.names["layer_types"], notes)
    text = build_text_config(fields, theta, scaling, rope_layers, types, qk)
    vision = vision_reader() if vision_reader else None
    return build_model_config(text, vision, head, notes)


def _check_one_pattern(types: tuple[str, ...], rope_layers: tuple[bool, ...], name: str, notes: Notes) -> None:
    """The flat schemas describe one layer pattern (`no_rope_layers`: 1 = RoPE + sliding window, 0 = NoPE + full
    attention): layer types that put full attention elsewhere than on the NoPE layers contradict it. (The canonical
    layout, as the reference, takes the two patterns independently.)"""
    if len(types) != len(rope_layers):
        return  # TextConfig names the wrong length
    mismatched = off_the_flat_pattern(types, rope_layers)
    if mismatched:
        raise notes.error(
            f"{name} is inconsistent with the NoPE pattern at layers {mismatched}: the flat and vendor schemas put "
            "full attention exactly on the NoPE layers and sliding-window attention on the RoPE layers; fix "
            f"{name} or the NoPE flags (no_rope_layers / layer_rope_theta), or write the config in the canonical "
            "layout, whose layer_types and layer_rope_theta are independent"
        )


def _read_flat_vision(section: Section, head: Fields) -> Callable[[], VisionConfig] | None:
    """Read the vision part of a flat config (vision_* keys or a canonical vision_config); None if text-only."""
    notes = section.notes
    _, has_vision = section.get("has_vision")
    if has_vision is not MISSING and not isinstance(has_vision, bool):
        raise notes.error(f"has_vision={has_vision!r} is invalid; expected true or false")
    flat_keys = [key for key in _FLAT_VISION_KEYS if section.has(key)]
    _, nested = section.get("vision_config")
    nested = None if nested is MISSING else nested
    head_keys = (*VISION_PATH_FIELDS, FLAT_VISION_NAMES["image_token_id"], *_FLAT_VISION_KEYS)
    if has_vision is False:
        section.ignore(*head_keys)
        if flat_keys or nested is not None:
            notes.warnings.append("has_vision is false: the config is text-only and its vision fields are ignored")
        return None
    if flat_keys and nested is not None:
        raise notes.error(
            f"both vision_config and flat vision keys ({', '.join(flat_keys)}) are present; a flat config describes "
            "its vision tower one way, so keep one"
        )
    if not flat_keys and nested is None:
        if has_vision is True:
            raise notes.error(
                "has_vision is true but there are no vision fields (vision_latent_dim, vision_heads, …) and no "
                "vision_config; add them or set has_vision to false"
            )
        section.ignore(*head_keys)
        return None
    read_vision_path_fields(
        head,
        *((FLAT_VISION_NAMES[name], name) for name in ("image_token_id", "out_hidden_size", "projector_hidden_size")),
        projector_act_default=None,
    )
    if nested is not None:
        if not isinstance(nested, Mapping):
            raise notes.error(f"vision_config must be a JSON object or null, got {type(nested).__name__}")
        return read_canonical_vision_fields(Section(nested, "vision_config", notes))

    fields = Fields(section)
    for name in _FLAT_VISION_SIZES:
        fields.read(name, FLAT_VISION_NAMES[name])
    fields.read("vision_mlp_ratio")
    for name in ("pos_emb_height", "pos_emb_width"):
        fields.read(name, FLAT_VISION_NAMES[name])
    fields.read("vision_sparse_attention_factor", default=NOPE_PERIOD)

    def build() -> VisionConfig:
        values, names = fields.values, fields.names
        hidden = positive_int(values["hidden_size"], names["hidden_size"], notes)
        n = layer_count(values["num_hidden_layers"], names["num_hidden_layers"], notes)
        ratio = values["vision_mlp_ratio"]
        width = ratio * hidden if is_number(ratio) and ratio > 0 else math.nan
        if not is_finite_number(width):  # round() would fail on NaN, infinity or a huge integer with a bare error
            raise notes.error(f"vision_mlp_ratio={ratio!r} is invalid; expected a positive finite number")
        if abs(width - round(width)) > 1e-6:
            raise notes.error(
                f"vision_mlp_ratio={ratio!r} × vision_latent_dim={hidden} = {width!r} is not a whole number, so it "
                "cannot be the vision MLP width; write the ratio as intermediate_size / vision_latent_dim"
            )
        period = positive_int(values["vision_sparse_attention_factor"], names["vision_sparse_attention_factor"], notes)
        pos_emb_size = square_grid(
            values["pos_emb_height"], names["pos_emb_height"], values["pos_emb_width"], names["pos_emb_width"], notes
        )
        names |= {
            "intermediate_size": "vision_mlp_ratio",
            "pos_emb_size": names["pos_emb_height"],
            "layer_types": "vision_sparse_attention_factor",
        }
        return construct(
            VisionConfig,
            names,
            notes,
            hidden_size=hidden,
            intermediate_size=round(width),
            num_hidden_layers=n,
            **{name: values[name] for name in ("num_attention_heads", "patch_size", "patch_temporal", "merge_size")},
            pos_emb_size=pos_emb_size,
            # the flat schemas have no field for these; the legacy converter hard-codes them (§1.2)
            rope_theta=VISION_ROPE_THETA,
            layer_norm_eps=VISION_LAYER_NORM_EPS,
            hidden_act="gelu",
            layer_types=vision_types_with_period(n, period),
        )

    return build


def _fold_raw_qk(raw_qk: Any, name: str, head_dim: int, notes: Notes) -> float:
    if not is_finite_number(raw_qk) or raw_qk <= 0:
        raise notes.error(f"{name}={raw_qk!r} is invalid; expected a positive finite number")
    root = math.sqrt(head_dim)
    if raw_qk < root:
        raise notes.error(
            f"{name}={raw_qk!r} is below √head_dim={root:.4g}, so it looks like the folded canonical multiplier "
            "(3.87 for the release). This layout stores the raw value 3.87·√head_dim (43.78 for the release), "
            "which is divided by √head_dim on load: multiply the value by √head_dim, or write the file in the "
            "canonical layout"
        )
    # raw values are written with ~12 significant digits (43.7840518911): round the quotient to as many so
    # the same checkpoint gives the same folded value (3.87) as its canonical config
    return float(f"{raw_qk / root:.12g}")
