"""A benchmark's JSON record."""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any


def write_record(module: str, options: tuple[tuple[str, object], ...], out: Path, **fields: Any) -> None:
    """A benchmark's JSON: the command that made it (`python -m benchmarks.<module>` with its options), the
    machine, and `fields`."""
    command = f"python -m benchmarks.{module} " + " ".join(f"--{k} {v}" for k, v in options)
    record = {"command": command, "machine": platform.processor() or platform.machine(), **fields}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"wrote {out}")
