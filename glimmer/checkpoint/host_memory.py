"""Refuse, before anything is allocated, weights (or a KV cache beside them) that cannot fit in the host's memory.

A model on the CPU lives in host memory; weights larger than physical memory plus swap end in the kernel's
OOM killer (or a multi-line MemoryError) only after minutes of materializing them. The estimate is the
parameters' bytes in the load dtype, known on the meta device before any tensor exists. Only the CPU is
checked: a GPU's allocator refuses an oversized model at once with its own error.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from glimmer.errors import ConfigError

MEMINFO = Path("/proc/meminfo")
_GIB = 1 << 30


def host_memory_bytes() -> int | None:
    """MemTotal + SwapTotal from /proc/meminfo, or None where that is unavailable (not Linux, unreadable)."""
    try:
        lines = MEMINFO.read_text().splitlines()
    except OSError:
        return None
    sizes = {}
    for line in lines:
        name, _, value = line.partition(":")
        parts = value.split()
        if name in ("MemTotal", "SwapTotal") and len(parts) == 2 and parts[0].isdigit() and parts[1] == "kB":
            sizes[name] = int(parts[0]) * 1024
    if "MemTotal" not in sizes:
        return None
    return sizes["MemTotal"] + sizes.get("SwapTotal", 0)


def parameter_bytes(model: nn.Module) -> int:
    """The bytes of every parameter and buffer of `model` (on the meta device: nothing is allocated)."""
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


def check_fits_in_host_memory(model: nn.Module, device: torch.device | str, dtype: torch.dtype) -> None:
    """Raises ConfigError (one line: the size, the memory, the fix) when `model`'s weights, materialized on the
    CPU, would exceed physical memory plus swap. Does nothing on other devices or where the memory is unknown."""
    if torch.device(device).type != "cpu":
        return
    available = host_memory_bytes()
    needed = parameter_bytes(model)
    if available is None or needed <= available:
        return
    dtype_name = str(dtype).removeprefix("torch.")
    halve = "; --dtype bfloat16 halves it" if dtype == torch.float32 else ""
    raise ConfigError(
        f"the model's weights need {needed / _GIB:.1f} GiB as {dtype_name} on the CPU, more than this machine's "
        f"{available / _GIB:.1f} GiB of memory and swap (/proc/meminfo MemTotal + SwapTotal); load a smaller model "
        f"(e.g. glimmer make-tiny) or use a GPU with room for it (--device cuda){halve}"
    )


def check_kv_cache_fits_in_host_memory(kv_bytes: int, models: list[nn.Module]) -> None:
    """Raises ConfigError when a KV cache of `kv_bytes` on the CPU would not fit beside `models`' weights in physical
    memory plus swap (the allocation would fail with an allocator's traceback, or be killed later under load)."""
    available = host_memory_bytes()
    if available is None:
        return
    weights = sum(parameter_bytes(model) for model in models)
    room = available - weights
    if kv_bytes > room:
        raise ConfigError(f"kv_cache_memory={kv_bytes:,} bytes is more than this machine's {available / _GIB:.1f} GiB "
                          f"of memory and swap less the weights' {weights / _GIB:.1f} GiB ({max(room, 0):,} bytes); "
                          "give the KV cache less (--kv-cache-memory SIZE / kv_cache_memory=)")
