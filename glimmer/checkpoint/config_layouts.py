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

Feature flags some engines write (`use_qk_norm`, `use_attn_output_gate`, `mlp_bias`, `attn_logit_softcapping`,
`use_bidirectional_attention`) are accepted when they describe Muse Glimmer and refused otherwise. `rope_scaling`,
the legacy name transformers reads in place of `rope_parameters`, is read as one, in text_config and vision_config
alike (axial RoPE only for the vision tower, any scaling transformers runs for the text decoder, `config_rope.py`;
beside a `rope_parameters` it must be the same object, as transformers would ignore the other).
`normalize_tok_embeddings: false` (older exports baked the embedding norm into the table) only warns, since the
weightless norm is idempotent. `rope_is_neox_style` (in every layout, at the top level or in `text_config`)
describes the weights' RoPE pairing, which the weight loader decides from the tensor names, so here it is only
checked to be a boolean; `formats.py` refuses one that contradicts the names. The vendor writer emits the native
form: `rope_is_neox_style: false`, `no_rope_layers`, and `every_n_layers_nope` when the NoPE pattern has a period.

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
  same layers are refused rather than resolved by guessing. The flat schemas then refuse layer types that
  do not put full attention exactly on the NoPE layers (their `no_rope_layers` says both); the canonical
  layout takes any combination, full attention with RoPE and sliding windows without it, as the reference.

Unknown keys produce one warning listing them all; keys that only bookkeep or train (`architectures`,
`dtype`, `use_cache`, `attention_dropout`, …, see `config_fields._IGNORED_KEYS`) are accepted silently, except
a `dtype` / `torch_dtype` that names no torch floating-point dtype (FLOAT_DTYPE_NAMES), which is ignored with a
warning.

The pieces: `config_fields.py` (the field reader: sections, fields, notes), `config_common_fields.py` (what
every layout reads alike), `config_layer_patterns.py` (the NoPE pattern and layer types), `config_canonical.py`
and `config_flat.py` (the readers; the flat schemas' alias tables are in `config_flat.py`), `config_build.py`
(the dataclasses built from what was read) and `config_writers.py`; this module detects the layout and is the
entry point.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from glimmer.checkpoint.broken_links import refuse_broken_link
from glimmer.checkpoint.config import ModelConfig
from glimmer.checkpoint.config_canonical import read_canonical, read_canonical_text
from glimmer.checkpoint.config_common_fields import MODEL_TYPE, TEXT_MODEL_TYPE, VISION_MODEL_TYPE
from glimmer.checkpoint.config_fields import CODE_KEYS, FLOAT_DTYPE_NAMES, Notes
from glimmer.checkpoint.config_flat import read_flat
from glimmer.checkpoint.config_writers import write_canonical, write_canonical_text, write_flat
from glimmer.errors import ConfigError

__all__ = ["CONFIG_LAYOUTS", "FLOAT_DTYPE_NAMES", "config_to_dict", "load_config", "normalize_config"]

logger = logging.getLogger(__name__)

CONFIG_LAYOUTS = ("canonical", "canonical-text", "flat", "vendor")

_DRAFTER_MODEL_TYPE = "muse_glimmer_assistant"  # a DFlash drafter (checkpoint/drafter.py)
_VENDOR_MARKERS = ("no_rope_layers", "layer_rope_theta", "every_n_layers_nope", "rope_is_neox_style")
_LAYOUTS_LOOKED_FOR = (
    "canonical (model_type 'muse_glimmer' with a text_config object), "
    "canonical-text (model_type 'muse_glimmer_text'), "
    "flat and vendor (model_type 'muse_glimmer' with top-level hidden_size/num_hidden_layers; vendor when "
    f"one of {', '.join(_VENDOR_MARKERS)} is also there)"
)


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
    notes = Notes(source, layout)
    code = [f"{key}={raw[key]!r}" for key in CODE_KEYS if key in raw]
    if code:
        notes.warnings.append(f"ignoring {', '.join(code)}: Glimmer never executes code shipped with a checkpoint")
    if layout == "canonical-text":
        config = read_canonical_text(raw, notes)
    elif layout == "canonical":
        config = read_canonical(raw, notes)
    else:
        config = read_flat(raw, notes)
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
        raise ConfigError(f"{path}: not found; {_without_config_fix(path.parent)}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read as UTF-8 text ({exc})") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except (ValueError, RecursionError) as exc:  # an integer of over 4,300 digits; arrays nested too deep
        raise ConfigError(f"{path}: not readable JSON ({exc})") from None
    return normalize_config(raw, source=str(path))


def _without_config_fix(directory: Path) -> str:
    """What to do about a directory without config.json: a PEFT adapter's is merged into its model first; one that
    holds a checkpoint a level or two down (a Hugging Face cache's models--owner--name/snapshots/REV) is named."""
    adapter = directory / "adapter_config.json"
    if adapter.is_file():
        return (f"{adapter} says this is a PEFT (LoRA) adapter, which Glimmer does not apply: merge it into its base "
                "model (peft's merge_and_unload, then save_pretrained) and pass that checkpoint")
    below = sorted(p.parent for pattern in ("*/config.json", "*/*/config.json") for p in directory.glob(pattern))
    if below:
        return f"a checkpoint directory must contain config.json; did you mean {below[0]}?"
    return "a checkpoint directory must contain config.json"


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
        return write_canonical_text(config.text, layout)
    if layout == "canonical":
        return write_canonical(config)
    return write_flat(config, vendor=layout == "vendor")


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
    if model_type == TEXT_MODEL_TYPE:
        return "canonical-text"
    if model_type == MODEL_TYPE:
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
        if model_type == VISION_MODEL_TYPE:
            found += " (a sub-model's config, not a Muse Glimmer model config)"
        elif model_type == _DRAFTER_MODEL_TYPE:
            found += (" (a DFlash drafter's config: a drafter runs beside its target model, e.g. glimmer serve TARGET "
                      "--speculative-config '{\"method\": \"dflash\", \"model\": \"DRAFTER_DIR\"}')")
    raise ConfigError(
        f"{source}: unrecognized config layout: {found}. Glimmer looked for: {_LAYOUTS_LOOKED_FOR}. Point it "
        "at a Muse Glimmer checkpoint, or fix config.json"
    )
