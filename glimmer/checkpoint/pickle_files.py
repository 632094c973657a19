"""PyTorch pickle weights (`*.bin`, `*.pt`), read only when the user allows it and only as plain tensors.

Unpickling can run arbitrary code, so a checkpoint that ships only pickle files is refused unless the user
passes `--allow-pickle` (`LLM(..., allow_pickle=True)`), and even then every file goes through
`torch.load(weights_only=True)`, whose restricted unpickler admits tensors and plain containers only.
The files are memory-mapped where torch can (the zip format); names are read up front, data on demand.
"""

from __future__ import annotations

import fnmatch
import logging
import pickle
import re
from pathlib import Path
from typing import Any

import torch

from glimmer.checkpoint.broken_links import (
    broken_link_problem,
    is_broken_link,
    refuse_lfs_pointer,
)
from glimmer.checkpoint.safetensors_files import (
    TensorInfo,
    is_ignored_buffer,
    read_weight_map_if_present,
    shard_path,
)
from glimmer.errors import CheckpointError

logger = logging.getLogger(__name__)

PICKLE_INDEX_FILE = "pytorch_model.bin.index.json"
PICKLE_PATTERNS = ("*.bin", "*.pt", "*.pth")
# safetensors' dtype names, for the tensors read from pickle files (a model's, a native drafter's)
DTYPE_NAMES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64"}
# wrappers some exporters put around the state dict (the native vendor shards nest it under "weights", §5.1)
_WRAPPER_KEYS = ("state_dict", "weights", "model")
# the training state transformers' Trainer saves beside the weights of a fine-tuned model (save_model's
# training_args.bin) and in its checkpoint-N folders (optimizer, scheduler, grad scaler, RNG states): no weights of
# the model, and training_args.bin is a pickled TrainingArguments object that weights_only refuses. transformers
# and vLLM leave them out of a model's weights too
TRAINING_STATE_PATTERNS = ("training_args.bin", "optimizer.bin", "optimizer.pt", "scheduler.pt", "scaler.pt",
                           "rng_state*.pth")


def is_training_state(path: Path) -> bool:
    """Whether `path` is a file of the training state Trainer saves (TRAINING_STATE_PATTERNS), not weights."""
    return any(fnmatch.fnmatchcase(path.name, pattern) for pattern in TRAINING_STATE_PATTERNS)


def pickle_files(directory: Path) -> list[Path]:
    """The pickle weight files of a directory (an index's shards when there is one)."""
    index = directory / PICKLE_INDEX_FILE
    weight_map = read_weight_map_if_present(index)
    if weight_map is not None:
        shards = sorted({shard_path(directory, index, shard) for shard in weight_map.values()})
    else:
        found = sorted(p for pattern in PICKLE_PATTERNS for p in directory.glob(pattern) if p.is_file() or
                       is_broken_link(p))
        shards, training_state = [], []
        for p in found:
            (training_state if is_training_state(p) else shards).append(p)
        if training_state:
            logger.info("%s: leaving out %s: training state saved beside the weights, not weights", directory,
                        ", ".join(p.name for p in training_state))
    for shard in shards:  # each would be read: without it the checkpoint is short of its tensors
        if is_broken_link(shard):
            raise CheckpointError(f"{shard}, a file of the checkpoint, {broken_link_problem(shard)}")
    return shards


