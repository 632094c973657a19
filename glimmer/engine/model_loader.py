"""Build a Muse Glimmer model from a checkpoint directory: config, strict weight plan, fill."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

from glimmer.checkpoint.config import ModelConfig
from glimmer.checkpoint.config_layouts import load_config
from glimmer.checkpoint.safetensors_files import SafetensorsCheckpoint
from glimmer.checkpoint.weight_layouts import detect_weight_layout
from glimmer.checkpoint.weights import drop_vision_if_absent, expected_parameters, fill_parameters, plan_weights
from glimmer.model.muse_glimmer import MuseGlimmerForConditionalGeneration

logger = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    model: MuseGlimmerForConditionalGeneration
    config: ModelConfig
    weight_layout: str


def load_model(
    checkpoint_dir: str | os.PathLike,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    progress: bool = True,
) -> LoadedModel:
    """Load and validate a checkpoint; raises ConfigError or CheckpointError naming what is wrong."""
    config = load_config(checkpoint_dir)
    files = SafetensorsCheckpoint(checkpoint_dir)
    layout = detect_weight_layout(files.names())
    config = drop_vision_if_absent(config, files, layout)
    with torch.device("meta"):
        model = MuseGlimmerForConditionalGeneration(config).to(dtype)
    plan = plan_weights(config, files, expected_parameters(model, config), layout)
    model = model.to_empty(device=device)
    fill_parameters(model, plan, files, progress=progress)
    if config.text.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.eval().requires_grad_(False)
    logger.info("loaded %s (%s weights, %s config) on %s as %s", checkpoint_dir, layout, config.config_layout,
                device, dtype)
    return LoadedModel(model=model, config=config, weight_layout=layout)
