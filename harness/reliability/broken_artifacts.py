"""Broken and mismatched artifacts: the server must refuse each at start-up, in one line that names the file."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.reliability.harness import ARTIFACTS, REPO, Outcome, free_port, timed


def _edit_config(**changes: Any) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        path = folder / "config.json"
        config = json.loads(path.read_text())
        for key, value in changes.items():
            (config["dims"] if key in ("n_heads", "d_head", "n_layers") else config)[key] = value
        path.unlink()
        path.write_text(json.dumps(config))

    return edit


def _replace(name: str, content: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        data = (folder / name).read_bytes()
        (folder / name).unlink()
        (folder / name).write_bytes(content(data))

    return edit


def _edit_json(name: str, change: Callable[[Any], None]) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        data = json.loads((folder / name).read_text())
        change(data)
        (folder / name).unlink()
        (folder / name).write_text(json.dumps(data))

    return edit


def _copy_from(other: str, name: str) -> Callable[[Path], None]:
    """Another model's file: the three trained models share their vocabulary size (8,000)."""

    def edit(folder: Path) -> None:
        (folder / name).unlink()
        shutil.copyfile(ARTIFACTS / other / name, folder / name)

    return edit


def _flip_bytes(data: bytes) -> bytes:
    """4 KiB in the middle of a graph inverted: inside its weights, so the file still loads and runs."""
    middle = len(data) // 2
    return data[:middle] + bytes(b ^ 0xFF for b in data[middle : middle + 4096]) + data[middle + 4096 :]


ARTIFACT_CASES: list[tuple[str, str, Callable[[Path], None], str]] = [
    ("vocab_size 4000 on an 8,000-token model", "generator", _edit_config(vocab_size=4000), "config.json"),
    ("vocab_size 9000", "generator", _edit_config(vocab_size=9000), "config.json"),
    ("max_positions 100000", "generator", _edit_config(max_positions=100000), "config.json"),
    ("wrong n_heads", "generator", _edit_config(n_heads=8), "config.json"),
    ("wrong d_head", "generator", _edit_config(d_head=32), "config.json"),
    ("wrong n_layers", "classifier", _edit_config(n_layers=2), "config.json"),
    ("classifier vocab_size too large", "classifier", _edit_config(vocab_size=9000), "config.json"),
    ("translator max_positions too large", "translator", _edit_config(max_positions=100000), "config.json"),
    ("config.json not JSON", "translator", _replace("config.json", lambda b: b[:100]), "config.json"),
    ("broken tokenizer.json", "generator", _replace("tokenizer.json", lambda b: b[: len(b) // 2]), "tokenizer.json"),
    ("truncated graph", "classifier", _replace("encoder.onnx", lambda b: b[: len(b) // 3]), "encoder.onnx"),
    ("graph replaced by zeros", "generator", _replace("decoder.onnx", lambda b: bytes(1000)), "decoder.onnx"),
    # What the graphs cannot show: each loaded and served wrong answers before golden.json recorded the
    # tokenizer, the config and the graph files (contract/golden.py).
    ("the generator's tokenizer, same size", "translator", _copy_from("generator", "tokenizer.json"), "tokenizer.json"),
    ("the translator's tokenizer, same size", "classifier", _copy_from("translator", "tokenizer.json"),
     "tokenizer.json"),
    ("the classifier's tokenizer, same size", "generator", _copy_from("classifier", "tokenizer.json"),
     "tokenizer.json"),
    ("tokenizer adds no end token", "translator", _edit_json("tokenizer.json", lambda t: t.update(post_processor=None)),
     "tokenizer.json"),
    ("bos and eos swapped", "translator", _edit_json("config.json", lambda c: c["special_tokens"].update(bos=3, eos=2)),
     "config.json"),
    ("eos is the pad token", "generator", _edit_json("config.json", lambda c: c["special_tokens"].update(eos=0, bos=0)),
     "config.json"),
    ("labels reversed", "classifier", _edit_json("config.json", lambda c: c.update(labels=c["labels"][::-1])),
     "config.json"),
    ("max_positions halved", "generator", _edit_json("config.json", lambda c: c.update(max_positions=128)),
     "config.json"),
    ("weights changed in place", "classifier", _replace("encoder.onnx", _flip_bytes), "encoder.onnx"),
    ("golden.json not JSON", "translator", _replace("golden.json", lambda b: b[:100]), "golden.json"),
]


def _broken_copy(root: Path, model: str, edit: Callable[[Path], None]) -> None:
    """Graphs are linked, not copied (edits replace a file before writing it)."""
    folder = root / model
    folder.mkdir(parents=True)
    for item in (ARTIFACTS / model).iterdir():
        if item.suffix == ".onnx":
            (folder / item.name).symlink_to(item)
        else:
            shutil.copy(item, folder / item.name)
    edit(folder)


@timed("artifacts")
async def artifacts() -> Outcome:
    """Each broken artifact: the server exits non-zero with one line naming the file, no traceback."""
    out = Outcome("artifacts")
    times = []
    for name, model, edit, file in ARTIFACT_CASES:
        with tempfile.TemporaryDirectory() as root:
            _broken_copy(Path(root), model, edit)
            env = {k: v for k, v in os.environ.items() if not k.startswith("SERVE_")}
            env |= {"SERVE_ARTIFACTS_DIR": root, "SERVE_MODELS": model, "SERVE_PORT": str(free_port())}
            env |= {"SERVE_HOST": "127.0.0.1", "SERVE_INTRA_OP_THREADS": "1", "SERVE_LOG_LEVEL": "warning"}
            started = time.perf_counter()
            proc = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "service"],
                env=env,
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=60,
            )
            times.append(time.perf_counter() - started)
            lines = [line for line in proc.stderr.splitlines() if line.strip()]
            last = lines[-1] if lines else ""
            out.check(proc.returncode not in (0, None), f"{name}: exit status {proc.returncode}")
            out.check(str(Path(root) / model / file) in last, f"{name}: the last line does not name {file}: {last!r}")
            out.check("Traceback" not in proc.stderr, f"{name}: a traceback instead of one line")
    out.figures = {"cases": len(ARTIFACT_CASES), "max_exit_s": round(max(times), 2)}
    return out
