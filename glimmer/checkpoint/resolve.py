"""Turn what a user typed as the model (a directory, a GGUF file or a Hugging Face Hub id) into a local path."""

from __future__ import annotations

import os
import re
from pathlib import Path

from glimmer.checkpoint.broken_links import broken_link_problem, is_broken_link
from glimmer.checkpoint.gguf_file import is_gguf_path
from glimmer.default_model import DEFAULT_MODEL_NAME, embedded_model_dir
from glimmer.errors import CheckpointError

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
_HUB_FILES = ["*.json", "*.jinja", "*.txt", "*.model", "*.tiktoken"]
_HUB_WEIGHTS = ["*.safetensors"]
_HUB_DRAFTER_WEIGHTS = ["*.safetensors", "head.pt"]  # the HF export, or the vendor's native head.pt


def resolve_checkpoint(model: str | os.PathLike, *, revision: str | None = None, weights: bool = True) -> Path:
    """A local checkpoint directory (or GGUF file) for `model`.

    A directory or a GGUF file that exists is used as it is. The names of the embedded models (`glimmer-nano`,
    `glimmer-nano-dflash`, the names the server reports) are those models. Otherwise a Hub id (`owner/name`) is
    downloaded (or found in the local Hugging Face cache); with `weights=False` only its config, tokenizer and
    template files are. Raises CheckpointError saying what was tried and how to fix it.
    """
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    embedded = embedded_model_dir(str(model))
    if embedded is not None:
        return embedded
    if path.exists():
        if is_gguf_path(path):
            return path
        raise CheckpointError(f"model path {path} is a file but not a GGUF file; pass the checkpoint directory "
                              "that holds config.json, or a .gguf file")
    if is_broken_link(path):
        raise CheckpointError(f"model path {path} {broken_link_problem(path)}")
    text = str(model)
    if not is_hub_id(text):
        raise CheckpointError(f"model {text!r} is neither an existing directory nor a Hugging Face Hub id "
                              f"(owner/name), nor {DEFAULT_MODEL_NAME!r} (the embedded model)")
    return _download(text, revision, _HUB_FILES + (_HUB_WEIGHTS if weights else []))


def is_hub_id(text: str) -> bool:
    """Whether `text` has the shape of a Hugging Face Hub model id (owner/name)."""
    return bool(_HUB_ID.match(text))


def download_drafter(hub_id: str, *, weights: bool = True) -> Path:
    """The local directory of the DFlash drafter `hub_id` (owner/name): its config and weights (safetensors, or
    the vendor's native head.pt; with `weights=False` the config alone) downloaded, or found in the local Hugging
    Face cache. Raises CheckpointError."""
    return _download(hub_id, None, _HUB_FILES + (_HUB_DRAFTER_WEIGHTS if weights else []))


def _download(text: str, revision: str | None, patterns: list[str]) -> Path:
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError as exc:  # pragma: no cover - huggingface_hub is a dependency
        raise CheckpointError(f"cannot resolve Hub id {text!r}: huggingface_hub is not installed") from exc
    try:
        return Path(snapshot_download(text, revision=revision, allow_patterns=patterns))
    except LocalEntryNotFoundError as exc:
        raise CheckpointError(
            f"model {text!r} is not a local directory and could not be downloaded from the Hugging Face Hub "
            "(offline, or HF_HUB_OFFLINE is set, and it is not in the local cache); download it first, "
            "e.g. `hf download " + text + "`, and pass the directory"
        ) from exc
    except Exception as exc:  # network, auth, missing repo: the hub client raises many types
        raise CheckpointError(f"could not download {text!r} from the Hugging Face Hub: {exc}") from exc

