"""What every config.json layout reads alike (`config_layouts.py`): the model types, the text defaults,
the rope theta, the feature flags and the vision path's top-level fields.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from glimmer.checkpoint.config import RopeScaling
from glimmer.checkpoint.config_fields import MISSING, Fields, Section, as_float
from glimmer.checkpoint.config_rope import read_rope_scaling, warn_partial_rotary_ignored

TEXT_MODEL_TYPE = "muse_glimmer_text"
MODEL_TYPE = "muse_glimmer"
VISION_MODEL_TYPE = "muse_glimmer_vision"

# Reference class defaults that equal the released values (architecture.md §1.1).
TEXT_DEFAULTS = {
    "rms_norm_eps": 1e-5,
    "post_norm_eps": 1e-8,
    "attention_bias": False,
    "tie_word_embeddings": False,
    "max_position_embeddings": 131072,
    "bos_token_id": 200000,
    "eos_token_id": 200001,
}
VISION_ROPE_THETA = 10000.0  # the converter's value and the vision class default (§1.2)
VISION_LAYER_NORM_EPS = 1e-5
_IMAGE_TOKEN_ID = 200092  # <|patch|> (§9)
_VIDEO_TOKEN_ID = 200091

VISION_PATH_FIELDS = (
    "image_token_id",
    "video_token_id",
    "out_hidden_size",
    "projector_hidden_size",
    "projector_hidden_act",
)

# Flags some configs carry for features every Muse Glimmer checkpoint has (or lacks): any other value is a
# different architecture, which Glimmer refuses rather than ignores (a GGUF's keys of the same meaning too,
# gguf_model.py).
_ALWAYS = {
    "use_qk_norm": (True, "a weightless QK-norm"),
    "use_attn_output_gate": (True, "the sigmoid attention output gate"),
    "mlp_bias": (False, "bias-free MLP projections"),
}
NEVER_FEATURES = {
    "attn_logit_softcapping": "attention-logit softcapping",
    "use_bidirectional_attention": "bidirectional attention",
}


def read_shared_text_fields(
    fields: Fields, defaults: Mapping[str, Any], theta_keys: tuple[str, ...]
) -> tuple[Any, RopeScaling | None]:
    """Read what every layout reads alike after its own text fields: the `defaults` (each taken when absent),
    pad_token_id, the rope theta (under the first of `theta_keys` present), its scaling and the feature flags; return
    the theta and the scaling."""
    section = fields.section
    for name, default in defaults.items():
        fields.read(name, default=default)
    fields.read_nullable("pad_token_id")
    theta_name, theta, scaling, scaling_names = read_rope_parameters(section, theta_keys, "default", required=True,
                                                                scaled=True)
    fields.names["rope_theta"] = theta_name
    fields.names.update(scaling_names)
    _check_feature_flags(section)
    return theta, scaling


# transformers 5.23's standardize_rope_params copies a text config's top-level original_max_position_embeddings (Phi-3
# and DeepSeek configs keep it beside the rope object) into the rope object of these types, over the object's own
_ORIGINAL_LENGTH = "original_max_position_embeddings"
_ORIGINAL_LENGTH_TYPES = ("llama3", "yarn", "longrope")


def _top_level_original_length(section: Section, rope: Mapping[str, Any], *, warn: bool) -> dict[str, Any]:
    """{original_max_position_embeddings: the top-level value} where transformers moves it into `rope` (a rope object
    of `section`), else {}; `warn`: say so where the object's own value differs (it is overridden)."""
    _, original = section.get(_ORIGINAL_LENGTH)
    if original is MISSING or rope.get("rope_type", rope.get("type")) not in _ORIGINAL_LENGTH_TYPES:
        return {}
    own = rope.get(_ORIGINAL_LENGTH, MISSING)
    if warn and own is not MISSING and own != original:
        section.notes.warnings.append(
            f"{section.path(_ORIGINAL_LENGTH)}={original!r} is used and the rope object's "
            f"{_ORIGINAL_LENGTH}={own!r} ignored, as transformers gives the top-level one priority; keep one"
        )
    return {_ORIGINAL_LENGTH: original}


