"""The CPUs this process may use: the cores it may run on, capped by a CPU limit (a cgroup's CPU quota: a
container's `--cpus`, docker compose's `cpus`, a Kubernetes pod's CPU limit, a systemd slice's CPUQuota).
The affinity does not show a limit: a container limited to 2 CPUs on a 64-core host sees 64 cores, and one
thread per core would spend the quota in a fraction of each period, then wait out the rest."""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
MEMBERSHIP = Path("/proc/self/cgroup")  # which cgroup this process is in


def _v2_folders(root: Path, membership: Path) -> list[Path]:
    """This process's cgroup v2 folder (from /proc/self/cgroup) and every folder above it up to the root
    (a limit on any of them applies); just the root where the file names none (a container's own cgroup)."""
    folders: list[Path] = []
    try:
        for line in membership.read_text().splitlines():
            if line.startswith("0::"):
                parts = Path(line[3:].lstrip("/")).parts
                folders += [root.joinpath(*parts[:n]) for n in range(len(parts), 0, -1)]
    except OSError:
        pass
    return [*folders, root]


def _v2_limit(folder: Path) -> float | None:
    try:
        quota, period = (folder / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def _v1_limit(folder: Path) -> float | None:
    try:
        quota_us = int((folder / "cpu.cfs_quota_us").read_text())
        period_us = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota_us <= 0 else quota_us / period_us


def cpu_quota(root: Path = CGROUP, membership: Path = MEMBERSHIP) -> float | None:
    """The CPU limit in CPUs (quota / period; the tightest where several cgroups set one), or None."""
    limits = [_v2_limit(folder) for folder in _v2_folders(root, membership)]
    limits += [_v1_limit(root / name) for name in ("cpu", "cpu,cpuacct")]  # cgroup v1, as a container sees it
    found = [limit for limit in limits if limit is not None]
    return min(found) if found else None


def usable_cpus(root: Path = CGROUP) -> int:
    """The cores this process may run on, at most the CPU limit rounded up (at least 1)."""
    cores = len(os.sched_getaffinity(0))
    quota = cpu_quota(root)
    return cores if quota is None else max(1, min(cores, math.ceil(quota)))
