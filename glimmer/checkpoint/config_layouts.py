"""Read `config.json` in every layout found in the wild into one `ModelConfig`, and write it back.

Layouts (`CONFIG_LAYOUTS`) and how they are told apart, first match wins (architecture.md §15.1):

1. A `muse_glimmer_mlx_format` key is refused here (packaged MLX artifacts are opened by `mlx.py`, which
   strips its packaging keys before calling `normalize_config`), and so is a `quantization_config`
   (compressed-tensors checkpoints are opened by `compressed_tensors.py`, which checks and strips it).
2. `model_type: "muse_glimmer_text"` → **canonical-text**: what `MuseGlimmerTextConfig.save_pretrained`
   writes, text fields at the top level. Text-only.
3. `model_type: "muse_glimmer"` with a `text_config` object → **canonical**: what
   `MuseGlimmerConfig.save_pretrained` writes. A null or absent `vision_config` means text-only (the
   reference would build its default vision tower instead; Glimmer reads the absence literally).
   The "RC nested" schema of the vendor's MLX packagers is this same schema (same names, same folded
   `qk_scale_factor`), so it is read, and labelled, as canonical: a nested config is never "vendor".
   Tying `lm_head` to `embed_tokens` is the top-level `tie_word_embeddings` (absent: untied), as in the
   reference, which writes the tie there and ignores `text_config.tie_word_embeddings` (a true one warns).
4. `model_type: "muse_glimmer"`, no `text_config`, and a top-level `hidden_size` or `num_hidden_layers`
   → one of the two flat schemas, which share every field name:
   * **vendor** if it carries a vendor marker: `no_rope_layers`, `layer_rope_theta`,
     `every_n_layers_nope` or `rope_is_neox_style`;
   * **flat** (the legacy converter's layout) otherwise.
   Both store `qk_scale_factor` raw (3.87·√head_dim = 43.78 for the release) and use the legacy names
   `hidden_act`, `output_soft_cap_temp`, `rope_theta`, `patch_token_id` and the `vision_*` keys. Vision
   comes as `vision_*` keys or, as SGLang's vendor config class keeps it, as a canonical `vision_config`
   object (not both); `has_vision: false` makes the config text-only whatever else is there.
5. Anything else (another `model_type`, none at all, no recognizable fields) is refused with the list of
   layouts looked for. No field is ever defaulted for a layout that was not recognized.

`qk_scale_factor`: the convention is decided by the layout, never guessed from the value; a value that is
implausible for its layout is refused. Canonical layouts store the folded multiplier (3.87), which must be
below √head_dim; the flat schemas store the raw value, which must be at least √head_dim. `TextConfig`
always holds the folded value: raw / √head_dim, rounded to 12 significant digits, because raw values are
written with about 12 (43.7840518911) and the same checkpoint must normalize to the same config in every
layout. A consequence: a folded value is expressible in the flat schemas only when it is ≥ 1 and has at
most 12 significant digits, and in the canonical ones only when it is below √head_dim (so head_dim ≥ 16
for 3.87).

Required fields, in every layout: vocab_size, hidden_size, intermediate_size, num_hidden_layers,
num_attention_heads, num_key_value_heads, head_dim, the rope theta (the reference class default 10000 is
not the release's 500000) and sliding_window; in the flat schemas also qk_scale_factor, output_multiplier
and output_soft_cap_temp, whose conventions and defaults differ between the engines that write them.
With vision, every field that fixes a weight shape: the vision tower's sizes, patch geometry, merge size
and position grid, `out_hidden_size` and `projector_hidden_size` (`vision_mlp_ratio`,
`vision_output_dim`, `vision_adapter_dim` in the flat schemas).
Every other field, when absent, takes the reference class default, which equals the released value, and
is recorded in one warning: text eps values, activation, attention_bias, tie_word_embeddings,
max_position_embeddings (131072), bos/eos ids, and in canonical layouts qk_scale_factor,
output_multiplier and final_logit_softcapping; vision hidden_act, layer_norm_eps and rope theta (10000);
image/video token ids, canonical `projector_hidden_act` and `vision_sparse_attention_factor` (4). An
absent `pad_token_id` means null, as it does in the reference, without a warning. The flat schemas have
no field for the vision rope theta (10000), vision layer_norm_eps (1e-5) or the vision and projector
activations (exact GELU): those are constants of the layout, not defaults, and a config that differs
cannot be written in it.

Feature flags some engines write (`use_qk_norm`, `use_attn_output_gate`, `mlp_bias`,
`attn_logit_softcapping`, `use_bidirectional_attention`) are accepted when they describe Muse Glimmer and
refused otherwise. `rope_scaling`, the legacy name transformers reads in place of `rope_parameters`, is
read as one (plain RoPE only; beside a `rope_parameters` it must be the same object, as transformers would
ignore the other). `normalize_tok_embeddings: false` (older exports baked the embedding norm into the table)
only warns, since the weightless norm is idempotent. `rope_is_neox_style` (in every layout, at the top level or
in `text_config`) describes the weights' RoPE pairing, which the weight loader decides from the tensor names, so
here it is only checked to be a boolean; `formats.py` refuses one that contradicts the names. The vendor writer
emits the native form: `rope_is_neox_style: false`, `no_rope_layers`, and `every_n_layers_nope` when the NoPE
pattern has a period.

NoPE pattern (`rope_layers`) and layer types:
* canonical: from `layer_rope_theta` (0 = NoPE; other non-zero values than the global theta are ignored by
  the reference, so one warning), else the reference pattern. `layer_types` is explicit or the reference
  pattern, derived independently, exactly as the reference does.
* flat schemas: from `no_rope_layers` (1 = RoPE + sliding, 0 = NoPE + full) or `layer_rope_theta`, else
  from `every_n_layers_nope` (the vendor's rule: NoPE every k-th layer counted back from the last), else
  the reference pattern. `layer_types` is explicit, else follows `sliding_window_pattern` (aligned to the
  last layer), else follows the NoPE pattern.
* Every source that is present must agree with the one used (in canonical configs too, where
  `no_rope_layers` / `every_n_layers_nope` are not reference fields): two disagreeing descriptions of the
  same layers are refused rather than resolved by guessing. `TextConfig` then refuses layer types that
  do not put full attention exactly on the NoPE layers.

Unknown keys produce one warning listing them all; keys that only bookkeep or train (`architectures`,
`dtype`, `use_cache`, `attention_dropout`, …, see `_IGNORED_KEYS`) are accepted silently, except a `dtype` /
`torch_dtype` that names no torch floating-point dtype (FLOAT_DTYPE_NAMES), which is ignored with a warning.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from glimmer.checkpoint.broken_links import refuse_broken_link
from glimmer.checkpoint.config import (
    ModelConfig,
    TextConfig,
    VisionConfig,
    reference_rope_layers,
    reference_text_layer_types,
    reference_vision_layer_types,
)
from glimmer.errors import ConfigError

logger = logging.getLogger(__name__)

CONFIG_LAYOUTS = ("canonical", "canonical-text", "flat", "vendor")

_DRAFTER_MODEL_TYPE = "muse_glimmer_assistant"  # a DFlash drafter (checkpoint/drafter.py)
_TEXT_MODEL_TYPE = "muse_glimmer_text"
_MODEL_TYPE = "muse_glimmer"
_VISION_MODEL_TYPE = "muse_glimmer_vision"
_VENDOR_MARKERS = ("no_rope_layers", "layer_rope_theta", "every_n_layers_nope", "rope_is_neox_style")
_LAYOUTS_LOOKED_FOR = (
    "canonical (model_type 'muse_glimmer' with a text_config object), "
    "canonical-text (model_type 'muse_glimmer_text'), "
    "flat and vendor (model_type 'muse_glimmer' with top-level hidden_size/num_hidden_layers; vendor when "
    f"one of {', '.join(_VENDOR_MARKERS)} is also there)"
)

# Written by PreTrainedConfig.to_dict / save_pretrained or by training code; none changes what the model
# computes at inference, so they are accepted at every level without a warning.
_IGNORED_KEYS = frozenset(
    """
    transformers_version architectures dtype torch_dtype _name_or_path name_or_path _commit_hash
    _attn_implementation _attn_implementation_autoset attn_implementation output_attentions output_hidden_states
    return_dict chunk_size_feed_forward is_encoder_decoder is_decoder add_cross_attention cross_attention_hidden_size
    tie_encoder_decoder id2label label2id num_labels problem_type finetuning_task task_specific_params prefix
    tokenizer_class pruned_heads torchscript decoder_start_token_id sep_token_id
    use_cache initializer_range attention_dropout
    """.split()
) | {"quantization_config"}  # only ever null here: `_detect_layout` refuses any other value
# What `dtype` / `torch_dtype` may say: torch's floating-point dtype names, as transformers writes them (and
# "auto"). The field only records how the weights were saved: their own headers say what they hold, and Glimmer
# picks its compute dtype itself (LLM(dtype=...)), so another value is a warning naming it, not a refusal.
FLOAT_DTYPE_NAMES = frozenset(
    """auto bfloat16 float16 half float32 float float64 double float8_e4m3fn float8_e4m3fnuz float8_e5m2
    float8_e5m2fnuz float8_e8m0fnu float4_e2m1fn_x2""".split()
)
# Processor and packaging facts some flat configs carry (video sampling, mlx-lm's custom model file).
_FLAT_IGNORED_KEYS = tuple("vid_start_id vid_end_id vid_frame_sep_id video_num_frames video_sampling_fps".split())
# Keys that point at code shipped with the checkpoint (transformers' remote code, mlx-lm's custom model
# file). Glimmer never imports or executes such code; the keys are accepted with a warning saying so.
_CODE_KEYS = ("auto_map", "model_file")

_SIZE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "sliding_window",
)
# Reference class defaults that equal the released values (architecture.md §1.1).
_TEXT_DEFAULTS = {
    "rms_norm_eps": 1e-5,
    "post_norm_eps": 1e-8,
    "attention_bias": False,
    "tie_word_embeddings": False,
    "max_position_embeddings": 131072,
    "bos_token_id": 200000,
    "eos_token_id": 200001,
}
_CANONICAL_HEAD_DEFAULTS = {
    "qk_scale_factor": 3.87,
    "output_multiplier": 0.19611613513818404,
    "final_logit_softcapping": 20.0,
}
_VISION_SIZE_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "patch_size",
    "patch_temporal",
    "merge_size",
    "pos_emb_height",
    "pos_emb_width",
)
_VISION_ROPE_THETA = 10000.0  # the converter's value and the vision class default (§1.2)
_VISION_LAYER_NORM_EPS = 1e-5
_IMAGE_TOKEN_ID = 200092  # <|patch|> (§9)
_VIDEO_TOKEN_ID = 200091
_NOPE_PERIOD = 4

# flat name → VisionConfig / ModelConfig field; every one of them fixes a weight shape, so all are required
_FLAT_VISION_SIZES = {
    "vision_latent_dim": "hidden_size",
    "vision_heads": "num_attention_heads",
    "vision_layers": "num_hidden_layers",
    "vision_patch_size": "patch_size",
    "vision_patch_temporal": "patch_temporal",
    "vision_downsample_factor": "merge_size",
}
_FLAT_VISION_KEYS = (
    *_FLAT_VISION_SIZES,
    "vision_mlp_ratio",
    "vision_pos_emb_grid_h",
    "vision_pos_emb_grid_w",
    "vision_sparse_attention_factor",
    "vision_output_dim",
    "vision_adapter_dim",
)
_VISION_PATH_FIELDS = (
    "image_token_id",
    "video_token_id",
    "out_hidden_size",
    "projector_hidden_size",
    "projector_hidden_act",
)

# Flags some configs carry for features every Muse Glimmer checkpoint has (or lacks): any other value is a
# different architecture, which Glimmer refuses rather than ignores.
_ALWAYS = {
    "use_qk_norm": (True, "a weightless QK-norm"),
    "use_attn_output_gate": (True, "the sigmoid attention output gate"),
    "mlp_bias": (False, "bias-free MLP projections"),
}
_NEVER = {
    "attn_logit_softcapping": "attention-logit softcapping",
    "use_bidirectional_attention": "bidirectional attention",
}

_REQUIRED = object()
_MISSING = object()


class _Notes:
    """Everything found besides values: missing fields, defaults taken, unknown keys, other warnings."""

    def __init__(self, source: str, layout: str):
        self.source = source
        self.layout = layout
        self.missing: list[str] = []
        self.defaulted: list[str] = []
        self.unknown: list[str] = []
        self.warnings: list[str] = []

    def error(self, message: str) -> ConfigError:
        return ConfigError(f"{self.source}: {message}")

    def raise_if_missing(self) -> None:
        if not self.missing:
            return
        theta_hint = ""
        if any(name.endswith("rope_theta") for name in self.missing):
            theta_hint = (
                "; the rope theta is never defaulted: the reference class default (10000) is not the "
                "released value (500000), so take it from the checkpoint"
            )
        raise self.error(
            f"missing required field(s) {', '.join(self.missing)} for the {self.layout} layout; add them to "
            f"config.json{theta_hint}"
        )

    def all_warnings(self) -> tuple[str, ...]:
        out = []
        if self.defaulted:
            out.append(
                f"{self.source}: fields absent from the {self.layout} config took the reference defaults: "
                + ", ".join(self.defaulted)
            )
        if self.unknown:
            out.append(
                f"{self.source}: ignoring unknown keys (not part of the {self.layout} layout): "
                + ", ".join(self.unknown)
            )
        out.extend(f"{self.source}: {w}" for w in self.warnings)
        return tuple(out)


class _Section:
    """One JSON object of config.json (the top level, text_config, vision_config) and the keys read from it."""

    def __init__(self, data: Mapping[str, Any], path: str, notes: _Notes):
        self.data = data
        self.prefix = f"{path}." if path else ""
        self.notes = notes
        self.read: set[str] = set()

    def path(self, key: str) -> str:
        return self.prefix + key

    def has(self, key: str) -> bool:
        return key in self.data

    def get(self, *keys: str) -> tuple[str, Any]:
        """(key, value) of the first of `keys` present, or (keys[0], _MISSING); aliases present must agree."""
        self.read.update(keys)
        found = [(key, self.data[key]) for key in keys if key in self.data]
        if not found:
            return keys[0], _MISSING
        key, value = found[0]
        for other, other_value in found[1:]:
            if other_value != value:
                raise self.notes.error(
                    f"{self.path(key)}={value!r} and {self.path(other)}={other_value!r} disagree; they name the "
                    f"same field, keep one"
                )
        return key, value

    def ignore(self, *keys: str) -> None:
        self.read.update(keys)

    def finish(self) -> None:
        """Record the keys nobody read as unknown, and a dtype field that names no floating-point dtype."""
        self.notes.unknown.extend(
            self.path(key)
            for key in sorted(self.data)
            if key not in self.read and key not in _IGNORED_KEYS and key not in _CODE_KEYS
        )
        self.notes.warnings.extend(_dtype_field_warnings(self.data, self.prefix))


def _dtype_field_warnings(section: Mapping[str, Any], prefix: str = "") -> list[str]:
    """A warning for each `dtype` / `torch_dtype` of `section` that is not a torch floating-point dtype name
    (FLOAT_DTYPE_NAMES); `prefix`: the section's path in the file, dot-terminated ("text_config.")."""
    return [
        f"ignoring {prefix}{key}={section[key]!r}: not a torch floating-point dtype name (such as 'bfloat16', "
        "'float16' or 'float32'); the weights' own dtypes are used, so fix the field if the file was edited"
        for key in ("dtype", "torch_dtype")
        if section.get(key) is not None and (not isinstance(section[key], str) or section[key] not in FLOAT_DTYPE_NAMES)
    ]


