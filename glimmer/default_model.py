"""The embedded default model: glimmer-nano and its DFlash drafter, shipped inside the package.

`glimmer serve` and `glimmer chat` without a MODEL serve glimmer-nano: a small Muse Glimmer (the real
architecture) trained by `python -m glimmer.train_nano` on synthetic conversations in which an assistant
reasons, calls the tools it is given and answers from their results. It picks among the declared tools by
walking their declarations in its reasoning, calls one with typed arguments and answers with the result's
values (README: "The embedded model"), and it knows little else. Its files sit in `glimmer/embedded/` and
are read in place: nothing is written at startup.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from glimmer.errors import CheckpointError

DEFAULT_MODEL_NAME = "glimmer-nano"
DEFAULT_DRAFTER_NAME = "glimmer-nano-dflash"
EMBEDDED_FOLDER = "embedded"
DEFAULT_MODEL_BLURB = ("this is the embedded demo model glimmer-nano, a small Muse Glimmer trained on synthetic "
                       "tool-use conversations: it calls tools like those it was trained on (weather, time, stocks, "
                       "timers, ...) asked for in its corpus's words, answers from their results, and knows little "
                       "else.")


def _embedded(name: str, required: str) -> Path:
    path = Path(str(resources.files("glimmer").joinpath(EMBEDDED_FOLDER, name)))
    if not (path / required).is_file():
        raise CheckpointError(f"the embedded model {name} is missing from this installation ({path / required} not "
                              "found); reinstall glimmer, or pass a MODEL")
    return path


def default_model_dir() -> Path:
    """The directory of the embedded target checkpoint. Raises CheckpointError if the install lacks it."""
    return _embedded(DEFAULT_MODEL_NAME, "model.safetensors")


def default_drafter_dir() -> Path:
    """The directory of the embedded DFlash drafter. Raises CheckpointError if the install lacks it."""
    return _embedded(DEFAULT_DRAFTER_NAME, "model.safetensors")


_EMBEDDED_MODEL_DIRS = {DEFAULT_MODEL_NAME: default_model_dir, DEFAULT_DRAFTER_NAME: default_drafter_dir}
EMBEDDED_MODEL_NAMES = frozenset(_EMBEDDED_MODEL_DIRS)
"""The names that stand for the embedded models (the names the server reports)."""


def embedded_model_dir(name: str) -> Path | None:
    """The directory of the embedded model called `name` (the names the server reports), None for other names."""
    find = _EMBEDDED_MODEL_DIRS.get(name)
    return find() if find is not None else None


def model_location(model: str | os.PathLike) -> Path:
    """Where a local `model` is read from: an existing directory, else the embedded model of that name
    (`glimmer-nano`), else the path as written (`~` expanded). Raises CheckpointError if the install lacks the
    embedded model named."""
    path = Path(model).expanduser()
    embedded = None if path.is_dir() else embedded_model_dir(str(model))
    return embedded if embedded is not None else path
