"""Continue the stable (wsd) trainings on a lent GPU and bring them back: a prepared, time-capped job.

Three steps; the middle one runs on the GPU machine through the device tool's `run`:

    python -m scripts.gpu_train pack                  # here: .gpu/ <- data + runs/<model>/last as fp16
    # device run, carry [".gpu"], timeout_s 600:
    #   python3 -m scripts.gpu_train device --minutes 7
    python -m scripts.gpu_train unpack /work/.device/...   # here: the files that came back -> runs/<model>/

The GPU segment starts from the packed stable checkpoint (or, with none packed, from the committed
artifacts) with a fresh optimizer, and is recorded on the card like any other segment. What comes back
is each model's weights as fp16 safetensors (under the device tool's 16 MiB per file) with the
training state (steps, minutes, segments, history) in its metadata. Cool down and evaluate here
afterwards: `python -m scripts.train <model> --cooldown 15`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from model.packed_run import STABLE_RUNS, pack_run, unpack_run

PACK = Path(".gpu")
# The stable run of each model, under runs/: the classifier's is its MLM + NSP pretraining.
MODELS = tuple(STABLE_RUNS)
DATA_FILES = ("translation/train.jsonl", "translation/valid.jsonl", "generation/train.txt", "generation/valid.txt",
              "classification/pretrain.txt")


def pack(data: Path, runs: Path) -> None:
    PACK.mkdir(exist_ok=True)
    with tarfile.open(PACK / "data.tgz", "w:gz") as tar:
        for name in DATA_FILES:
            tar.add(data / name, arcname=name)
    for kind in MODELS:
        if (runs / STABLE_RUNS[kind] / "resume.pt").exists():
            pack_run(runs / STABLE_RUNS[kind], PACK / f"{kind}.safetensors")
            print(f"packed {runs / STABLE_RUNS[kind]} -> {PACK / kind}.safetensors")
        else:
            print(f"no {runs / kind}: the GPU run starts from artifacts/{kind}")
    size = sum(f.stat().st_size for f in PACK.iterdir()) / 2**20
    print(f"{PACK}/: {size:.1f} MiB (the device tool carries at most 64 MiB with the working tree)")


def device(minutes: float, out: Path) -> None:
    """On the GPU machine: unpack, train every model at once for ``minutes``, pack the results into ``out``."""
    with tarfile.open(PACK / "data.tgz") as tar:
        tar.extractall(Path("data"), filter="data")
    jobs = {}
    for kind in MODELS:
        packed = PACK / f"{kind}.safetensors"
        if packed.exists():
            unpack_run(packed, Path("runs") / STABLE_RUNS[kind])
        log = (out / f"{kind}.log").open("w")
        jobs[kind] = (subprocess.Popen([sys.executable, "-m", "scripts.train", kind, "--minutes", str(minutes),
                                        "--device", "cuda"], stdout=log, stderr=subprocess.STDOUT,
                                       env={**os.environ, "PYTHONUNBUFFERED": "1"}), log)
    for kind, (job, log) in jobs.items():
        code = job.wait()
        log.close()
        print(f"{kind}: exit {code}")
        if (Path("runs") / STABLE_RUNS[kind] / "resume.pt").exists():
            pack_run(Path("runs") / STABLE_RUNS[kind], out / f"{kind}.safetensors")


def unpack(folder: Path, runs: Path) -> None:
    for kind in MODELS:
        packed = folder / f"{kind}.safetensors"
        if not packed.exists():
            print(f"{kind}: nothing came back")
            continue
        run = runs / STABLE_RUNS[kind]
        if run.exists():
            shutil.move(run, run.with_name(f"{run.name}.before-gpu"))  # kept until the GPU segment is judged
        state = unpack_run(packed, run)
        print(f"{kind}: step {state['step']}, {state['elapsed_s'] / 60:.1f} min, last segment {state['segments'][-1]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("pack")
    p.add_argument("--data", type=Path, default=Path("data"))
    p.add_argument("--runs", type=Path, default=Path("runs"))
    d = sub.add_parser("device")
    d.add_argument("--minutes", type=float, default=7.0)
    d.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-out")))
    u = sub.add_parser("unpack")
    u.add_argument("folder", type=Path)
    u.add_argument("--runs", type=Path, default=Path("runs"))
    args = parser.parse_args()
    if args.step == "pack":
        pack(args.data, args.runs)
    elif args.step == "device":
        args.out.mkdir(parents=True, exist_ok=True)
        device(args.minutes, args.out)
    else:
        unpack(args.folder, args.runs)


if __name__ == "__main__":
    main()
