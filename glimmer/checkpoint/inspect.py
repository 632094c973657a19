"""What `glimmer inspect` reports about a checkpoint, computed without loading any weight data."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from glimmer.captured_warnings import captured_warnings
from glimmer.checkpoint.chat_template_source import find_checkpoint_chat_template
from glimmer.checkpoint.config import ModelConfig
from glimmer.checkpoint.formats import OpenedCheckpoint, is_config_only, open_checkpoint
from glimmer.checkpoint.generation_config import load_generation_defaults
from glimmer.checkpoint.weights import (
    drop_vision_if_absent,
    expected_parameters,
    plan_weights,
    untie_if_lm_head_stored,
)
from glimmer.errors import CheckpointError
from glimmer.multimodal.settings import checkpoint_media_settings

CONFIG_ONLY = "config-only"  # the format reported for a directory without weights (`is_config_only`)
PARAMETER_GROUPS = (
    ("text backbone (incl. embedding)", "model.language_model."),
    ("lm_head", "lm_head."),
    ("vision tower", "model.vision_tower."),
    ("vision adapter", "model.vision_adapter."),
    ("vision projection", "model.vision_projection."),
)


@dataclass
class CheckpointReport:
    config: ModelConfig
    format: str
    weight_layout: str  # as stored: a GGUF's or MLX artifact's own, not the canonical names its reader hands on
    rope_layout: str
    parameter_counts: dict[str, int]
    checkpoint_bytes: int
    warnings: list[str]
    # GGUF / MLX storage types → tensor count (None for safetensors and pickle weights)
    tensor_types: dict[str, int] | None = None
    # compressed-tensors: the scheme, the quantized modules and their bytes on disk (None for other formats)
    quantization: dict[str, Any] | None = None
    # the chat template `glimmer serve` would render with: origin and sha256 (None each, and a warning, where there
    # is none)
    chat_template: dict[str, str | None] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "config_layout": self.config.config_layout,
            "weight_layout": self.weight_layout,
            "rope_layout": self.rope_layout,
            "parameters": self.parameter_counts,
            "checkpoint_bytes": self.checkpoint_bytes,
            "config": self.config.summary(),
            "tensor_types": self.tensor_types,
            "quantization": self.quantization,
            "chat_template": self.chat_template,
            "video_unsupported_reason": self.config.video_unsupported_reason,
            "warnings": self.warnings,
        }


def inspect_checkpoint(
    checkpoint: str | os.PathLike,
    model_factory: Any,
    tokenizer_factory: Callable[[OpenedCheckpoint, ModelConfig], Any],
    *,
    mmproj: str | os.PathLike | None = None,
    allow_pickle: bool = False,
    chat_template: str | os.PathLike | None = None,
) -> CheckpointReport:
    """Validate config, weight plan, preprocessor configs, tokenizer, generation config and chat template
    (`chat_template`, a file, in place of the checkpoint's) exactly as loading and serving would, and count
    parameters per part. The report's warnings are the config's and inspect's own, then those Glimmer logged while
    reading the checkpoint (a tokenizer or generation config that loads with a caveat).

    model_factory(config) must build the model (on the meta device) whose parameters are expected;
    tokenizer_factory(opened, config) must load the checkpoint's tokenizer as the engine does and check that it
    fits the config (anything with `token_to_id` and `eos_token_id`). Raises ConfigError / CheckpointError like
    loading does.
    """
    # the caveats a loader only logs (a tokenizer or generation config that loads with one), for the report
    with captured_warnings("glimmer") as logged:
        report = _inspect(checkpoint, model_factory, tokenizer_factory, mmproj, allow_pickle, chat_template)
    report.warnings += [message for message in dict.fromkeys(logged) if message not in report.warnings]
    return report


def _inspect(checkpoint: str | os.PathLike, model_factory: Any,
             tokenizer_factory: Callable[[OpenedCheckpoint, ModelConfig], Any], mmproj: str | os.PathLike | None,
             allow_pickle: bool, chat_template: str | os.PathLike | None) -> CheckpointReport:
    config_only = is_config_only(checkpoint)
    opened = open_checkpoint(checkpoint, mmproj=mmproj, allow_pickle=allow_pickle, weights=not config_only)
    if config_only:  # the parameters are counted from the config, as `--load-format dummy` would draw them
        config, file_format, layout = opened.config, CONFIG_ONLY, "none"
        expected = expected_parameters(model_factory(config), config)
    else:
        file_format, layout = opened.format, opened.stored_layout or opened.weight_layout
        config = untie_if_lm_head_stored(drop_vision_if_absent(opened.config, opened.tensors, opened.weight_layout),
                                         opened.tensors, opened.weight_layout)
        expected = expected_parameters(model_factory(config), config)
        plan_weights(config, opened.tensors, expected, opened.weight_layout)
    if config.vision is not None:
        checkpoint_media_settings(opened.path, config.vision, opened.preprocessor_config)
    tokenizer = tokenizer_factory(opened, config)
    embedded = opened.tokenizer.generation_config if opened.tokenizer is not None else None
    load_generation_defaults(opened.path, config.text, tokenizer.token_to_id, embedded=embedded,
                             tokenizer_eos_id=tokenizer.eos_token_id, id_to_token=tokenizer.id_to_token)
    warnings = list(config.warnings)
    if config_only:
        warnings.append(f"no weights: {opened.path} holds a config only (as `glimmer make-tiny --config-only` "
                        f"writes); run it with random weights: glimmer serve {opened.path} --load-format dummy")
    template = _checked_chat_template(opened, tokenizer, chat_template, warnings)
    counts: dict[str, int] = {}
    for label, prefix in PARAMETER_GROUPS:
        n = sum(_numel(shape) for name, shape in expected.items() if name.startswith(prefix))
        if n:
            counts[label] = n
    counts["total"] = sum(_numel(shape) for shape in expected.values())
    return CheckpointReport(
        config=config,
        format=file_format,
        weight_layout=layout,
        rope_layout=opened.rope_layout,
        parameter_counts=counts,
        checkpoint_bytes=opened.tensors.total_bytes if opened.tensors is not None else 0,
        warnings=warnings,
        tensor_types=opened.tensor_types,
        quantization=opened.quantization,
        chat_template=template,
    )


def _checked_chat_template(opened: OpenedCheckpoint, tokenizer: Any, override: str | os.PathLike | None,
                           warnings: list[str]) -> dict[str, str | None]:
    """The template `glimmer serve` would render with, compiled and probed as the server does at start
    (ChatTemplateError, ConfigError or CheckpointError otherwise): its origin and sha256. A checkpoint without a
    template (a base model) gets a warning instead: it completes text, and only chat needs a template."""
    try:
        source = find_checkpoint_chat_template(opened.path, override, opened.tokenizer)
    except CheckpointError as error:
        if override is not None:
            raise
        warnings.append(f"no chat template: {error}")
        return {"origin": None, "sha256": None, "warning": warnings[-1]}
    source.probed(tokenizer)
    return {"origin": source.origin, "sha256": source.sha256}


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