def read_rope_parameters(
    section: Section, keys: tuple[str, ...], rope_type: str, *, required: bool, scaled: bool = False
) -> tuple[str, Any, RopeScaling | None, dict[str, str]]:
    """(name in the file, theta, scaling, scaling names) from rope_parameters.rope_theta or a bare rope_theta; they must
    agree. The scaling names give the file's name of the rope object (under `rope_parameters`) and of each of its keys
    (`rope_parameters.<key>`), for the messages of TextConfig's checks (config_build.construct).
    `rope_scaling`, where `keys` names it, is read as another `rope_parameters` (transformers reads the legacy
    name in its place), and must agree with the others too. `scaled`: the text decoder's objects may name any of
    transformers' RoPE scalings (config_rope.py), else only `rope_type` is allowed."""
    notes = section.notes
    scalings: list[RopeScaling | None] = []
    scaling_names: dict[str, str] = {}
    # a top-level partial_rotary_factor goes into the rope object that lacks one (transformers' standardization)
    _, top_partial = section.get("partial_rotary_factor") if scaled else (None, MISSING)
    _, legacy = section.get("rope_scaling")
    _, current = section.get("rope_parameters")
    if "rope_scaling" in keys and isinstance(legacy, Mapping) and legacy and current not in (MISSING, None) \
            and legacy != current:
        raise notes.error(f"{section.path('rope_scaling')}={legacy!r} and {section.path('rope_parameters')}="
                          f"{current!r} differ; transformers reads only rope_scaling where both are set: keep one")
    found: list[tuple[str, Any]] = []
    for key in keys:
        _, value = section.get(key)
        if value is MISSING or value is None:
            continue
        if key not in ("rope_parameters", "rope_scaling"):
            found.append((section.path(key), value))
            continue
        if not isinstance(value, Mapping):
            raise notes.error(f"{section.path(key)} must be a JSON object, got {type(value).__name__}")
        moved = _top_level_original_length(section, value, warn=not scalings) if scaled else {}
        if top_partial not in (MISSING, None) and "partial_rotary_factor" not in value:
            moved["partial_rotary_factor"] = top_partial
        sub = Section({**value, **moved}, section.path(key), notes, {name: section.path(name) for name in moved})
        nested = [layer_type for layer_type in ("full_attention", "sliding_attention") if layer_type in value]
        if nested:
            raise notes.error(
                f"{sub.path(nested[0])}: rope parameters per layer type are not supported; the reference reads one "
                f"{key} object (rope_type, rope_theta, ...) for every RoPE layer and fails on nested ones"
            )
        # `type` is the legacy spelling of `rope_type`, which transformers still reads (`{"type": "linear"}` scales)
        kind_key, kind = sub.get("rope_type", "type")
        if scaled:
            if not scalings:
                scaling_names = {"rope_parameters": section.path(key), "rope_parameters.rope_type": sub.path(kind_key),
                                 **{f"rope_parameters.{name}": sub.path(name) for name in moved}}
            scalings.append(read_rope_scaling(sub, "default" if kind is MISSING else kind, sub.path(kind_key)))
        else:
            allowed = ("default", "axial") if rope_type == "axial" else ("default",)
            if kind is not MISSING and kind not in allowed:
                raise notes.error(
                    f"{sub.path(kind_key)}={kind!r} is not supported; Muse Glimmer uses {rope_type!r} RoPE"
                )
            _, partial = sub.get("partial_rotary_factor")
            if partial is not MISSING and partial != 1:
                raise notes.error(f"{sub.path('partial_rotary_factor')}={partial!r} is not supported; expected 1.0")
        _, theta = sub.get("rope_theta")
        if theta is not MISSING:
            found.append((sub.path("rope_theta"), theta))
        sub.finish()
    for name, value in found[1:]:
        if value != found[0][1]:
            raise notes.error(f"{found[0][0]}={found[0][1]!r} and {name}={value!r} disagree; keep one rope theta")
    # the objects agree (checked above), so the first one's scaling is every one's
    scaling = scalings[0] if scalings else None
    if not scalings:
        warn_partial_rotary_ignored(notes, section.path("partial_rotary_factor"), top_partial)
    _, original = section.get(_ORIGINAL_LENGTH) if scaled else (None, MISSING)
    if original not in (MISSING, None) and (scaling is None or scaling.rope_type not in _ORIGINAL_LENGTH_TYPES):
        notes.warnings.append(f"{section.path(_ORIGINAL_LENGTH)}={original!r} is ignored, as the reference reads it "
                              f"only for rope_type {' or '.join(map(repr, _ORIGINAL_LENGTH_TYPES))}")
    if found:
        return found[0][0], as_float(found[0][1]), scaling, scaling_names
    name = section.path("rope_parameters.rope_theta" if "rope_parameters" == keys[0] else keys[0])
    if required:
        notes.missing.append(name)
        return name, None, scaling, scaling_names
    notes.defaulted.append(f"{name}={VISION_ROPE_THETA!r}")
    return name, VISION_ROPE_THETA, scaling, scaling_names


def check_rope_flag_type(section: Section) -> None:
    """`rope_is_neox_style` is a fact about the weights' RoPE pairing, not the architecture: `formats.py` checks it
    against the tensor names, which only a boolean can be checked against, so anything else is refused here."""
    _, neox = section.get("rope_is_neox_style")
    if neox is not MISSING and not isinstance(neox, bool):
        raise section.notes.error(f"{section.path('rope_is_neox_style')}={neox!r} is invalid; expected true or false")


def _check_feature_flags(section: Section) -> None:
    notes = section.notes
    for key, (expected, meaning) in _ALWAYS.items():
        _, value = section.get(key)
        if value is not MISSING and value is not expected:
            raise notes.error(
                f"{section.path(key)}={value!r} is not supported; every Muse Glimmer checkpoint has {meaning}: "
                f"set it to {json.dumps(expected)} or remove it"
            )
    for key, meaning in NEVER_FEATURES.items():
        _, value = section.get(key)
        if value not in (MISSING, None, False):
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
    elif normalize not in (MISSING, True):
        raise notes.error(f"{section.path('normalize_tok_embeddings')}={normalize!r} is invalid; expected true")


def read_vision_path_fields(
    head: Fields,
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
        head.values["projector_hidden_act"] = "gelu" if act is MISSING else act
        head.names["projector_hidden_act"] = "projector_hidden_act"
    else:
        head.read("projector_hidden_act", default=projector_act_default)
