"""The CPU limit a process runs under (its cgroup's CPU quota), and what the sessions make of it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import service.runtime.sessions as sessions
from service.runtime.cpu_limit import cpu_quota, usable_cpus
from service.runtime.sessions import RuntimeOptions


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


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
    tmp_path: Path, files: dict[str, str], expected: float | None
) -> None:
    for name, text in files.items():
        write(tmp_path / name, text)
    assert cpu_quota(tmp_path) == expected


def test_usable_cpus_are_the_cores_capped_by_the_limit_rounded_up(tmp_path: Path) -> None:
    cores = len(os.sched_getaffinity(0))
    assert usable_cpus(tmp_path) == cores  # no limit
    write(tmp_path / "cpu.max", "50000 100000\n")
    assert usable_cpus(tmp_path) == 1
    write(tmp_path / "cpu.max", f"{100000 * cores + 1} 100000\n")
    assert usable_cpus(tmp_path) == cores  # a limit above the cores changes nothing


def test_under_a_limit_the_sessions_take_its_threads_and_park(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sessions, "cpu_quota", lambda: 1.5)
    monkeypatch.setattr(sessions, "usable_cpus", lambda: 2)
    assert RuntimeOptions().threads() == 2 and not RuntimeOptions().spins_between_runs()
    assert RuntimeOptions(intra_op_threads=3, spin_between_runs=True).threads() == 3  # set: as set
    assert RuntimeOptions(spin_between_runs=True).spins_between_runs()
    assert RuntimeOptions().busy_threads() == 1


def test_without_a_limit_onnx_runtime_picks_and_the_threads_spin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sessions, "cpu_quota", lambda: None)
    assert RuntimeOptions().threads() == 0 and RuntimeOptions().spins_between_runs()
    assert not RuntimeOptions(spin_between_runs=False).spins_between_runs()


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
