"""The CPU threads a container may use. torch sizes its thread pool (and so the C kernels' OpenMP teams) by the cores
it can run on, not by a cgroup's CPU quota (`docker run --cpus 2`, a Kubernetes CPU limit, a systemd service's
`CPUQuota=`): on a large host it runs one thread per host core in a cgroup allowed a few, whose threads then wait at
every barrier for those the quota has throttled. The process's own cgroup is read from /proc/self/cgroup and the
tightest quota on the path from it up to the root counts (each ancestor's quota limits all below it), so a process
in a nested cgroup (a systemd service, a container sharing the host's cgroup namespace) finds its quota too.
OMP_NUM_THREADS, when set, is the operator's choice and is left as it is; a value OpenMP does not take (which it
ignores, running one thread per core) is refused, not taken for a choice."""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

import torch

from glimmer.errors import ConfigError

logger = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
"""Where the cgroup file system is mounted: cgroup v2's `cpu.max` in each cgroup's folder, or v1's
`cpu.cfs_quota_us` and `cpu.cfs_period_us` in each folder under `cpu/`."""

PROC_SELF_CGROUP = Path("/proc/self/cgroup")
"""The process's own cgroups, one `HIERARCHY:CONTROLLERS:PATH` line each: v2's is `0::PATH`, v1's cpu controller's
the line whose CONTROLLERS include `cpu`."""


def own_cgroup_paths(proc_cgroup: Path = PROC_SELF_CGROUP) -> tuple[str | None, str | None]:
    """The process's cgroup v2 path and its v1 `cpu` controller's path (each None where /proc/self/cgroup is
    missing, unreadable or has no such line)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return None, None
    v2 = v1 = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def _folders_up_to(base: Path, cgroup_path: str | None) -> list[Path]:
    """`base`/`cgroup_path` and each folder above it up to `base` itself. A path outside the process's cgroup
    namespace (`/../..`) names no folder under `base`: only `base` counts then."""
    parts = PurePosixPath(cgroup_path or "/").parts[1:]
    if ".." in parts or "." in parts:
        parts = ()
    return [base.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]


def _cpus(quota: str, period: str) -> float | None:
    """The CPUs a quota allows; None for none (v2 `max`, v1 -1) or numbers that are not a quota."""
    try:
        quota_us, period_us = int(quota), int(period)
    except ValueError:  # `max`
        return None
    if quota_us <= 0 or period_us <= 0:
        return None
    return quota_us / period_us


def _folder_cpus(folder: Path) -> float | None:
    """The quota set in one cgroup's folder, v2 or v1; None without one."""
    try:
        quota, period = (folder / "cpu.max").read_text().split()[:2]  # v2: "QUOTA PERIOD", QUOTA `max` for none
    except (OSError, ValueError):
        try:
            quota = (folder / "cpu.cfs_quota_us").read_text().strip()  # v1: -1 for none
            period = (folder / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            return None
    return _cpus(quota, period)


def cgroup_cpu_limit(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_SELF_CGROUP) -> int | None:
    """The CPUs the tightest quota on the path from the process's cgroup (read from `proc_cgroup`) up to the root
    of the cgroup file system at `root` allows, rounded up (a quota of 1.5 CPUs runs 2 threads); None without a
    quota (`max`, -1) or cgroup files."""
    v2_path, v1_path = own_cgroup_paths(proc_cgroup)
    folders = _folders_up_to(root, v2_path) + _folders_up_to(root / "cpu", v1_path)
    quotas = [cpus for cpus in map(_folder_cpus, folders) if cpus is not None]
    return max(1, math.ceil(min(quotas))) if quotas else None


OMP_THREAD_COUNTS = re.compile(r"\s*\+?0*[1-9]\d*\s*(,\s*\+?0*[1-9]\d*\s*)*")
"""What OpenMP takes for OMP_NUM_THREADS: a positive integer, or a comma-separated list of them (one per nesting
level); libgomp warns of anything else (0, -1, 'abc', '4,') and runs one thread per core."""


def omp_num_threads_set(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the operator set OMP_NUM_THREADS (blank counts as unset); ConfigError for a value OpenMP ignores,
    which would otherwise pass for a choice and keep the thread count from the cgroup's quota."""
    raw = environ.get("OMP_NUM_THREADS", "")
    if not raw.strip():
        return False
    if not OMP_THREAD_COUNTS.fullmatch(raw):
        raise ConfigError(f"OMP_NUM_THREADS={raw!r} is not a thread count: OpenMP takes a positive integer (or a "
                          "comma-separated list of them) and ignores anything else; set it to the threads to run, "
                          "such as 4, or unset it for one per core the process may use (the cgroup's CPU quota where "
                          "lower)")
    return True


def fit_threads_to_cpu_quota(root: Path | None = None, proc_cgroup: Path | None = None) -> None:
    """Lower torch's thread count to the process's cgroup quota (the cgroup file system at `root`, default
    CGROUP_ROOT; its own cgroup read from `proc_cgroup`, default PROC_SELF_CGROUP) where it is larger, unless
    OMP_NUM_THREADS is set (ConfigError where it is set to what OpenMP does not take)."""
    if omp_num_threads_set():
        return
    limit = cgroup_cpu_limit(CGROUP_ROOT if root is None else root,
                             PROC_SELF_CGROUP if proc_cgroup is None else proc_cgroup)
    threads = torch.get_num_threads()
    if limit is not None and limit < threads:
        logger.info("CPU threads: %d, the cgroup's CPU quota (torch would run %d, one per core it can see; "
                    "OMP_NUM_THREADS sets the number)", limit, threads)
        torch.set_num_threads(limit)
