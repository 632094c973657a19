"""What `glimmer inspect` reports about a checkpoint, computed without loading any weight data."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from glimmer.checkpoint.config import ModelConfig
from glimmer.checkpoint.formats import OpenedCheckpoint, open_checkpoint
from glimmer.checkpoint.generation_config import load_generation_defaults
from glimmer.checkpoint.weights import drop_vision_if_absent, expected_parameters, plan_weights

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
    weight_layout: str
    rope_layout: str
    parameter_counts: dict[str, int]
    checkpoint_bytes: int
    warnings: list[str]
    # GGUF / MLX storage types → tensor count (None for safetensors and pickle weights)
    tensor_types: dict[str, int] | None = None

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
) -> CheckpointReport:
    """Validate config, weight plan, tokenizer and generation config exactly as loading would, and count
    parameters per part.

    model_factory(config) must build the model (on the meta device) whose parameters are expected;
    tokenizer_factory(opened, config) must load the checkpoint's tokenizer as the engine does and check that it
    fits the config (anything with `token_to_id`). Raises ConfigError / CheckpointError like loading does.
    """
    opened = open_checkpoint(checkpoint, mmproj=mmproj, allow_pickle=allow_pickle)
    layout = opened.weight_layout
    config = drop_vision_if_absent(opened.config, opened.tensors, layout)
    model = model_factory(config)
    expected = expected_parameters(model, config)
    plan_weights(config, opened.tensors, expected, layout)
    tokenizer = tokenizer_factory(opened, config)
    embedded = opened.tokenizer.generation_config if opened.tokenizer is not None else None
    load_generation_defaults(opened.path, config.text, tokenizer.token_to_id, embedded=embedded)
    counts: dict[str, int] = {}
    for label, prefix in PARAMETER_GROUPS:
        n = sum(_numel(shape) for name, shape in expected.items() if name.startswith(prefix))
        if n:
            counts[label] = n
    counts["total"] = sum(_numel(shape) for shape in expected.values())
    return CheckpointReport(
        config=config,
        format=opened.format,
        weight_layout=layout,
        rope_layout=opened.rope_layout,
        parameter_counts=counts,
        checkpoint_bytes=opened.tensors.total_bytes,
        warnings=list(config.warnings),
        tensor_types=opened.tensor_types,
    )


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
