"""The embedded default model: the tiny random checkpoint `glimmer make-tiny` writes, kept in the user cache.

`glimmer serve` and `glimmer chat` without a MODEL use it, so a fresh install serves at once (its output is
noise: every weight is random). It is written once per Glimmer version, atomically: into a temporary
directory next to its final place, then renamed, so a crash or a concurrent first start never leaves half a
checkpoint behind.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

import glimmer
from glimmer.errors import CheckpointError

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "glimmer-tiny-demo"


def cache_dir() -> Path:
    """`$XDG_CACHE_HOME/glimmer`, else `~/.cache/glimmer`."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "glimmer"


def default_model_dir() -> Path:
    """The default checkpoint's directory, written on first use. Raises CheckpointError if it cannot be."""
    target = cache_dir() / glimmer.__version__ / DEFAULT_MODEL_NAME
    if (target / "config.json").is_file():
        return target
    from glimmer.tiny import write_tiny_checkpoint

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL_NAME}-", dir=target.parent))
    except OSError as exc:
        raise CheckpointError(f"cannot write the default model under {target.parent}: {exc}; "
                              "set XDG_CACHE_HOME to a writable directory or pass a MODEL") from exc
    try:
        logger.info("writing the default tiny model to %s (once)", target)
        write_tiny_checkpoint(scratch)
        os.rename(scratch, target)
    except OSError:
        if not (target / "config.json").is_file():  # not a concurrent first start that won the rename
            raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target