class _Fields:
    """Values destined for one dataclass, and the name each has in the user's file (for error messages)."""

    def __init__(self, section: _Section):
        self.section = section
        self.values: dict[str, Any] = {}
        self.names: dict[str, str] = {}

    def read(self, field: str, *keys: str, default: Any = _REQUIRED) -> Any:
        key, value = self.section.get(*(keys or (field,)))
        self.names[field] = self.section.path(key)
        if value is _MISSING:
            if default is _REQUIRED:
                self.section.notes.missing.append(self.names[field])
            else:
                self.section.notes.defaulted.append(f"{self.names[field]}={default!r}")
                value = default
        self.values[field] = _as_float(value) if isinstance(default, float) else value
        return value

    def read_nullable(self, field: str) -> Any:
        """A field for which absent and null both mean "none" (pad_token_id): absence is not a default."""
        _, value = self.section.get(field)
        self.names[field] = self.section.path(field)
        self.values[field] = None if value is _MISSING else value
        return self.values[field]


# ---------------------------------------------------------------------------------------------------------
# Public API


def normalize_config(raw: dict[str, Any], *, source: str = "config.json") -> ModelConfig:
    """Detect the layout of a parsed config.json and return the validated `ModelConfig`.

    Raises ConfigError naming the field (as spelled in the file) and the fix. Warnings are logged and kept
    in `ModelConfig.warnings`. `raw` is not modified.
    """
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: expected a JSON object at the top level, got {type(raw).__name__}")
    layout = _detect_layout(raw, source)
    notes = _Notes(source, layout)
    code = [f"{key}={raw[key]!r}" for key in _CODE_KEYS if key in raw]
    if code:
        notes.warnings.append(f"ignoring {', '.join(code)}: Glimmer never executes code shipped with a checkpoint")
    if layout == "canonical-text":
        config = _read_canonical_text(raw, notes)
    elif layout == "canonical":
        config = _read_canonical(raw, notes)
    else:
        config = _read_flat(raw, notes)
    warnings = notes.all_warnings()
    for warning in warnings:
        logger.warning("%s", warning)
    return replace(config, config_layout=layout, warnings=warnings)


