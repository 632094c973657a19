"""What `glimmer inspect` reports about a checkpoint, computed without loading any weight data."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from glimmer.checkpoint.config import ModelConfig
from glimmer.checkpoint.config_layouts import load_config
from glimmer.checkpoint.safetensors_files import SafetensorsCheckpoint
from glimmer.checkpoint.weight_layouts import ROPE_LAYOUT, detect_weight_layout
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
    weight_layout: str
    rope_layout: str
    parameter_counts: dict[str, int]
    checkpoint_bytes: int
    warnings: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {
            "config_layout": self.config.config_layout,
            "weight_layout": self.weight_layout,
            "rope_layout": self.rope_layout,
            "parameters": self.parameter_counts,
            "checkpoint_bytes": self.checkpoint_bytes,
            "config": self.config.summary(),
            "warnings": self.warnings,
        }


def inspect_checkpoint(checkpoint_dir: str | os.PathLike, model_factory: Any) -> CheckpointReport:
    """Validate config and weight plan exactly as loading would, and count parameters per part.

    model_factory(config) must build the model (on the meta device) whose parameters are expected.
    Raises ConfigError / CheckpointError like loading does.
    """
    config = load_config(checkpoint_dir)
    files = SafetensorsCheckpoint(checkpoint_dir)
    layout = detect_weight_layout(files.names())
    config = drop_vision_if_absent(config, files, layout)
    model = model_factory(config)
    expected = expected_parameters(model, config)
    plan_weights(config, files, expected, layout)
    counts: dict[str, int] = {}
    for label, prefix in PARAMETER_GROUPS:
        n = sum(_numel(shape) for name, shape in expected.items() if name.startswith(prefix))
        if n:
            counts[label] = n
    counts["total"] = sum(_numel(shape) for shape in expected.values())
    return CheckpointReport(
        config=config,
        weight_layout=layout,
        rope_layout=ROPE_LAYOUT[layout],
        parameter_counts=counts,
        checkpoint_bytes=files.total_bytes,
        warnings=list(config.warnings),
    )


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
