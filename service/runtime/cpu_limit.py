"""The CPUs this process may use: the cores it may run on, capped by a CPU limit (a cgroup's CPU quota: a
container's `--cpus`, docker compose's `cpus`, a Kubernetes pod's CPU limit, a systemd slice's CPUQuota).
The affinity does not show a limit: a container limited to 2 CPUs on a 64-core host sees 64 cores, and one
thread per core would spend the quota in a fraction of each period, then wait out the rest."""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
MEMBERSHIP = Path("/proc/self/cgroup")  # which cgroups this process is in, one line per hierarchy
V1_CPU_MOUNTS = ("cpu", "cpu,cpuacct", "cpuacct,cpu")


def _with_ancestors(mount: Path, path: str) -> list[Path]:
    """The folder of a cgroup path under its mount and every folder above it, the mount last. `..` parts
    (a cgroup outside this namespace's root) are dropped rather than followed out of the mount."""
    parts = [p for p in Path(path.lstrip("/")).parts if p not in ("", ".", "..")]
    return [*(mount.joinpath(*parts[:n]) for n in range(len(parts), 0, -1)), mount]


def _memberships(membership: Path) -> dict[str, str]:
    """Controllers ("" for cgroup v2) -> this process's cgroup path, from /proc/self/cgroup."""
    found: dict[str, str] = {}
    try:
        for line in membership.read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                found.setdefault(controller, path)
    except (OSError, ValueError):
        pass
    return found


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
    """The CPU quota in CPUs (quota / period) of this process's cgroup or any above it (the tightest where
    several set one), cgroup v2 or v1; None where none does. Inside a container the file names "/" and the
    mount is the container's own cgroup."""
    paths = _memberships(membership)
    limits = [_v2_limit(folder) for folder in _with_ancestors(root, paths.get("", "/"))]
    for mount in V1_CPU_MOUNTS:
        limits += [_v1_limit(folder) for folder in _with_ancestors(root / mount, paths.get("cpu", "/"))]
    found = [limit for limit in limits if limit is not None]
    return min(found) if found else None


def cpu_limit(root: Path = CGROUP, membership: Path = MEMBERSHIP) -> float | None:
    """The quota where it limits this process: below the cores it may run on (2 CPUs on a 2-core machine
    limit nothing); else None."""
    quota = cpu_quota(root, membership)
    return quota if quota is not None and quota < len(os.sched_getaffinity(0)) else None


def usable_cpus(root: Path = CGROUP, membership: Path = MEMBERSHIP) -> int:
    """The cores this process may run on, at most the CPU limit rounded up (at least 1)."""
    cores = len(os.sched_getaffinity(0))
    limit = cpu_limit(root, membership)
    return cores if limit is None else max(1, math.ceil(limit))
