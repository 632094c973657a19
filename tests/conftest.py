"""Shared fixtures: tiny random checkpoints written once per session into a temporary directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from glimmer.tiny import TinySpec, write_tiny_checkpoint

DEFAULT_SPEC = TinySpec()


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` (kernels, CUDA graphs) run only where a CUDA GPU is present."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def make_tiny(tmp_path_factory):
    """make_tiny(layout="canonical", vision=False, seed=0, spec=TinySpec(), num_shards=1) -> Path, cached."""
    cache: dict[tuple, Path] = {}

    def make(layout: str = "canonical", *, vision: bool = False, seed: int = 0, spec: TinySpec = DEFAULT_SPEC,
             num_shards: int = 1) -> Path:
        key = (layout, vision, seed, spec, num_shards)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"tiny-{layout}")
            cache[key] = write_tiny_checkpoint(out, layout=layout, vision=vision, seed=seed, spec=spec,
                                               num_shards=num_shards)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def tiny_checkpoint(make_tiny) -> Path:
    """The default tiny text checkpoint (canonical layout)."""
    return make_tiny()