def load_config(checkpoint_dir: str | os.PathLike[str]) -> ModelConfig:
    """Read and normalize `<checkpoint_dir>/config.json`; ConfigError names the path when it is missing or bad."""
    path = Path(checkpoint_dir) / "config.json"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        refuse_broken_link(path, ConfigError)
        raise ConfigError(f"{path}: not found; a checkpoint directory must contain config.json") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read as UTF-8 text ({exc})") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except (ValueError, RecursionError) as exc:  # an integer of over 4,300 digits; arrays nested too deep
        raise ConfigError(f"{path}: not readable JSON ({exc})") from None
    return normalize_config(raw, source=str(path))


def config_to_dict(config: ModelConfig, layout: str) -> dict[str, Any]:
    """Write `config` as config.json content in `layout`; ConfigError if the layout cannot express it.

    `normalize_config(config_to_dict(c, layout))` equals `c` (up to config_layout and warnings) and carries
    no warnings. The vendor form is the flat vendor schema, as it sits next to native vendor weights.
    """
    if layout not in CONFIG_LAYOUTS:
        raise ConfigError(f"unknown config layout {layout!r}; expected one of {list(CONFIG_LAYOUTS)}")
    if layout == "canonical-text":
        if config.vision is not None:
            raise ConfigError(
                "the canonical-text layout (muse_glimmer_text) is text-only but this config has a vision tower; "
                "write it as 'canonical', 'flat' or 'vendor'"
            )
        return _write_canonical_text(config.text, layout)
    if layout == "canonical":
        return _write_canonical(config)
    return _write_flat(config, vendor=layout == "vendor")


# ---------------------------------------------------------------------------------------------------------
# Detection


def _detect_layout(raw: Mapping[str, Any], source: str) -> str:
    if "muse_glimmer_mlx_format" in raw:
        raise ConfigError(
            f"{source}: muse_glimmer_mlx_format={raw['muse_glimmer_mlx_format']!r} marks a packaged MLX artifact, "
            "whose config is read by the MLX reader (glimmer.checkpoint.mlx), not as a plain config.json"
        )
    text_config = raw.get("text_config")
    for where, section in (("", raw), ("text_config.", text_config)):
        # null means no quantization (some exporters write it so)
        if isinstance(section, Mapping) and section.get("quantization_config") is not None:
            raise ConfigError(
                f"{source}: {where}quantization_config marks a quantized checkpoint, whose config is read by the "
                "compressed-tensors reader (glimmer.checkpoint.compressed_tensors, as opening the checkpoint does), "
                "not as a plain config.json"
            )
    model_type = raw.get("model_type")
    if model_type == _TEXT_MODEL_TYPE:
        return "canonical-text"
    if model_type == _MODEL_TYPE:
        if text_config is not None:
            if not isinstance(text_config, Mapping):
                raise ConfigError(f"{source}: text_config must be a JSON object, got {type(text_config).__name__}")
            return "canonical"
        if "hidden_size" in raw or "num_hidden_layers" in raw:
            return "vendor" if any(marker in raw for marker in _VENDOR_MARKERS) else "flat"
        found = "model_type 'muse_glimmer' but neither a text_config nor top-level hidden_size/num_hidden_layers"
    elif model_type is None:
        found = "no model_type"
    else:
        found = f"model_type={model_type!r}"
        if model_type == _VISION_MODEL_TYPE:
            found += " (a sub-model's config, not a Muse Glimmer model config)"
        elif model_type == _DRAFTER_MODEL_TYPE:
            found += (" (a DFlash drafter's config: a drafter runs beside its target model, e.g. glimmer serve TARGET "
                      "--speculative-config '{\"method\": \"dflash\", \"model\": \"DRAFTER_DIR\"}')")
    raise ConfigError(
        f"{source}: unrecognized config layout: {found}. Glimmer looked for: {_LAYOUTS_LOOKED_FOR}. Point it "
        "at a Muse Glimmer checkpoint, or fix config.json"
    )


