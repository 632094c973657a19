"""The CPU threads a container may use. torch sizes its thread pool (and so the C kernels' OpenMP teams) by the cores
it can run on, not by a cgroup's CPU quota (`docker run --cpus 2`, a Kubernetes CPU limit): on a large host it runs
one thread per host core in a container allowed a few, whose threads then wait at every barrier for those the quota
has throttled. OMP_NUM_THREADS, when set, is the operator's choice and is left as it is."""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
"""Where a container sees its own cgroup: cgroup v2's `cpu.max`, or v1's `cpu/cpu.cfs_quota_us` and
`cpu/cpu.cfs_period_us`."""


def cgroup_cpu_limit(root: Path = CGROUP_ROOT) -> int | None:
    """The CPUs the cgroup's quota allows, rounded up (a quota of 1.5 CPUs runs 2 threads); None without a quota
    (`max`, -1) or cgroup files."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]  # v2: "QUOTA PERIOD", QUOTA `max` for none
    except (OSError, ValueError):
        try:
            quota = (root / "cpu" / "cpu.cfs_quota_us").read_text().strip()  # v1: -1 for none
            period = (root / "cpu" / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            return None
    try:
        quota_us, period_us = int(quota), int(period)
    except ValueError:  # `max`
        return None
    if quota_us <= 0 or period_us <= 0:
        return None
    return max(1, math.ceil(quota_us / period_us))


def fit_threads_to_cpu_quota(root: Path | None = None) -> None:
    """Lower torch's thread count to the quota of the cgroup under `root` (default CGROUP_ROOT) where it is larger,
    unless OMP_NUM_THREADS is set."""
    if os.environ.get("OMP_NUM_THREADS"):
        return
    limit = cgroup_cpu_limit(CGROUP_ROOT if root is None else root)
    threads = torch.get_num_threads()
    if limit is not None and limit < threads:
        logger.info("CPU threads: %d, the container's CPU quota (torch would run %d, one per core it can see; "
                    "OMP_NUM_THREADS sets the number)", limit, threads)
        torch.set_num_threads(limit)
