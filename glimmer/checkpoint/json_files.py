"""Reading the small JSON files of a checkpoint directory, with errors that name the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from glimmer.checkpoint.broken_links import refuse_lfs_pointer, refuse_not_a_file
from glimmer.errors import ConfigError, GlimmerError


def read_json_object(path: Path, *, error: type[GlimmerError] = ConfigError) -> dict[str, Any] | None:
    """The JSON object in `path`, or None when the file does not exist.

    Raises `error` naming the file when it is unreadable, not JSON, or not an object, or a broken link or a
    directory (neither taken as absent: the checkpoint would go on without what it says).
    """
    refuse_not_a_file(path, error)
    if not path.is_file():
        return None
    refuse_lfs_pointer(path, error)  # else "not valid JSON: Expecting value: line 1 column 1"
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:  # ValueError: JSONDecodeError, and an
        # integer of over 4,300 digits; RecursionError: arrays nested past Python's recursion limit
        raise error(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise error(f"{path} must hold a JSON object, not {type(value).__name__}")
    return value