# ---------------------------------------------------------------------------------------------------------
# Canonical layouts


def _read_canonical(raw: Mapping[str, Any], notes: _Notes) -> ModelConfig:
    top = _Section(raw, "", notes)
    top.ignore("model_type", "text_config")
    text_section = _Section(raw["text_config"], "text_config", notes)
    text_reader = _read_canonical_text_fields(text_section)

    _, vision_raw = top.get("vision_config")
    vision_reader = None
    head = _Fields(top)
    if vision_raw is not None and vision_raw is not _MISSING:
        if not isinstance(vision_raw, Mapping):
            raise notes.error(f"vision_config must be a JSON object or null, got {type(vision_raw).__name__}")
        vision_reader = _read_canonical_vision_fields(_Section(vision_raw, "vision_config", notes))
        _read_vision_path_fields(head, ("image_token_id",), ("out_hidden_size",), ("projector_hidden_size",))
    else:
        top.ignore(*_VISION_PATH_FIELDS)  # nothing to attach them to: a text-only config keeps them None
    tie_name, tie = top.get("tie_word_embeddings")
    _check_rope_flag_type(top)
    top.finish()
    notes.raise_if_missing()
    text = _tie_as_the_composite_model(text_reader(), top.path(tie_name), tie, notes)
    vision = vision_reader() if vision_reader else None
    return _model_config(text, vision, head, notes)


def _tie_as_the_composite_model(text: TextConfig, name: str, tie: Any, notes: _Notes) -> TextConfig:
    """The reference's MuseGlimmerForConditionalGeneration ties lm_head to embed_tokens only when its own top-level
    `tie_word_embeddings` is true; it ignores `text_config.tie_word_embeddings` and saves an untied lm_head."""
    tied = tie not in (_MISSING, None) and _bool(tie, name, notes)
    if text.tie_word_embeddings and not tied:
        notes.warnings.append(
            "text_config.tie_word_embeddings=true is ignored, as transformers ignores it in a muse_glimmer config: "
            f"lm_head.weight is read from the checkpoint; set {name}=true to tie lm_head to embed_tokens"
        )
    return replace(text, tie_word_embeddings=tied)


def _read_canonical_text(raw: Mapping[str, Any], notes: _Notes) -> ModelConfig:
    section = _Section(raw, "", notes)
    section.ignore("model_type")
    text_reader = _read_canonical_text_fields(section)
    notes.raise_if_missing()
    return _model_config(text_reader(), None, _Fields(section), notes)


def _read_canonical_text_fields(section: _Section) -> Callable[[], TextConfig]:
    """Read a canonical text section now; the returned builder derives and validates once nothing is missing."""
    notes = section.notes
    _check_sub_model_type(section, _TEXT_MODEL_TYPE)
    fields = _Fields(section)
    for name in _SIZE_FIELDS:
        fields.read(name)
    fields.read("hidden_activation", default="silu")
    for name, default in (_TEXT_DEFAULTS | _CANONICAL_HEAD_DEFAULTS).items():
        fields.read(name, default=default)
    fields.read_nullable("pad_token_id")
    theta_name, theta = _read_rope_theta(section, ("rope_parameters", "rope_theta", "rope_scaling"), "default",
                                        required=True)
    fields.names["rope_theta"] = theta_name
    _check_feature_flags(section)
    _check_rope_flag_type(section)
    nope_sources = _read_nope_sources(section)
    _, layer_types = section.get("layer_types")
    section.finish()

    def build() -> TextConfig:
        n = _positive_int(fields.values["num_hidden_layers"], fields.names["num_hidden_layers"], notes)
        head_dim = _positive_int(fields.values["head_dim"], fields.names["head_dim"], notes)
        qk = fields.values["qk_scale_factor"]
        if _is_number(qk) and qk >= math.sqrt(head_dim):
            raise notes.error(
                f"{fields.names['qk_scale_factor']}={qk!r} is at least √head_dim={math.sqrt(head_dim):.4g}, so it "
                "looks like the raw vendor convention (3.87·√head_dim, 43.78 for the release). The canonical layout "
                "stores the folded multiplier applied after QK-norm on top of 1/√head_dim (3.87 for the release): "
                "divide the value by √head_dim, or label the file with the flat/vendor schema it came from"
            )
        rope_layers = _resolve_nope(nope_sources, n, theta, canonical=True, notes=notes)
        # only an absent or null list is derived: an empty one is refused, as the reference refuses it
        types = _layer_types(layer_types, section.path("layer_types"), notes)
        types = reference_text_layer_types(n) if types is None else types
        fields.names["layer_types"] = section.path("layer_types")
        return _text_config(fields, theta, rope_layers, types, qk)

    return build


