"""Size rules for the code: no function over 60 lines and no file over 400 lines, in every Python folder of the
repository but tests/. A function's length runs from its `def` to its last line (decorators not counted);
a file's is its number of lines. A breach is split into steps or modules with one job each, not squeezed."""

import ast
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 400
# Top-level folders that hold no code of ours to measure: the tests themselves, and what ruff leaves out too
# (pyproject.toml: runs, data, logs, artifacts). Hidden folders (.venv, .git, ...) and node_modules are
# skipped at any depth.
NOT_MEASURED = {"tests", "runs", "data", "logs", "artifacts"}


def python_files(root: Path = REPO) -> list[Path]:
    """Every .py file below `root` that the rules apply to, in a stable order."""
    found: list[Path] = []
    for folder, dirs, files in os.walk(root):
        top = Path(folder) == REPO
        dirs[:] = sorted(
            d
            for d in dirs
            if not d.startswith(".") and d not in ("node_modules", "__pycache__") and not (top and d in NOT_MEASURED)
        )
        found += [Path(folder) / name for name in sorted(files) if name.endswith(".py")]
    return found


def long_functions(files: list[Path]) -> list[str]:
    """`path:line name (N lines)` for each function or method over MAX_FUNCTION_LINES."""
    offenders = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines} lines)")
    return offenders


def long_files(files: list[Path]) -> list[str]:
    """`path (N lines)` for each file over MAX_FILE_LINES."""
    offenders = []
    for path in files:
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_FILE_LINES:
            offenders.append(f"{path.relative_to(REPO)} ({lines} lines)")
    return offenders


def test_the_rules_see_the_code() -> None:
    """The walk finds the packages (a wrong root or filter would pass every rule on nothing)."""
    measured = {path.relative_to(REPO).parts[0] for path in python_files()}
    assert {"service", "model", "benchmarks", "harness", "scripts", "contract"} <= measured, measured
    assert "tests" not in measured


def test_no_function_is_longer_than_60_lines() -> None:
    offenders = long_functions(python_files())
    assert not offenders, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(offenders)


def test_no_file_is_longer_than_400_lines() -> None:
    offenders = long_files(python_files())
    assert not offenders, f"files over {MAX_FILE_LINES} lines:\n" + "\n".join(offenders)
