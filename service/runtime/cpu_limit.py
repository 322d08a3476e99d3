"""The CPUs this process may use: the cores it may run on, capped by a CPU limit (a cgroup's CPU quota: a
container's `--cpus`, docker compose's `cpus`, a Kubernetes pod's CPU limit). The affinity does not show a
limit: a container limited to 2 CPUs on a 64-core host sees 64 cores, and one thread per core would spend
the quota in a fraction of each period, then wait out the rest."""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def _v2_folders(root: Path) -> list[Path]:
    """This process's cgroup v2 folder (from /proc/self/cgroup), then the root (a container's own cgroup)."""
    folders = []
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                folders.append(root / line[3:].lstrip("/"))
    except OSError:
        pass
    return [*folders, root]


def cpu_quota(root: Path = CGROUP) -> float | None:
    """The CPU limit in CPUs (quota / period), or None where there is none."""
    for folder in _v2_folders(root):
        try:
            quota, period = (folder / "cpu.max").read_text().split()[:2]
        except (OSError, ValueError):
            continue
        return None if quota == "max" else int(quota) / int(period)
    for folder in (root / "cpu", root / "cpu,cpuacct"):  # cgroup v1
        try:
            quota_us = int((folder / "cpu.cfs_quota_us").read_text())
            period_us = int((folder / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return None if quota_us <= 0 else quota_us / period_us
    return None


def usable_cpus(root: Path = CGROUP) -> int:
    """The cores this process may run on, at most the CPU limit rounded up (at least 1)."""
    cores = len(os.sched_getaffinity(0))
    quota = cpu_quota(root)
    return cores if quota is None else max(1, min(cores, math.ceil(quota)))