def _read_canonical_vision_fields(section: _Section) -> Callable[[], VisionConfig]:
    notes = section.notes
    _check_sub_model_type(section, _VISION_MODEL_TYPE)
    fields = _Fields(section)
    for name in _VISION_SIZE_FIELDS:
        fields.read(name)
    fields.read("hidden_act", default="gelu")
    fields.read("layer_norm_eps", default=_VISION_LAYER_NORM_EPS)
    theta_name, theta = _read_rope_theta(section, ("rope_parameters", "rope_theta"), "axial", required=False)
    fields.names["rope_theta"] = theta_name
    _, layer_types = section.get("layer_types")
    section.ignore("max_position_embeddings")  # pos_emb_height × width; unused by the reference (§1.2)
    section.finish()

    def build() -> VisionConfig:
        values = fields.values
        pos_emb_size = _square_grid(
            values["pos_emb_height"],
            fields.names["pos_emb_height"],
            values["pos_emb_width"],
            fields.names["pos_emb_width"],
            notes,
        )
        fields.names["pos_emb_size"] = fields.names["pos_emb_height"]
        fields.names["layer_types"] = section.path("layer_types")
        n = _positive_int(values["num_hidden_layers"], fields.names["num_hidden_layers"], notes)
        # only an absent or null list is derived: an empty one is refused, as the reference refuses it
        types = _layer_types(layer_types, section.path("layer_types"), notes)
        types = reference_vision_layer_types(n) if types is None else types
        kwargs = {name: values[name] for name in _VISION_SIZE_FIELDS if not name.startswith("pos_emb")}
        return _construct(
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


def _check_sub_model_type(section: _Section, expected: str) -> None:
    _, model_type = section.get("model_type")
    if model_type is not _MISSING and model_type != expected:
        raise section.notes.error(
            f"{section.path('model_type')}={model_type!r} is not a Muse Glimmer sub-config; expected {expected!r}"
        )


# ---------------------------------------------------------------------------------------------------------
# Flat schemas (legacy flat and vendor)


def _read_flat(raw: Mapping[str, Any], notes: _Notes) -> ModelConfig:
    section = _Section(raw, "", notes)
    section.ignore("model_type", "text_config", *_FLAT_IGNORED_KEYS)
    _check_rope_flag_type(section)
    fields = _Fields(section)
    for name in _SIZE_FIELDS:
        fields.read(name)
    fields.read("hidden_activation", "hidden_act", "hidden_activation", default="silu")
    fields.read("qk_scale_factor")
    fields.read("output_multiplier")
    fields.read("final_logit_softcapping", "output_soft_cap_temp", "final_logit_softcapping")
    for name, default in _TEXT_DEFAULTS.items():
        fields.read(name, default=default)
    fields.read_nullable("pad_token_id")
    theta_name, theta = _read_rope_theta(section, ("rope_theta", "rope_parameters", "rope_scaling"), "default",
                                        required=True)
    fields.names["rope_theta"] = theta_name
    _check_feature_flags(section)
    nope_sources = _read_nope_sources(section)
    _, layer_types = section.get("layer_types")
    _, window_pattern = section.get("sliding_window_pattern")

    head = _Fields(section)
    vision_reader = _read_flat_vision(section, head)
    section.finish()
    notes.raise_if_missing()

    n = _positive_int(fields.values["num_hidden_layers"], fields.names["num_hidden_layers"], notes)
    head_dim = _positive_int(fields.values["head_dim"], fields.names["head_dim"], notes)
    qk = _fold_raw_qk(fields.values["qk_scale_factor"], fields.names["qk_scale_factor"], head_dim, notes)
    rope_layers = _resolve_nope(nope_sources, n, theta, canonical=False, notes=notes)
    types = _layer_types(layer_types, section.path("layer_types"), notes)
    fields.names["layer_types"] = "layer_types"
    if window_pattern is not _MISSING:
        from_pattern = _types_from_window_pattern(window_pattern, n, fields.values["sliding_window"], notes)
        if types is not None and types != from_pattern:
            raise notes.error(
                f"layer_types disagrees with sliding_window_pattern at layers {_differences(types, from_pattern)}; "
                "make them agree or remove sliding_window_pattern"
            )
        if types is None:
            types, fields.names["layer_types"] = from_pattern, "sliding_window_pattern"
    if types is None:  # an empty list is refused by TextConfig, as the reference refuses it
        types = tuple("sliding_attention" if rope else "full_attention" for rope in rope_layers)
    text = _text_config(fields, theta, rope_layers, types, qk)
    vision = vision_reader() if vision_reader else None
    return _model_config(text, vision, head, notes)


def _read_flat_vision(section: _Section, head: _Fields) -> Callable[[], VisionConfig] | None:
    """Read the vision part of a flat config (vision_* keys or a canonical vision_config); None if text-only."""
    notes = section.notes
    _, has_vision = section.get("has_vision")
    if has_vision is not _MISSING and not isinstance(has_vision, bool):
        raise notes.error(f"has_vision={has_vision!r} is invalid; expected true or false")
    flat_keys = [key for key in _FLAT_VISION_KEYS if section.has(key)]
    _, nested = section.get("vision_config")
    nested = None if nested is _MISSING else nested
    head_keys = (*_VISION_PATH_FIELDS, "patch_token_id", *_FLAT_VISION_KEYS)
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
    _read_vision_path_fields(
        head,
        ("patch_token_id", "image_token_id"),
        ("vision_output_dim", "out_hidden_size"),
        ("vision_adapter_dim", "projector_hidden_size"),
        projector_act_default=None,
    )
    if nested is not None:
        if not isinstance(nested, Mapping):
            raise notes.error(f"vision_config must be a JSON object or null, got {type(nested).__name__}")
        return _read_canonical_vision_fields(_Section(nested, "vision_config", notes))

    fields = _Fields(section)
    for key, name in _FLAT_VISION_SIZES.items():
        fields.read(name, key)
    fields.read("vision_mlp_ratio")
    fields.read("pos_emb_height", "vision_pos_emb_grid_h")
    fields.read("pos_emb_width", "vision_pos_emb_grid_w")
    fields.read("vision_sparse_attention_factor", default=_NOPE_PERIOD)

    def build() -> VisionConfig:
        values, names = fields.values, fields.names
        hidden = _positive_int(values["hidden_size"], names["hidden_size"], notes)
        n = _positive_int(values["num_hidden_layers"], names["num_hidden_layers"], notes)
        ratio = values["vision_mlp_ratio"]
        if not _is_number(ratio) or ratio <= 0:
            raise notes.error(f"vision_mlp_ratio={ratio!r} is invalid; expected a positive number")
        width = ratio * hidden
        if abs(width - round(width)) > 1e-6:
            raise notes.error(
                f"vision_mlp_ratio={ratio!r} × vision_latent_dim={hidden} = {width!r} is not a whole number, so it "
                "cannot be the vision MLP width; write the ratio as intermediate_size / vision_latent_dim"
            )
        period = _positive_int(values["vision_sparse_attention_factor"], names["vision_sparse_attention_factor"], notes)
        pos_emb_size = _square_grid(
            values["pos_emb_height"], names["pos_emb_height"], values["pos_emb_width"], names["pos_emb_width"], notes
        )
        names |= {
            "intermediate_size": "vision_mlp_ratio",
            "pos_emb_size": names["pos_emb_height"],
            "layer_types": "vision_sparse_attention_factor",
        }
        return _construct(
            VisionConfig,
            names,
            notes,
            hidden_size=hidden,
            intermediate_size=round(width),
            num_hidden_layers=n,
            num_attention_heads=values["num_attention_heads"],
            patch_size=values["patch_size"],
            patch_temporal=values["patch_temporal"],
            merge_size=values["merge_size"],
            pos_emb_size=pos_emb_size,
            # the flat schemas have no field for these; the legacy converter hard-codes them (§1.2)
            rope_theta=_VISION_ROPE_THETA,
            layer_norm_eps=_VISION_LAYER_NORM_EPS,
            hidden_act="gelu",
            layer_types=_vision_types_with_period(n, period),
        )

    return build


def _fold_raw_qk(raw_qk: Any, name: str, head_dim: int, notes: _Notes) -> float:
    if not _is_number(raw_qk) or not math.isfinite(raw_qk) or raw_qk <= 0:
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


def _types_from_window_pattern(pattern: Any, n: int, window: Any, notes: _Notes) -> tuple[str, ...]:
    """sliding_window_pattern [w, w, w, 0] repeated so that its last entry falls on the last layer."""
    if not isinstance(pattern, list) or not pattern or not all(_is_int(v) and v >= 0 for v in pattern):
        raise notes.error(
            f"sliding_window_pattern={pattern!r} is invalid; expected a non-empty list of window sizes (0 = full)"
        )
    if any(v not in (0, window) for v in pattern):
        raise notes.error(
            f"sliding_window_pattern={pattern!r} has windows other than sliding_window={window!r}; Muse Glimmer "
            "uses one window size on every sliding layer"
        )
    k = len(pattern)
    return tuple("sliding_attention" if pattern[(i - n) % k] else "full_attention" for i in range(n))


# ---------------------------------------------------------------------------------------------------------
# Shared readers


def _read_rope_theta(section: _Section, keys: tuple[str, str], rope_type: str, *, required: bool) -> tuple[str, Any]:
    """(name in the file, theta) from rope_parameters.rope_theta or a bare rope_theta; they must agree.
    `rope_scaling`, where `keys` names it, is read as another `rope_parameters` (transformers reads the legacy
    name in its place), and must agree with the others too."""
    notes = section.notes
    _, legacy = section.get("rope_scaling")
    _, current = section.get("rope_parameters")
    if "rope_scaling" in keys and isinstance(legacy, Mapping) and legacy and current not in (_MISSING, None) \
            and legacy != current:
        raise notes.error(f"{section.path('rope_scaling')}={legacy!r} and {section.path('rope_parameters')}="
                          f"{current!r} differ; transformers reads only rope_scaling where both are set: keep one")
    found: list[tuple[str, Any]] = []
    for key in keys:
        _, value = section.get(key)
        if value is _MISSING or value is None:
            continue
        if key not in ("rope_parameters", "rope_scaling"):
            found.append((section.path(key), value))
            continue
        if not isinstance(value, Mapping):
            raise notes.error(f"{section.path(key)} must be a JSON object, got {type(value).__name__}")
        sub = _Section(value, section.path(key), notes)
        # `type` is the legacy spelling of `rope_type`, which transformers still reads (`{"type": "linear"}` scales)
        kind_key, kind = sub.get("rope_type", "type")
        allowed = ("default", "axial") if rope_type == "axial" else ("default",)
        if kind is not _MISSING and kind not in allowed:
            raise notes.error(
                f"{sub.path(kind_key)}={kind!r} is not supported; Muse Glimmer uses {rope_type!r} RoPE"
            )
        _, partial = sub.get("partial_rotary_factor")
        if partial is not _MISSING and partial != 1:
            raise notes.error(f"{sub.path('partial_rotary_factor')}={partial!r} is not supported; expected 1.0")
        _, theta = sub.get("rope_theta")
        if theta is not _MISSING:
            found.append((sub.path("rope_theta"), theta))
        sub.finish()
    for name, value in found[1:]:
        if value != found[0][1]:
            raise notes.error(f"{found[0][0]}={found[0][1]!r} and {name}={value!r} disagree; keep one rope theta")
    if found:
        return found[0][0], _as_float(found[0][1])
    name = section.path("rope_parameters.rope_theta" if "rope_parameters" == keys[0] else keys[0])
    if required:
        notes.missing.append(name)
        return name, None
    notes.defaulted.append(f"{name}={_VISION_ROPE_THETA!r}")
    return name, _VISION_ROPE_THETA


def _check_rope_flag_type(section: _Section) -> None:
    """`rope_is_neox_style` is a fact about the weights' RoPE pairing, not the architecture: `formats.py` checks it
    against the tensor names, which only a boolean can be checked against, so anything else is refused here."""
    _, neox = section.get("rope_is_neox_style")
    if neox is not _MISSING and not isinstance(neox, bool):
        raise section.notes.error(f"{section.path('rope_is_neox_style')}={neox!r} is invalid; expected true or false")


def _check_feature_flags(section: _Section) -> None:
    notes = section.notes
    for key, (expected, meaning) in _ALWAYS.items():
        _, value = section.get(key)
        if value is not _MISSING and value is not expected:
            raise notes.error(
                f"{section.path(key)}={value!r} is not supported; every Muse Glimmer checkpoint has {meaning}: "
                f"set it to {json.dumps(expected)} or remove it"
            )
    for key, meaning in _NEVER.items():
        _, value = section.get(key)
        if value not in (_MISSING, None, False):
            raise notes.error(
                f"{section.path(key)}={value!r} is not supported; Muse Glimmer has no {meaning}: set it to null "
                "or remove it"
            )
    _, normalize = section.get("normalize_tok_embeddings")
    if normalize is False:
        # older vendor exports baked the weightless embedding norm into the table; it is idempotent, so
        # applying it again is harmless (SGLang relies on the same fact)
        notes.warnings.append(
            f"{section.path('normalize_tok_embeddings')} is false; Glimmer always applies the weightless embedding "
            "norm, which leaves an already-normalized table unchanged"
        )
    elif normalize not in (_MISSING, True):
        raise notes.error(f"{section.path('normalize_tok_embeddings')}={normalize!r} is invalid; expected true")


def _read_nope_sources(section: _Section) -> dict[str, tuple[str, Any]]:
    """The raw NoPE descriptions present: key → (name in the file, value)."""
    sources = {}
    for key in ("layer_rope_theta", "no_rope_layers", "every_n_layers_nope"):
        _, value = section.get(key)
        if value is not _MISSING and value is not None:
            sources[key] = (section.path(key), value)
    return sources


def _resolve_nope(
    sources: Mapping[str, tuple[str, Any]], n: int, theta: Any, *, canonical: bool, notes: _Notes
) -> tuple[bool, ...]:
    """The NoPE pattern (rope_layers) from whichever sources are present; all of them must agree."""
    patterns: list[tuple[str, tuple[bool, ...]]] = []
    if "layer_rope_theta" in sources:
        name, value = sources["layer_rope_theta"]
        patterns.append((name, _rope_from_layer_theta(value, name, n, theta, notes)))
    if "no_rope_layers" in sources:
        name, value = sources["no_rope_layers"]
        patterns.append((name, _rope_from_flags(value, name, n, notes)))
    if "every_n_layers_nope" in sources:
        name, value = sources["every_n_layers_nope"]
        period = _positive_int(value, name, notes)
        patterns.append((f"{name}={period}", _rope_with_period(n, period)))
    reference = ("the reference NoPE pattern (every 4th layer counted back from the last)", reference_rope_layers(n))
    if canonical and "layer_rope_theta" not in sources:
        # the reference derives layer_rope_theta when absent and never reads the vendor keys
        patterns.insert(0, reference)
    patterns = patterns or [reference]
    chosen_name, chosen = patterns[0]
    for name, pattern in patterns[1:]:
        if pattern != chosen:
            raise notes.error(
                f"{name} disagrees with {chosen_name} at layers {_differences(pattern, chosen)}; both say which "
                f"layers are NoPE (full attention, no RoPE): make them agree or remove {name.split('=')[0]}"
            )
    return chosen


def _rope_from_layer_theta(value: Any, name: str, n: int, theta: Any, notes: _Notes) -> tuple[bool, ...]:
    _check_per_layer_list(value, name, n, notes)
    bad = [v for v in value if not _is_number(v) or not math.isfinite(v) or v < 0]
    if bad:
        raise notes.error(f"{name} contains {bad}; each entry must be 0 (NoPE) or a positive rope theta")
    if any(v != 0 and v != theta for v in value):
        notes.warnings.append(
            f"{name} has non-zero entries other than the global rope theta {theta!r}; the reference only "
            "distinguishes 0 (NoPE) from non-zero, so every RoPE layer uses the global theta"
        )
    return tuple(v != 0 for v in value)


def _rope_from_flags(value: Any, name: str, n: int, notes: _Notes) -> tuple[bool, ...]:
    _check_per_layer_list(value, name, n, notes)
    bad = sorted({repr(v) for v in value if not _is_int(v) or v not in (0, 1)})
    if bad:
        raise notes.error(
            f"{name} contains non-binary entries {', '.join(bad)}; each entry must be 1 (RoPE + sliding window) or "
            "0 (NoPE + full attention)"
        )
    return tuple(v == 1 for v in value)


def _check_per_layer_list(value: Any, name: str, n: int, notes: _Notes) -> None:
    if not isinstance(value, list):
        raise notes.error(f"{name} must be a list with one entry per layer, got {type(value).__name__}")
    if len(value) != n:
        raise notes.error(
            f"{name} has {len(value)} entries but num_hidden_layers={n}; give one entry per layer or remove it "
            "to derive the reference pattern"
        )


def _layer_types(value: Any, name: str, notes: _Notes) -> tuple[str, ...] | None:
    if value is _MISSING or value is None:
        return None
    if not isinstance(value, list):
        raise notes.error(f"{name} must be a list with one entry per layer, got {type(value).__name__}")
    return tuple(value)


def _read_vision_path_fields(
    head: _Fields,
    image_keys: tuple[str, ...],
    out_keys: tuple[str, ...],
    projector_keys: tuple[str, ...],
    projector_act_default: str | None = "gelu",
) -> None:
    """The top-level fields of the vision path: placeholder ids, adapter widths and activation."""
    head.read("image_token_id", *image_keys, default=_IMAGE_TOKEN_ID)
    head.read("video_token_id", default=_VIDEO_TOKEN_ID)
    head.read("out_hidden_size", *out_keys)
    head.read("projector_hidden_size", *projector_keys)
    if projector_act_default is None:
        # the flat schemas have no field for it: exact GELU is a constant of the layout (§1.3)
        _, act = head.section.get("projector_hidden_act")
        head.values["projector_hidden_act"] = "gelu" if act is _MISSING else act
        head.names["projector_hidden_act"] = "projector_hidden_act"
    else:
        head.read("projector_hidden_act", default=projector_act_default)


# ---------------------------------------------------------------------------------------------------------
# Building the dataclasses


def _text_config(
    fields: _Fields, theta: Any, rope_layers: tuple[bool, ...], layer_types: tuple[str, ...], qk: Any
) -> TextConfig:
    values, notes = fields.values, fields.section.notes
    return _construct(
        TextConfig,
        fields.names,
        notes,
        **{name: values[name] for name in _SIZE_FIELDS},
        hidden_activation=values["hidden_activation"],
        rms_norm_eps=values["rms_norm_eps"],
        post_norm_eps=values["post_norm_eps"],
        rope_theta=theta,
        layer_types=layer_types,
        rope_layers=rope_layers,
        qk_scale_factor=_as_float(qk),
        output_multiplier=_as_float(values["output_multiplier"]),
        final_logit_softcapping=_as_float(values["final_logit_softcapping"]),
        attention_bias=_bool(values["attention_bias"], fields.names["attention_bias"], notes),
        tie_word_embeddings=_bool(values["tie_word_embeddings"], fields.names["tie_word_embeddings"], notes),
        max_position_embeddings=values["max_position_embeddings"],
        bos_token_id=values["bos_token_id"],
        eos_token_id=_token_ids(values["eos_token_id"], fields.names["eos_token_id"], notes),
        pad_token_id=values["pad_token_id"],
    )


def _model_config(text: TextConfig, vision: VisionConfig | None, head: _Fields, notes: _Notes) -> ModelConfig:
    top = {name: head.values.get(name) if vision else None for name in _VISION_PATH_FIELDS}
    return _construct(ModelConfig, head.names, notes, text=text, vision=vision, **top)


def _construct(factory: Callable[..., Any], names: Mapping[str, str], notes: _Notes, **kwargs: Any) -> Any:
    """Build a dataclass; its validation errors are re-raised with the fields named as in the user's file."""
    try:
        return factory(**kwargs)
    except ConfigError as exc:
        message = str(exc)
    owner = {TextConfig: "text_config", VisionConfig: "vision_config"}.get(factory)
    if owner is None:  # ModelConfig: its messages start with a bare top-level field name
        message = re.sub(r"^(\w+)=", lambda m: f"{names.get(m.group(1), m.group(1))}=", message)
    else:
        # `text_config.hidden_size` anywhere, and a bare `num_attention_heads=` naming a second field
        pattern = rf"(?<![\w.])(?:{owner}\.(\w+)|(\w+)(?==))"
        message = re.sub(pattern, lambda m: names.get(m.group(1) or m.group(2), m.group(0)), message)
        if not any(name.startswith(f"{owner}.") for name in names.values()):
            message = message.replace(f"{owner}: ", "vision fields: " if owner == "vision_config" else "")
    raise notes.error(message) from None


# ---------------------------------------------------------------------------------------------------------
# Writers


def _write_canonical_text(text: TextConfig, layout: str) -> dict[str, Any]:
    root = math.sqrt(text.head_dim)
    if text.qk_scale_factor >= root:
        raise ConfigError(
            f"qk_scale_factor={text.qk_scale_factor!r} is not below √head_dim={root:.4g}, so the {layout} layout "
            "cannot hold it (a reader would take it for the raw vendor convention); use 'flat' or 'vendor'"
        )
    return {
        "model_type": _TEXT_MODEL_TYPE,
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
        "rope_parameters": {"rope_type": "default", "rope_theta": text.rope_theta},
        "sliding_window": text.sliding_window,
        "layer_types": list(text.layer_types),
        "layer_rope_theta": [text.rope_theta if rope else 0 for rope in text.rope_layers],
        "qk_scale_factor": text.qk_scale_factor,
        "output_multiplier": text.output_multiplier,
        "final_logit_softcapping": text.final_logit_softcapping,
        "attention_bias": text.attention_bias,
        "tie_word_embeddings": text.tie_word_embeddings,
        "bos_token_id": text.bos_token_id,
        "eos_token_id": _eos_json(text.eos_token_id),
        "pad_token_id": text.pad_token_id,
    }


def _write_canonical(config: ModelConfig) -> dict[str, Any]:
    out: dict[str, Any] = {
        "model_type": _MODEL_TYPE,
        "architectures": ["MuseGlimmerForConditionalGeneration"],
        # the tie lives at the top level, where the reference reads it, as its save_pretrained writes it
        "text_config": _write_canonical_text(config.text, "canonical") | {"tie_word_embeddings": False},
        "vision_config": None,
        "tie_word_embeddings": config.text.tie_word_embeddings,
    }
    vision = config.vision
    if vision is not None:
        out["vision_config"] = {
            "model_type": _VISION_MODEL_TYPE,
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
        out |= {name: getattr(config, name) for name in _VISION_PATH_FIELDS}
    return out


def _write_flat(config: ModelConfig, *, vendor: bool) -> dict[str, Any]:
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
    out: dict[str, Any] = {
        "model_type": _MODEL_TYPE,
        "vocab_size": text.vocab_size,
        "hidden_size": text.hidden_size,
        "intermediate_size": text.intermediate_size,
        "num_hidden_layers": text.num_hidden_layers,
        "num_attention_heads": text.num_attention_heads,
        "num_key_value_heads": text.num_key_value_heads,
        "head_dim": text.head_dim,
        "hidden_act": text.hidden_activation,
        "max_position_embeddings": text.max_position_embeddings,
        "rms_norm_eps": text.rms_norm_eps,
        "post_norm_eps": text.post_norm_eps,
        "rope_theta": text.rope_theta,
        "sliding_window": text.sliding_window,
        "layer_types": list(text.layer_types),
        "qk_scale_factor": raw_qk,
        "output_multiplier": text.output_multiplier,
        "output_soft_cap_temp": text.final_logit_softcapping,
        "attention_bias": text.attention_bias,
        "tie_word_embeddings": text.tie_word_embeddings,
        "bos_token_id": text.bos_token_id,
        "eos_token_id": _eos_json(text.eos_token_id),
        "pad_token_id": text.pad_token_id,
    }
    if vendor:
        out |= {
            # native vendor weights keep the interleaved RoPE pairing (§5.4)
            "rope_is_neox_style": False,
            "use_qk_norm": True,
            "use_attn_output_gate": True,
            "normalize_tok_embeddings": True,
            "no_rope_layers": [int(rope) for rope in text.rope_layers],
        }
        period = _find_period(text.rope_layers, _rope_with_period)
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


def _write_flat_vision(config: ModelConfig, layout: str) -> dict[str, Any]:
    vision = config.vision
    assert vision is not None
    fixed = {
        "rope_theta": (vision.rope_theta, _VISION_ROPE_THETA),
        "layer_norm_eps": (vision.layer_norm_eps, _VISION_LAYER_NORM_EPS),
    }
    for name, (value, constant) in fixed.items():
        if value != constant:
            raise ConfigError(
                f"vision_config.{name}={value!r} cannot be written in the {layout} layout, which fixes it at "
                f"{constant!r}; use 'canonical'"
            )
    period = _find_period(vision.layer_types, _vision_types_with_period)
    if period is None:
        raise ConfigError(
            f"vision_config.layer_types cannot be written in the {layout} layout, which only has "
            "vision_sparse_attention_factor (full attention on every k-th layer and the last); use 'canonical'"
        )
    return {
        "vision_latent_dim": vision.hidden_size,
        "vision_heads": vision.num_attention_heads,
        "vision_layers": vision.num_hidden_layers,
        "vision_mlp_ratio": vision.intermediate_size / vision.hidden_size,
        "vision_patch_size": vision.patch_size,
        "vision_patch_temporal": vision.patch_temporal,
        "vision_downsample_factor": vision.merge_size,
        "vision_pos_emb_grid_h": vision.pos_emb_size,
        "vision_pos_emb_grid_w": vision.pos_emb_size,
        "vision_sparse_attention_factor": period,
        "vision_output_dim": config.out_hidden_size,
        "vision_adapter_dim": config.projector_hidden_size,
        "patch_token_id": config.image_token_id,
        "video_token_id": config.video_token_id,
        "projector_hidden_act": config.projector_hidden_act,
    }


# ---------------------------------------------------------------------------------------------------------
# Small helpers


def _rope_with_period(n: int, period: int) -> tuple[bool, ...]:
    """The vendor's every_n_layers_nope rule: NoPE every `period`-th layer counted back from the last."""
    return tuple((n - 1 - i) % period != 0 for i in range(n))


def _vision_types_with_period(n: int, period: int) -> tuple[str, ...]:
    """vision_sparse_attention_factor: full attention on every `period`-th layer and on the last one."""
    return tuple("full_attention" if (i + 1) % period == 0 or i == n - 1 else "window_attention" for i in range(n))


def _find_period(pattern: Sequence[Any], rule: Callable[[int, int], tuple[Any, ...]]) -> int | None:
    """The period (4 preferred, else the smallest) for which `rule` reproduces `pattern`, if any."""
    n = len(pattern)
    for period in (_NOPE_PERIOD, *range(1, n + 1)):
        if rule(n, period) == tuple(pattern):
            return period
    return None


def _differences(a: Sequence[Any], b: Sequence[Any]) -> list[int]:
    return [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]


def _square_grid(height: Any, height_name: str, width: Any, width_name: str, notes: _Notes) -> Any:
    if height != width:
        raise notes.error(
            f"{height_name}={height!r} and {width_name}={width!r} differ; the reference assumes a square position "
            "grid (architecture.md §1.2), so Glimmer refuses a non-square one"
        )
    return height


def _token_ids(value: Any, name: str, notes: _Notes) -> tuple[int, ...]:
    ids = [] if value is None else value if isinstance(value, list) else [value]
    if not all(_is_int(v) and v >= 0 for v in ids):
        raise notes.error(f"{name}={value!r} is invalid; expected a token id or a list of token ids")
    return tuple(ids)


def _eos_json(ids: tuple[int, ...]) -> int | list[int]:
    return ids[0] if len(ids) == 1 else list(ids)


def _positive_int(value: Any, name: str, notes: _Notes) -> int:
    if not _is_int(value) or value <= 0:
        raise notes.error(f"{name}={value!r} is invalid; expected a positive integer")
    return value


def _bool(value: Any, name: str, notes: _Notes) -> bool:
    if not isinstance(value, bool):
        raise notes.error(f"{name}={value!r} is invalid; expected true or false")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _as_float(value: Any) -> Any:
    """JSON integers in float fields (rope_theta: 500000) become floats; anything else is left to validation."""
    return float(value) if _is_int(value) else value
