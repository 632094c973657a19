"""A foreign checkpoint's tensors under canonical names, each produced on demand.

GGUF, MLX and pickle readers hand the loader this object instead of a `SafetensorsCheckpoint`: the same
`tensors` / `names()` / `read()` interface, but every name is already canonical (the names of
`glimmer.model`) and `read` returns the canonical float tensor — dequantized, un-permuted, with folded
norm offsets removed. The weight planner then loads it with the identity (canonical) layout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from glimmer.checkpoint.safetensors_files import TensorInfo


@dataclass(frozen=True)
class MappedTensor:
    """`info` describes what the entry reads (canonical name and shape; dtype F32, F16 or BF16). `read()` gives it on
    the host; an entry that computes it from smaller stored tensors (NVFP4 weights) gives `read_on(device)`, which
    computes it on `device` instead, with the same bits."""

    info: TensorInfo
    read: Callable[[], torch.Tensor] | None = None
    read_on: Callable[[torch.device | str], torch.Tensor] | None = None

    def __post_init__(self) -> None:
        if (self.read is None) == (self.read_on is None):
            raise ValueError(f"MappedTensor {self.info.name}: give read or read_on, exactly one")


class MappedTensors:
    def __init__(self, path: Path, entries: dict[str, MappedTensor], total_bytes: int):
        self.directory = path
        self._entries = entries
        self.tensors = {name: entry.info for name, entry in entries.items()}
        self.total_bytes = total_bytes

    def names(self) -> list[str]:
        return list(self._entries)

    def read(self, name: str, device: torch.device | str = "cpu") -> torch.Tensor:
        """The tensor; an entry that computes it does so on `device` (where the loader puts it), the others return
        it on the host."""
        entry = self._entries[name]
        return entry.read() if entry.read_on is None else entry.read_on(device)

    def read_many(self, names: list[str]) -> dict[str, torch.Tensor]:
        return {name: self.read(name) for name in names}