class PickleCheckpoint:
    """The tensors of a directory's pickle files, by name (the same interface as SafetensorsCheckpoint)."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.tensors: dict[str, TensorInfo] = {}
        self._state: dict[Path, dict[str, torch.Tensor]] = {}
        for file in pickle_files(directory):
            state = _load(file)
            self._state[file] = state
            for name, tensor in state.items():
                if is_ignored_buffer(name):
                    logger.debug("%s: ignoring %s, a buffer the model recomputes", file, name)
                    continue
                if name in self.tensors:
                    raise CheckpointError(f"tensor {name!r} appears in both {self.tensors[name].file.name} and "
                                          f"{file.name}")
                dtype = DTYPE_NAMES.get(tensor.dtype, str(tensor.dtype))
                self.tensors[name] = TensorInfo(name, tuple(tensor.shape), dtype, file)

    def names(self) -> list[str]:
        return list(self.tensors)

    def read(self, name: str, device: torch.device | str = "cpu") -> torch.Tensor:
        """On the host whatever `device` the caller puts it on: a stored tensor needs no computing there."""
        return self._state[self.tensors[name].file][name].clone()

    def read_many(self, names: list[str]) -> dict[str, torch.Tensor]:
        return {name: self.read(name) for name in names}

    @property
    def total_bytes(self) -> int:
        return sum(f.stat().st_size for f in self._state)


# how a file torch.load(weights_only=True) reads begins: the zip archive torch.save writes, or its legacy format's
# pickle stream, whose PROTO opcode and protocol (2, torch.save's default, to 5) come first; a legacy file of protocol
# 0 or 1 (no PROTO) is one the restricted unpickler refuses anyway
_TORCH_FILE_STARTS = (b"PK\x03\x04", *(bytes([0x80, protocol]) for protocol in range(2, 6)))


def _refuse_not_a_torch_file(file: Path) -> None:
    """Raise CheckpointError naming `file` when it is empty or does not begin as a file torch.save writes (an HTML
    error page or a text saved in its place, another format's file): torch's restricted unpickler would call it
    "Unsupported operand 60", as if it held code, or fail with a bare KeyError. An unreadable file is left to the
    reader to name."""
    try:
        with file.open("rb") as handle:
            head = handle.read(16)
    except OSError:
        return
    if not head:
        raise CheckpointError(f"{file} is empty (0 bytes): a download cut short; download it again")
    if not head.startswith(_TORCH_FILE_STARTS):
        raise CheckpointError(
            f"{file} is not a PyTorch weights file: it begins {head!r}, where torch.save writes a zip archive "
            "(b'PK\\x03\\x04') or a pickle stream (b'\\x80\\x02'); another format's file, or a page or a download cut "
            "short saved in its place: download it again")


def load_weights_only(file: Path) -> Any:
    """What `torch.load(weights_only=True)` reads from `file`, memory-mapped where its format allows (the zip
    format; the legacy one is read whole). Raises CheckpointError for a Git LFS pointer, an empty file or one that
    is no torch file, and for an object the restricted unpickler refuses (naming it); any other failure (a truncated
    file) is raised as torch raised it, for the caller to word."""
    refuse_lfs_pointer(file)  # else "refused by torch.load(weights_only=True)", as if it ran code
    _refuse_not_a_torch_file(file)  # likewise, or a bare KeyError
    try:
        try:
            return torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            return torch.load(file, map_location="cpu", weights_only=True)  # the legacy (non-zip) format
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{file}: refused by torch.load(weights_only=True), which only admits tensors and plain containers: "
            f"{unpickling_refusal(exc)}"
        ) from None


def torch_load_failure(exc: Exception) -> str:
    """Why torch.load failed, in one line: its message's first line, with the type where that alone says little (a
    corrupt pickle's KeyError is the memo index it missed; a truncated one's EOFError has no message)."""
    if isinstance(exc, EOFError):
        return "the file ends early (EOFError): a download cut short"
    lines = str(exc).strip().splitlines()
    if isinstance(exc, (OSError, RuntimeError, ValueError)) and lines:
        return lines[0]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _load(file: Path) -> dict[str, torch.Tensor]:
    try:
        state = load_weights_only(file)
    except CheckpointError:  # an LFS pointer, no torch file, or an object the restricted unpickler refuses: worded
        raise
    except Exception as exc:  # a truncated or corrupt file: torch's unpickler raises many types (EOFError, KeyError)
        raise CheckpointError(f"{file}: not a readable PyTorch weights file: {torch_load_failure(exc)}") from None
    for key in _WRAPPER_KEYS:
        if isinstance(state, dict) and set(state) == {key} and isinstance(state[key], dict):
            state = state[key]
    if not isinstance(state, dict):
        raise CheckpointError(f"{file}: holds a {type(state).__name__}, not a dict of tensors")
    bad = [name for name, value in state.items() if not isinstance(name, str) or not isinstance(value, torch.Tensor)]
    if bad:
        raise CheckpointError(f"{file}: entry {bad[0]!r} is not a named tensor; expected a flat dict of tensors")
    return state


_UNPICKLER_REASON = re.compile(r"WeightsUnpickler error:\s*(.*?)(?:\.\s|\n|$)", re.DOTALL)


def unpickling_refusal(exc: BaseException) -> str:
    """The reason torch's restricted unpickler gave ("Unsupported global: GLOBAL x.Y was not an allowed global
    by default"), in one line. torch's whole message also suggests re-running with weights_only=False or
    allow-listing the class, which would run the file's code: advice Glimmer never passes on."""
    match = _UNPICKLER_REASON.search(str(exc))
    reason = match.group(1).strip() if match else ""
    return " ".join(reason.split()) or "it holds objects other than tensors and plain containers"
