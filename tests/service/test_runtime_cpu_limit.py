"""The CPU limit a process runs under (its cgroups' CPU quota), and what the sessions make of it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import service.runtime.sessions as sessions
from service.runtime.cpu_limit import cpu_limit, cpu_quota, usable_cpus
from service.runtime.sessions import RuntimeOptions

CORES = len(os.sched_getaffinity(0))


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def in_container(tmp_path: Path) -> Path:
    """/proc/self/cgroup as a container sees it (cgroup v2, its own cgroup at the mount's root)."""
    write(tmp_path / "proc-self-cgroup", "0::/\n")
    return tmp_path / "proc-self-cgroup"


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"cpu.max": "150000 100000\n"}, 1.5),  # cgroup v2, a container's own
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "200000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 2.0),  # cgroup v1
        ({"cpu,cpuacct/cpu.cfs_quota_us": "50000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, 0.5),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({}, None),
    ],
)
def test_the_quota_is_read_from_either_cgroup_version(
    tmp_path: Path, in_container: Path, files: dict[str, str], expected: float | None
) -> None:
    for name, text in files.items():
        write(tmp_path / "cgroup" / name, text)
    assert cpu_quota(tmp_path / "cgroup", in_container) == expected


def test_a_limit_above_the_process_cgroup_applies_and_the_tightest_wins(tmp_path: Path) -> None:
    membership = tmp_path / "proc-self-cgroup"
    write(membership, "0::/system.slice/serve.service\n")
    root = tmp_path / "cgroup"
    write(root / "system.slice/serve.service/cpu.max", "max 100000\n")
    assert cpu_quota(root, membership) is None
    write(root / "system.slice/cpu.max", "300000 100000\n")  # a slice's CPUQuota=300%
    assert cpu_quota(root, membership) == 3.0
    write(root / "system.slice/serve.service/cpu.max", "50000 50000\n")
    assert cpu_quota(root, membership) == 1.0


def test_cgroup_v1_reads_the_cpu_controller_path_and_its_parents(tmp_path: Path) -> None:
    membership = tmp_path / "proc-self-cgroup"
    write(membership, "5:memory:/elsewhere\n3:cpu,cpuacct:/docker/abc\n0::/\n")
    root = tmp_path / "cgroup"
    write(root / "cpu,cpuacct/cpu.cfs_quota_us", "-1\n")
    write(root / "cpu,cpuacct/cpu.cfs_period_us", "100000\n")
    assert cpu_quota(root, membership) is None
    write(root / "cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "250000\n")
    write(root / "cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n")
    assert cpu_quota(root, membership) == 2.5


def test_a_path_outside_the_namespace_stays_inside_the_mount(tmp_path: Path) -> None:
    membership = tmp_path / "proc-self-cgroup"
    write(membership, "0::/../../outside\n")
    write(tmp_path / "outside/cpu.max", "100000 100000\n")  # beside the mount: never read
    write(tmp_path / "cgroup/outside/cpu.max", "200000 100000\n")
    assert cpu_quota(tmp_path / "cgroup", membership) == 2.0


def test_a_quota_limits_only_below_the_cores(tmp_path: Path, in_container: Path) -> None:
    root = tmp_path / "cgroup"
    assert cpu_limit(root, in_container) is None and usable_cpus(root, in_container) == CORES  # no quota
    write(root / "cpu.max", "50000 100000\n")
    assert cpu_limit(root, in_container) == 0.5 and usable_cpus(root, in_container) == 1
    write(root / "cpu.max", f"{100000 * CORES} 100000\n")  # as many CPUs as cores: nothing to throttle
    assert cpu_limit(root, in_container) is None and usable_cpus(root, in_container) == CORES


def test_under_a_limit_the_sessions_take_its_threads_and_park(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sessions, "cpu_limit", lambda: 1.5)
    monkeypatch.setattr(sessions, "usable_cpus", lambda: 2)
    assert RuntimeOptions().threads() == 2 and not RuntimeOptions().spins_between_runs()
    assert RuntimeOptions(intra_op_threads=3, spin_between_runs=True).threads() == 3  # set: as set
    assert RuntimeOptions(spin_between_runs=True).spins_between_runs()
    assert RuntimeOptions().busy_threads() == 1


def test_without_a_limit_onnx_runtime_picks_and_the_threads_spin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sessions, "cpu_limit", lambda: None)
    assert RuntimeOptions().threads() == 0 and RuntimeOptions().spins_between_runs()
    assert not RuntimeOptions(spin_between_runs=False).spins_between_runs()
