"""Build the validated dataclasses (`TextConfig`, `VisionConfig`, `ModelConfig`) from the fields a config.json
reader has read (`config_layouts.py`); their validation errors are re-raised with the fields named as the file
spells them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from glimmer.checkpoint.config import TEXT_SIZE_FIELDS, ModelConfig, RopeScaling, TextConfig, VisionConfig
from glimmer.checkpoint.config_common_fields import VISION_PATH_FIELDS
from glimmer.checkpoint.config_fields import Fields, Notes, as_float, checked_bool, token_ids
from glimmer.errors import ConfigError


def build_text_config(
    fields: Fields, theta: Any, scaling: RopeScaling | None, rope_layers: tuple[bool, ...],
    layer_types: tuple[str, ...], qk: Any
) -> TextConfig:
    values, notes = fields.values, fields.section.notes
    return construct(
        TextConfig,
        fields.names,
        notes,
        **{name: values[name] for name in TEXT_SIZE_FIELDS},
        hidden_activation=values["hidden_activation"],
        rms_norm_eps=values["rms_norm_eps"],
        post_norm_eps=values["post_norm_eps"],
        rope_theta=theta,
        rope_scaling=scaling,
        layer_types=layer_types,
        rope_layers=rope_layers,
        qk_scale_factor=as_float(qk),
        output_multiplier=as_float(values["output_multiplier"]),
        final_logit_softcapping=as_float(values["final_logit_softcapping"]),
        attention_bias=checked_bool(values["attention_bias"], fields.names["attention_bias"], notes),
        tie_word_embeddings=checked_bool(values["tie_word_embeddings"], fields.names["tie_word_embeddings"], notes),
        max_position_embeddings=values["max_position_embeddings"],
        bos_token_id=values["bos_token_id"],
        eos_token_id=token_ids(values["eos_token_id"], fields.names["eos_token_id"], notes),
        pad_token_id=values["pad_token_id"],
    )


def build_model_config(text: TextConfig, vision: VisionConfig | None, head: Fields, notes: Notes) -> ModelConfig:
    top = {name: head.values.get(name) if vision else None for name in VISION_PATH_FIELDS}
    return construct(ModelConfig, head.names, notes, text=text, vision=vision, **top)


def _file_name(field: str, names: Mapping[str, str], default: str) -> str:
    """The file's name of `field` (`rope_parameters.factor`: the key's own name, else its object's name + `.factor`)."""
    if field in names:
        return names[field]
    head, _, rest = field.partition(".")
    return f"{names[head]}.{rest}" if rest and head in names else default


def construct(factory: Callable[..., Any], names: Mapping[str, str], notes: Notes, **kwargs: Any) -> Any:
    """Build a dataclass; its validation errors are re-raised with the fields named as in the user's file."""
    try:
        return factory(**kwargs)
    except ConfigError as exc:
        message = str(exc)
    owner = {TextConfig: "text_config", VisionConfig: "vision_config"}.get(factory)
    if owner is None:  # ModelConfig: its messages start with a bare top-level field name
        message = re.sub(r"^(\w+)=", lambda m: f"{names.get(m.group(1), m.group(1))}=", message)
    else:
        # `text_config.hidden_size` or `text_config.rope_parameters.factor` anywhere, and a bare
        # `num_attention_heads=` naming a second field
        pattern = rf"(?<![\w.])(?:{owner}\.(\w+(?:\.\w+)*)|(\w+)(?==))"
        message = re.sub(pattern, lambda m: _file_name(m.group(1) or m.group(2), names, m.group(0)), message)
        if not any(name.startswith(f"{owner}.") for name in names.values()):
            message = message.replace(f"{owner}: ", "vision fields: " if owner == "vision_config" else "")
    raise notes.error(message) from None
