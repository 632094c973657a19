"""Refuse, before anything is allocated, weights (a drafter's beside the model's, or a KV cache beside them) that cannot
fit in the host's memory.

A model on the CPU lives in host memory; weights larger than physical memory plus swap end in the kernel's
OOM killer (or a multi-line MemoryError) only after minutes of materializing them. The estimate is the
parameters' bytes in the load dtype, known on the meta device before any tensor exists. Only the CPU is
checked: a GPU's allocator refuses an oversized model at once with its own error.

In a container the memory that counts is its cgroup's limit, not /proc/meminfo's totals: a 16 GiB container on
a 256 GiB host is OOM-killed at 16 GiB. Each total is lowered to the smallest limit set on the process's cgroup or
any of its ancestors (a parent's limit binds its children too), under cgroup v2 or v1.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import torch
from torch import nn

from glimmer.checkpoint.quantized_weights import QuantizedStorage
from glimmer.errors import KV_CACHE_MEMORY_OPTION, ConfigError, option_and_keyword

MEMINFO = Path("/proc/meminfo")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")
_GIB = 1 << 30
_MIB = 1 << 20


def _size(nbytes: int) -> str:
    """Bytes for a message: GiB to a tenth, or MiB below 1 GiB (a tiny model's weights are not "0.0 GiB")."""
    return f"{nbytes / _GIB:.1f} GiB" if nbytes >= _GIB else f"{nbytes / _MIB:.1f} MiB"

# Per hierarchy mounted under CGROUP_ROOT: the files limiting memory and swap. v2's unified hierarchy is
# CGROUP_ROOT itself; v1's memory controller is CGROUP_ROOT/memory, and v1 has no swap-only limit
# (memory.memsw.limit_in_bytes bounds memory and swap together: read_host_memory takes the swap it leaves).
# "No limit" is v2's "max" (not a number) and v1's 9223372036854771712 (LONG_MAX rounded down to a page),
# which is above any MemTotal and so never binds.
_LIMIT_FILES = {"": ("memory.max", "memory.swap.max"), "memory": ("memory.limit_in_bytes", None)}


@dataclass(frozen=True)
class CgroupLimit:
    """A limit one file of the process's cgroup hierarchy sets."""

    limit_bytes: int
    path: Path


@dataclass(frozen=True)
class HostMemory:
    """The memory and swap this process may fill: /proc/meminfo's MemTotal and SwapTotal, each lowered to the
    smallest cgroup limit on it. `cgroup_limits` are the limits that lowered one (empty outside a container)."""

    memory_bytes: int
    swap_bytes: int
    host_bytes: int  # MemTotal + SwapTotal, whatever the cgroup allows
    cgroup_limits: tuple[CgroupLimit, ...] = ()

    @property
    def total_bytes(self) -> int:
        return self.memory_bytes + self.swap_bytes

    def describe(self) -> str:
        """The figure and where it comes from, for an error message: the machine's, or the process's cgroup's (a
        container's, a systemd slice's, a batch job's)."""
        if not self.cgroup_limits:
            return (f"this machine's {_size(self.total_bytes)} of memory and swap "
                    "(/proc/meminfo MemTotal + SwapTotal)")
        limits = ", ".join(f"{limit.path} = {_size(limit.limit_bytes)}" for limit in self.cgroup_limits)
        return (f"the {_size(self.total_bytes)} of memory and swap this process's cgroup allows "
                f"({limits}; the host has {_size(self.host_bytes)})")


def read_host_memory() -> HostMemory | None:
    """The memory and swap this process may fill, or None where /proc/meminfo is unavailable (not Linux,
    unreadable). Cgroup files that are missing, unreadable or odd are passed over: /proc/meminfo alone then."""
    totals = _meminfo_totals()
    if totals is None:
        return None
    mem_total, swap_total = totals
    memory_files: list[Path] = []
    swap_files: list[Path] = []
    combined_files: list[Path] = []  # v1's memory.memsw.limit_in_bytes: memory and swap together
    for mount, cgroup_path in _own_memory_cgroups().items():
        memory_name, swap_name = _LIMIT_FILES[mount]
        for folder in _self_and_ancestors(CGROUP_ROOT / mount, cgroup_path):
            memory_files.append(folder / memory_name)
            if swap_name is not None:
                swap_files.append(folder / swap_name)
            if mount == "memory":
                combined_files.append(folder / "memory.memsw.limit_in_bytes")
    memory_limit = _smallest_limit_below(memory_files, mem_total)
    memory_bytes = memory_limit.limit_bytes if memory_limit else mem_total
    swap_limit = _smallest_limit_below(swap_files, swap_total)
    swap_bytes = swap_limit.limit_bytes if swap_limit else swap_total
    # v1: the swap a combined limit leaves beside the memory (docker's --memory-swap equal to --memory: none)
    combined = _smallest_limit_below(combined_files, memory_bytes + swap_bytes)
    if combined is not None:
        swap_bytes = max(0, combined.limit_bytes - memory_bytes)
    return HostMemory(memory_bytes=memory_bytes, swap_bytes=swap_bytes, host_bytes=mem_total + swap_total,
                      cgroup_limits=tuple(limit for limit in (memory_limit, swap_limit, combined) if limit is not None))


def _meminfo_totals() -> tuple[int, int] | None:
    """(MemTotal, SwapTotal) in bytes from /proc/meminfo; None without a readable MemTotal."""
    try:
        lines = MEMINFO.read_text().splitlines()
    except (OSError, ValueError):
        return None
    sizes = {}
    for line in lines:
        name, _, value = line.partition(":")
        parts = value.split()
        if name in ("MemTotal", "SwapTotal") and len(parts) == 2 and parts[0].isdigit() and parts[1] == "kB":
            sizes[name] = int(parts[0]) * 1024
    if "MemTotal" not in sizes:
        return None
    return sizes["MemTotal"], sizes.get("SwapTotal", 0)


def _own_memory_cgroups() -> dict[str, str]:
    """The process's cgroup path per hierarchy that limits memory, keyed by its mount under CGROUP_ROOT: v2's
    line `0::/path` and v1's `N:memory:/path` of /proc/self/cgroup. Empty where that file is unreadable."""
    try:
        lines = PROC_SELF_CGROUP.read_text().splitlines()
    except (OSError, ValueError):
        return {}
    paths = {}
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        # a cgroup outside the process's cgroup namespace shows as `/../..`: its files are not under the mount
        if not path.startswith("/") or ".." in PurePosixPath(path).parts:
            continue
        if hierarchy == "0" and controllers == "":
            paths[""] = path
        elif "memory" in controllers.split(","):
            paths["memory"] = path
    return paths


def _self_and_ancestors(mount: Path, cgroup_path: str) -> list[Path]:
    """The cgroup's folder under `mount`, then each parent's up to the mount itself. In a container the mount is
    often the container's own cgroup while the path names it from the host's root; the walk still reaches it."""
    parts = PurePosixPath(cgroup_path).parts[1:]
    return [mount.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]


def _smallest_limit_below(paths: list[Path], total_bytes: int) -> CgroupLimit | None:
    """The smallest limit the files at `paths` set, if it is below `total_bytes` (else it does not bind). A file
    that is missing, unreadable, "max" or not a byte count sets none."""
    limits = []
    for path in paths:
        try:
            text = path.read_text().strip()
        except (OSError, ValueError):
            continue
        if text.isascii() and text.isdigit() and int(text) < total_bytes:
            limits.append(CgroupLimit(int(text), path))
    return min(limits, key=lambda limit: limit.limit_bytes, default=None)


def parameter_bytes(model: nn.Module) -> int:
    """The bytes of every parameter and buffer of `model` (on the meta device: nothing is allocated)."""
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


def _host_memory_short(device: torch.device | str, needed: int) -> HostMemory | None:
    """The host's memory where `needed` bytes of weights, materialized on the CPU (`device`), would exceed the
    physical memory plus swap this process may use; None where they fit, on other devices or where it is unknown."""
    if torch.device(device).type != "cpu":
        return None
    memory = read_host_memory()
    return memory if memory is not None and needed > memory.total_bytes else None


# a refusal is read from the command line or from LLM(...): each fix is named in both forms
_ON_A_GPU = option_and_keyword("--device", "cuda", '"cuda"')
_IN_BFLOAT16 = option_and_keyword("--dtype", "bfloat16", '"bfloat16"')


def _halving_hint(dtype: torch.dtype) -> str:
    return f"; {_IN_BFLOAT16} halves it" if dtype == torch.float32 else ""


def check_fits_in_host_memory(model: nn.Module, device: torch.device | str, dtype: torch.dtype, *,
                              quantized: QuantizedStorage | None = None) -> None:
    """Raises ConfigError (one line: the size, the memory, the fix) when `model`'s weights, materialized on the
    CPU, would exceed the physical memory plus swap this process may use. Does nothing on other devices or where the
    memory is unknown. `quantized` describes quantized weights stored (their scheme and bytes on disk), which
    load dequantized: a size many times the download's is then explained."""
    needed = parameter_bytes(model)
    memory = _host_memory_short(device, needed)
    if memory is not None:
        name = str(dtype).removeprefix('torch.')
        why = (f" (its {quantized.scheme} weights, {_size(quantized.bytes_on_disk)} on disk, are dequantized to "
               f"{name} when they load)" if quantized is not None else "")
        raise ConfigError(
            f"the model's weights need {_size(needed)} as {name} on the CPU{why}, more than "
            f"{memory.describe()}; load a smaller model (e.g. glimmer make-tiny) or use a GPU with room for it "
            f"({_ON_A_GPU}){_halving_hint(dtype)}"
        )


def check_drafter_fits_in_host_memory(drafter: nn.Module, device: torch.device | str, dtype: torch.dtype,
                                      target: nn.Module | None = None) -> None:
    """check_fits_in_host_memory for a speculative drafter's weights, beside its `target`'s where they are loaded
    already."""
    needed = parameter_bytes(drafter)
    beside = 0 if target is None else parameter_bytes(target)
    memory = _host_memory_short(device, needed + beside)
    if memory is not None:
        alongside, room_for = ("", "it") if target is None else (f" beside the model's {_size(beside)}", "both")
        raise ConfigError(
            f"the speculative drafter's weights need {_size(needed)} as {str(dtype).removeprefix('torch.')} on the "
            f"CPU{alongside}, more than {memory.describe()}; serve without the drafter (leave out "
            f"{option_and_keyword('--speculative-config')}) or use a GPU with room for {room_for} ({_ON_A_GPU})"
            f"{_halving_hint(dtype)}"
        )


@dataclass(frozen=True)
class KVCacheRoom:
    """What `models`' weights leave for a KV cache on the CPU of the physical memory plus swap this process may use."""

    bytes: int  # negative where the weights alone exceed the memory
    weights: int
    memory: HostMemory


def kv_cache_room_in_host_memory(models: list[nn.Module]) -> KVCacheRoom | None:
    """The room `models`' weights leave for a KV cache on the CPU; None where the memory is unknown."""
    memory = read_host_memory()
    if memory is None:
        return None
    weights = sum(parameter_bytes(model) for model in models)
    return KVCacheRoom(memory.total_bytes - weights, weights, memory)


def check_kv_cache_fits_in_host_memory(kv_bytes: int, models: list[nn.Module]) -> None:
    """Raises ConfigError when a KV cache of `kv_bytes` given by kv_cache_memory would not fit beside `models`'
    weights in the physical memory plus swap this process may use (the allocation would fail with an allocator's
    traceback, or be killed later under load)."""
    room = kv_cache_room_in_host_memory(models)
    if room is None or kv_bytes <= room.bytes:
        return
    raise ConfigError(f"kv_cache_memory={kv_bytes:,} bytes is more than the {max(room.bytes, 0):,} bytes the weights' "
                      f"{_size(room.weights)} leave of {room.memory.describe()}; give the KV cache less "
                      f"({KV_CACHE_MEMORY_OPTION})")
