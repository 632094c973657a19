"""A foreign checkpoint's tensors under canonical names, each produced on demand.

GGUF, MLX and pickle readers hand the loader this object instead of a `SafetensorsCheckpoint`: the same
`tensors` / `names()` / `read()` interface, but every name is already canonical (the names of
`glimmer.model`) and `read` returns the canonical float tensor — dequantized, un-permuted, with folded
norm offsets removed. The weight planner then loads it with the identity (canonical) layout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from glimmer.checkpoint.safetensors_files import SafetensorsCheckpoint, TensorInfo


@dataclass(frozen=True)
class MappedTensor:
    """`info` describes what the entry reads (canonical name and shape; dtype F32, F16 or BF16). `read()` gives it on
    the host; an entry that computes it from smaller stored tensors (NVFP4 weights) gives `read_on(device)`, which
    computes it on `device` instead, with the same bits. An entry computed from several stored tensors (a quantized
    weight from its codes and scales) may give `trace()`: which of them holds a NaN or an infinity, in words naming it
    as its file does (`non_finite_part`), asked only when the computed tensor is not finite."""

    info: TensorInfo
    read: Callable[[], torch.Tensor] | None = None
    read_on: Callable[[torch.device | str], torch.Tensor] | None = None
    trace: Callable[[], str | None] | None = None

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

    def trace_non_finite(self, name: str) -> str | None:
        """For a tensor found not finite: the stored tensor it is computed from that holds the NaN or infinity, in
        words (`MappedTensor.trace`), or None where the entry is stored as one tensor (`info.stored_name` names it)."""
        entry = self._entries[name]
        return entry.trace() if entry.trace is not None else None


def non_finite_counts(values: torch.Tensor) -> str:
    """How many of `values` are not finite, in the words every refusal of a damaged tensor uses: "N NaN and M
    infinite value(s) among K"."""
    return (f"{int(torch.isnan(values).sum())} NaN and {int(torch.isinf(values).sum())} infinite value(s) among "
            f"{values.numel()}")


def non_finite_part(files: SafetensorsCheckpoint, names: Sequence[str]) -> str | None:
    """The first of the stored tensors `names` (a quantized weight's scales) that holds a NaN or an infinity, as
    "'M.weight_scale' (in FILE), which holds 1 NaN and 0 infinite value(s) among 512"; None if all are finite."""
    for name in names:
        values = files.read(name).float()
        if not bool(torch.isfinite(values).all()):
            return f"{name!r} (in {files.tensors[name].file}), which holds {non_finite_counts(values)}"
    return None
