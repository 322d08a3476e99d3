"""Render deploy/kubernetes/ with kustomize into deploy/kubernetes/rendered/<target>.yaml.

    python -m scripts.render_kubernetes            # after changing anything under deploy/kubernetes/

The rendered files are committed: they are what `kubectl apply -f` takes on a machine without
kustomize, and what tests/deploy/test_kubernetes.py validates wherever kustomize is missing (where it
is there, the test renders afresh and fails if a committed file is stale).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KUSTOMIZE_ROOT = ROOT / "deploy" / "kubernetes"
RENDERED = KUSTOMIZE_ROOT / "rendered"
TARGETS = ("base", "overlays/cpu", "overlays/gpu", "overlays/int8")


def rendered_path(target: str) -> Path:
    return RENDERED / f"{target.removeprefix('overlays/')}.yaml"


def kustomize_command(target: str) -> list[str] | None:
    """`kubectl kustomize` or a standalone `kustomize build` of one target; None when neither is installed."""
    if kubectl := shutil.which("kubectl"):
        return [kubectl, "kustomize", str(KUSTOMIZE_ROOT / target)]
    if kustomize := shutil.which("kustomize"):
        return [kustomize, "build", str(KUSTOMIZE_ROOT / target)]
    return None


def render(target: str) -> str:
    command = kustomize_command(target)
    if command is None:
        raise RuntimeError("neither kubectl nor kustomize is installed")
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr}")
    return result.stdout


def main() -> None:
    RENDERED.mkdir(exist_ok=True)
    for target in TARGETS:
        path = rendered_path(target)
        path.write_text(f"# Rendered from deploy/kubernetes/{target} by `python -m scripts.render_kubernetes`.\n"
                        + render(target))
        print(f"{target} -> {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
