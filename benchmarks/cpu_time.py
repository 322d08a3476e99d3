"""CPU time from /proc (Linux): the machine's, a process's, and each thread's of a server and its children."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path


def machine_cpu_seconds() -> float:
    """CPU time all processes have used (the busy fields of /proc/stat's `cpu` line)."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = (
        int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    )
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """CPU time (user + system) process `pid` has used so far."""
    return _cpu_seconds(Path(f"/proc/{pid}/stat"))


@dataclass(frozen=True)
class ThreadCpu:
    process: int  # 0: the server's own process (the engine); 1, 2, ...: its children (front ends)
    main: bool  # the process's main thread: for `python -m service` (and the floor), the one running the event loop
    seconds: float  # CPU time (user + system) so far


def threads_cpu(pid: int) -> dict[int, ThreadCpu]:
    """Every thread of process `pid` and of its children (the front ends of SERVE_API_PROCESSES > 1), by
    thread id. Sums over one snapshot stay consistent (the event loops' share never exceeds the whole),
    which separate reads of /proc/<pid>/stat and of the threads do not: each is rounded to clock ticks."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    out: dict[int, ThreadCpu] = {}
    for index, process in enumerate([pid, *(int(child) for child in children)]):
        for thread in os.listdir(f"/proc/{process}/task"):
            with contextlib.suppress(FileNotFoundError):  # a thread that ended since the listing
                seconds = _cpu_seconds(Path(f"/proc/{process}/task/{thread}/stat"))
                out[int(thread)] = ThreadCpu(index, int(thread) == process, seconds)
    return out


def cpu_between(before: dict[int, ThreadCpu], after: dict[int, ThreadCpu]) -> dict[int, ThreadCpu]:
    """Each thread's CPU time between two snapshots (threads that ended in between are left out)."""
    return {tid: ThreadCpu(t.process, t.main, t.seconds - (before[tid].seconds if tid in before else 0.0))
            for tid, t in after.items()}


def _cpu_seconds(stat: Path) -> float:
    fields = stat.read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def client_cpu_seconds() -> float:
    usage = os.times()
    return usage.user + usage.system
