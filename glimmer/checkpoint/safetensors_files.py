"""Lazy, memory-mapped access to a checkpoint's safetensors files, single or sharded.

Only headers are read up front (names, shapes, dtypes). Tensors are read one at a time when the loader
asks for them, so peak memory while loading stays near the size of the model being filled. Every lookup
goes through the index's `weight_map` when there is one: published checkpoints put tensors that belong
together into different shards (architecture.md §15.2). A `model.safetensors` beside an index that does not
name it is refused: one of the two is another checkpoint's, and reading either could be the wrong model.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath

import torch
from safetensors import safe_open

from glimmer.errors import CheckpointError

logger = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str
    file: Path
    stored_name: str | None = None  # the file's own name, where a reader renamed it (GGUF's blk.2.ffn_up.weight)


# buffers older Hugging Face exports saved with the weights; transformers ignores them on load, and Glimmer
# computes the RoPE frequencies from the config (rope_theta, head_dim) as the reference does
_IGNORED_BUFFER = re.compile(r"(.*\.)?rotary_emb\.inv_freq")


def is_ignored_buffer(name: str) -> bool:
    """A saved buffer that is not a weight (`…rotary_emb.inv_freq`), skipped with a debug log."""
    return _IGNORED_BUFFER.fullmatch(name) is not None


def shard_path(directory: Path, index_path: Path, shard: object) -> Path:
    """The file an index's weight_map names, which must lie inside the checkpoint directory: an index that
    points elsewhere ("../../x.safetensors", "/abs/x") would load another checkpoint's weights unnoticed.
    Checked on the name, not the resolved path, so symlinked shards (the Hugging Face cache's blobs) still load.
    Raises CheckpointError."""
    if not isinstance(shard, str) or not shard:
        raise CheckpointError(f"{index_path} names shard {shard!r}; expected a file name")
    relative = PurePosixPath(shard.replace("\\", "/"))
    if relative.is_absolute() or PureWindowsPath(shard).is_absolute() or ".." in relative.parts:
        raise CheckpointError(f"{index_path} names shard {shard!r}, outside the checkpoint directory {directory}; "
                              "an index may only name files inside its directory")
    return directory / relative


class SafetensorsCheckpoint:
    """The tensors of one checkpoint directory, by name."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self.tensors: dict[str, TensorInfo] = {}
        for file, names in self._files_and_names().items():
            try:
                with safe_open(file, framework="pt") as handle:
                    present = set(handle.keys())
                    for name in names if names is not None else sorted(present):
                        if is_ignored_buffer(name):
                            logger.debug("%s: ignoring %s, a buffer the model recomputes", file, name)
                            continue
                        if name not in present:
                            raise CheckpointError(
                                f"{self.directory / INDEX_FILE} maps {name!r} to {file.name}, "
                                "but that shard does not contain it; the index and the shards disagree"
                            )
                        sliced = handle.get_slice(name)
                        self._add(TensorInfo(name, tuple(sliced.get_shape()), sliced.get_dtype(), file))
            except CheckpointError:
                raise
            except Exception as exc:  # safetensors raises several unrelated types for a damaged file
                raise CheckpointError(f"cannot read safetensors file {file}: {exc}") from exc

    def _add(self, info: TensorInfo) -> None:
        if info.name in self.tensors:
            raise CheckpointError(
                f"tensor {info.name!r} appears in both {self.tensors[info.name].file.name} and {info.file.name}"
            )
        self.tensors[info.name] = info

    def _files_and_names(self) -> dict[Path, list[str] | None]:
        """Shard path → the names the index assigns to it (None: every tensor in the file)."""
        index_path = self.directory / INDEX_FILE
        if index_path.is_file():
            try:
                weight_map = json.loads(index_path.read_text())["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise CheckpointError(f"{index_path} is not a valid safetensors index: {exc}") from exc
            if not isinstance(weight_map, dict):
                raise CheckpointError(f"{index_path} is not a valid safetensors index: weight_map is not an object")
            by_file: dict[Path, list[str]] = {}
            for name, shard in weight_map.items():
                path = shard_path(self.directory, index_path, shard)
                if not path.is_file():
                    raise CheckpointError(f"{index_path} names shard {shard!r}, which does not exist")
                by_file.setdefault(path, []).append(name)
            single = self.directory / SINGLE_FILE
            if single.is_file() and single not in by_file:
                # two checkpoints' weights in one directory (one written over the other): reading either could
                # silently be the wrong model
                shards = ", ".join(sorted(p.name for p in by_file))
                raise CheckpointError(
                    f"{self.directory} holds both {SINGLE_FILE} and {INDEX_FILE}, whose shards ({shards}) do not "
                    f"include it: the weights of two checkpoints; remove the stale ones ({SINGLE_FILE}, or the "
                    "index and its shards)"
                )
            return dict(by_file)
        if (self.directory / SINGLE_FILE).is_file():
            return {self.directory / SINGLE_FILE: None}
        files = sorted(self.directory.glob("*.safetensors"))
        if not files:
            raise CheckpointError(
                f"no weights found in {self.directory}: expected {SINGLE_FILE}, {INDEX_FILE} with its shards, "
                f"or *.safetensors files{self._config_only_hint()}"
            )
        return dict.fromkeys(files)

    def _config_only_hint(self) -> str:
        """A directory with a config but no weights (`glimmer make-tiny --config-only`) runs with random weights."""
        if not (self.directory / "config.json").is_file():
            return ""
        return ("; to run this config with random weights, pass --load-format dummy (glimmer serve / chat; "
                "LLM(..., load_format=\"dummy\"))")

    def names(self) -> list[str]:
        return list(self.tensors)

    def read(self, name: str) -> torch.Tensor:
        """Read one tensor from its shard (memory-mapped; the returned tensor owns a copy)."""
        info = self.tensors[name]
        with safe_open(info.file, framework="pt") as handle:
            return handle.get_tensor(name)

    def read_many(self, names: list[str]) -> dict[str, torch.Tensor]:
        """Read several tensors, opening each shard once."""
        by_file: dict[Path, list[str]] = {}
        for name in names:
            by_file.setdefault(self.tensors[name].file, []).append(name)
        out: dict[str, torch.Tensor] = {}
        for file, file_names in by_file.items():
            with safe_open(file, framework="pt") as handle:
                for name in file_names:
                    out[name] = handle.get_tensor(name)
        return out

    @property
    def total_bytes(self) -> int:
        return sum(f.stat().st_size for f in {t.file for t in self.tensors.values()})
