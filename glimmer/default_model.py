"""The embedded default model: the tiny random checkpoint `glimmer make-tiny` writes, kept in the user cache.

`glimmer serve` and `glimmer chat` without a MODEL use it, so a fresh install serves at once (its output is
noise: every weight is random). It is written once per Glimmer version, atomically: into a temporary
directory next to its final place, then renamed, so a crash never leaves half a checkpoint behind. Writers
take a lock on the cache directory, so a concurrent first start waits and then finds the model, and the next
start removes the temporary directory of a start that was killed while writing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import glimmer
from glimmer.errors import CheckpointError

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; stale directories are then recognized by age
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "glimmer-tiny-demo"
_SCRATCH_PREFIX = f".{DEFAULT_MODEL_NAME}-"
_UNLOCKED_STALE_AGE_S = 3600.0


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
        with _exclusive(target.parent):
            if (target / "config.json").is_file():  # a concurrent first start wrote it while we waited
                return target
            _remove_stale_scratch(target.parent)
            scratch = Path(tempfile.mkdtemp(prefix=_SCRATCH_PREFIX, dir=target.parent))
            try:
                logger.info("writing the default tiny model to %s (once)", target)
                write_tiny_checkpoint(scratch)
                os.rename(scratch, target)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
    except OSError as exc:
        raise CheckpointError(f"cannot write the default model under {target.parent}: {exc}; "
                              "set XDG_CACHE_HOME to a writable directory or pass a MODEL") from exc
    return target


@contextlib.contextmanager
def _exclusive(directory: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on `directory` (a no-op where there are none)."""
    if fcntl is None:
        yield
        return
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # closing releases the lock


def _remove_stale_scratch(directory: Path) -> None:
    """Remove temporary directories of writers that died: under the lock no live writer has one (without
    locks, only those older than an hour are taken for dead)."""
    for leftover in directory.glob(f"{_SCRATCH_PREFIX}*"):
        if fcntl is None and time.time() - leftover.stat().st_mtime < _UNLOCKED_STALE_AGE_S:
            continue
        logger.info("removing %s, left by an interrupted first start", leftover)
        shutil.rmtree(leftover, ignore_errors=True)
