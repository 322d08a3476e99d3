"""The memory a generator's key/value cache may take (SERVE_KV_CACHE_BYTES), and what a sequence needs of it.

Admission reserves each sequence's worst case, (prompt + max new tokens) x bytes per token, so a running
sequence never runs out of cache and nothing is ever preempted; a sequence that does not fit waits in the
queue (a full queue is a 429), and the prefix store gives its bytes back first. The default is half the
memory limit: the cgroup's (a container's), else the machine's.
"""

from __future__ import annotations

import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
UNLIMITED = 1 << 60  # cgroup v1 reports "no limit" as a huge number


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def memory_limit(root: Path = CGROUP) -> int:
    """This process's memory limit in bytes: cgroup v2's memory.max or v1's limit where one is set, else the
    machine's physical memory."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in (root / "memory.max", root / "memory" / "memory.limit_in_bytes"):
        limit = _read_int(path)
        if limit is not None and 0 < limit < UNLIMITED:
            return min(limit, physical)
    return physical


def kv_cache_budget(setting: int) -> int:
    """SERVE_KV_CACHE_BYTES, or half the memory limit when it is 0."""
    return setting or memory_limit() // 2
