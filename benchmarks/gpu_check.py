"""The GPU path in one call: onnxruntime-gpu installed, its CUDA provider really used, parity with the CPU, and
the real-size rows against CTranslate2 on CUDA, within a time budget.

    make gpu-check                 # python3 -m benchmarks.gpu_check [--budget-s 400] [--out PATH] [--no-install]

On a machine with an NVIDIA GPU:
1. the runtime: onnxruntime-gpu (and what the server needs) from the wheels carried in .gpu-wheels or stashed
   in /tmp/gpu-wheels (benchmarks/gpu_wheels.py), else from PyPI with pip, installed with pip --target into
   --site, put first on PYTHONPATH (a CPU-only onnxruntime installed beside it must not win), with every
   `nvidia/*/lib` of the pip CUDA packages on LD_LIBRARY_PATH; the measuring then runs in a fresh process
   with that environment;
2. the provider check: exit 2 with a message unless CUDAExecutionProvider is available and a session asked
   for it reports it first in get_providers() (a CPU-only onnxruntime once passed benchmarks.cuda_check
   with exit 0 and `"cuda": false`);
3. parity: the committed generator and translator (artifacts/) on CUDA against the CPU, teacher-forced
   greedy (benchmarks/cuda_check.py): the largest logit difference and the share of steps whose greedy
   token agrees; beyond --logit-tolerance or under --token-agreement the check fails (exit 1);
4. the real-size rows (benchmarks/gpu_rows.py): a random SmolLM2-135M-shaped model, our server on CUDA
   against CTranslate2 on CUDA (skipped, with why, where CTranslate2 cannot run on CUDA);
5. JSON to --out ($OUT/gpu_check.json where $OUT is set, else bench_results/gpu_check.json) and a table,
   printed and written beside it (.md). Steps the budget leaves no time for are recorded as skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.gpu_wheels import CUDA, CUDA_LIBRARIES, GPU_VERSION, SITE, ensure_runtime, runtime_env

REPO = Path(__file__).resolve().parent.parent
CPU = "CPUExecutionProvider"
PROBE_GRAPH = REPO / "artifacts" / "generator" / "decoder.onnx"
PARITY_ARTIFACTS = ("generator", "translator")
NO_GPU = "no NVIDIA GPU is visible here (nvidia-smi lists none)"


def default_out() -> Path:
    out = os.environ.get("OUT")  # the lent machine's folder that comes back
    return Path(out) / "gpu_check.json" if out else REPO / "bench_results" / "gpu_check.json"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=default_out())
    parser.add_argument("--budget-s", type=float, default=400.0, help="the whole run's time, installs included")
    parser.add_argument("--no-install", action="store_true", help="use the onnxruntime that is importable")
    parser.add_argument("--wheels", type=Path, action="append", help="wheel folders (default .gpu-wheels and "
                        "/tmp/gpu-wheels)")
    parser.add_argument("--site", type=Path, default=SITE, help="where the wheels are installed")
    parser.add_argument("--gpu-version", default=GPU_VERSION, help="onnxruntime-gpu, where pip installs it")
    parser.add_argument("--logit-tolerance", type=float, default=0.05, help="largest |CUDA - CPU| logit")
    parser.add_argument("--token-agreement", type=float, default=0.99, help="least share of agreeing greedy steps")
    parser.add_argument("--model", default="smollm2-135m", help="benchmarks/peers_models.py's shape of the rows")
    parser.add_argument("--rows", choices=("yes", "no"), default="yes", help="no: provider check and parity only")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests-factor", type=int, default=4, help="times each row's requests")
    parser.add_argument("--scale", type=float, default=1.0, help="the rows' prompts and new tokens (a smoke test)")
    parser.add_argument("--threads", type=int, default=min(8, os.cpu_count() or 2), help="CPU threads (build)")
    parser.add_argument("--work", type=Path, default=REPO / ".peers-cache", help="where the model is built")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a smoke test of this script's "
                        "steps without a GPU (no install, no provider check, every engine on the CPU)")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # the re-executed process
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--install-record", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# --- the first process: the GPU, the install, then the measuring process ---------------------------------------


def gpu_info() -> dict[str, str] | None:
    """The first GPU nvidia-smi lists, or None."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    line = done.stdout.strip().splitlines()[:1]
    if done.returncode != 0 or not line:
        return None
    name, driver, memory = ([*line[0].split(", "), "", ""])[:3]
    return {"name": name, "driver": driver, "memory": memory}


def prepare(args: argparse.Namespace, argv: list[str]) -> int:
    """Install what is missing, then measure in a fresh process with the environment that finds it."""
    deadline = time.time() + args.budget_s
    if args.device == "cuda" and not args.no_install and gpu_info() is None:  # nothing to install onnxruntime-gpu for
        return finish({"cuda": False, "error": f"{NO_GPU}; nothing installed"}, args)
    skip = args.no_install or args.device == "cpu"
    install = {"source": "none (--no-install or --device cpu)"} if skip else ensure_runtime(args)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(install, f)
    command = [sys.executable, "-m", "benchmarks.gpu_check", *argv, "--measure", "--deadline", str(deadline),
               "--install-record", f.name]
    env = runtime_env(args.site)
    try:
        return subprocess.run(command, env=env, cwd=REPO, timeout=max(45.0, deadline - time.time() + 45)).returncode
    except subprocess.TimeoutExpired:  # its steps are bounded by the budget: this is a hang
        return finish({"cuda": None, "error": "the measuring process outlived the budget by 45 s"}, args)
    finally:
        os.unlink(f.name)


# --- the measuring process --------------------------------------------------------------------------------------


def library_probe() -> dict[str, str]:
    """Which CUDA libraries this process's loader finds: where the CUDA provider falls back, the reason."""
    import ctypes

    found = {}
    for name in CUDA_LIBRARIES:
        try:
            ctypes.CDLL(name)
            found[name] = "loads"
        except OSError as exc:
            found[name] = str(exc)[:200]
    return found


def provider_check(ort: Any, graph: Path) -> tuple[dict[str, Any], str | None]:
    """The onnxruntime build's providers and the provider a session asked for CUDA really runs on; the
    failure, or None. `ort`: the onnxruntime module (a stand-in in tests)."""
    available = list(ort.get_available_providers())
    info: dict[str, Any] = {"onnxruntime": ort.__version__, "onnxruntime_file": str(ort.__file__),
                            "available_providers": available, "cuda": False}
    if CUDA not in available:
        return info, (f"onnxruntime {ort.__version__} ({Path(ort.__file__).parent}) has no {CUDA}: providers "
                      f"{available}. A CPU-only build: install onnxruntime-gpu (this script does unless --no-install; "
                      "offline, from the wheels of `make gpu-wheels`)")
    try:
        used = list(ort.InferenceSession(str(graph), providers=[CUDA, CPU]).get_providers())
    except Exception as exc:  # a provider that fails to load can raise instead of falling back
        return info, f"a session asked for {CUDA} failed: {str(exc).splitlines()[0][:300]}"
    info["session_providers"] = used
    if used[0] != CUDA:
        return info, (f"{CUDA} is listed but a session asked for it runs on {used[0]}: the CUDA provider did not "
                      "load (ONNX Runtime's own error is above; cuda_libraries in the JSON says which library loads)")
    return info | {"cuda": True}, None


def parity(args: argparse.Namespace, left: float) -> dict[str, Any]:
    """Each committed artifact's parity (benchmarks/cuda_check.py), judged against the thresholds."""
    from benchmarks.cuda_check import artifact_parity

    out: dict[str, Any] = {}
    started = time.time()
    for name in PARITY_ARTIFACTS:
        if time.time() - started > left - 20:
            out[name] = {"skipped": "the time budget ran out"}
            continue
        record = artifact_parity(REPO / "artifacts" / name, args.device)
        record["passed"] = (record["max_abs_logit_diff"] <= args.logit_tolerance
                            and record["greedy_token_agreement"] >= args.token_agreement)
        out[name] = record
    return out


def measure(args: argparse.Namespace, argv: list[str]) -> int:
    from benchmarks.gpu_rows import Budget

    budget = Budget(args.deadline or time.time() + args.budget_s)
    record: dict[str, Any] = {
        "command": " ".join(["python -m benchmarks.gpu_check", *argv]), "host": platform.node(),
        "machine": platform.processor() or platform.machine(), "python": platform.python_version(),
        "gpu": gpu_info(), "budget_s": args.budget_s,
        "install": json.loads(args.install_record.read_text()) if args.install_record else None,
        "cuda_libraries": library_probe(),
        "parity_thresholds": {"max_abs_logit_diff": args.logit_tolerance,
                              "greedy_token_agreement": args.token_agreement},
    }
    import onnxruntime as ort

    record["device"] = args.device
    info, record["error"] = provider_check(ort, PROBE_GRAPH) if args.device == "cuda" else ({"cuda": None}, None)
    record |= info
    if record["error"]:
        if errors := (record["install"] or {}).get("errors"):
            record["error"] += f". The install's errors: {'; '.join(errors)}"
        return finish(record, args)
    record["parity"] = parity(args, budget.left())
    if args.rows == "no":
        record["rows"] = {"skipped": "--rows no"}
    elif not budget.allows(60):
        record["rows"] = {"skipped": f"the time budget ({args.budget_s:.0f} s) ran out before the rows"}
    else:
        from benchmarks.gpu_rows import measure as measure_rows

        record["rows"] = measure_rows(args, budget)
    record["elapsed_s"] = round(args.budget_s - budget.left(), 1)
    return finish(record, args)


# --- the verdict, the JSON and the table ------------------------------------------------------------------------


def verdict(record: dict[str, Any]) -> tuple[int, list[str]]:
    """The exit status and why: 2 where CUDA is not really used (anywhere), 1 where parity is off, else 0."""
    if record.get("error"):
        return 2, [str(record["error"])]
    code, reasons = 0, list[str]()
    expected = CUDA if record.get("device", "cuda") == "cuda" else CPU
    for name, result in record.get("parity", {}).items():
        if "skipped" in result:
            continue
        if any(provider != expected for provider in result["providers"].values()):
            code, reasons = 2, [*reasons, f"{name}: the server's sessions run on {result['providers']}"]
        elif not result["passed"]:
            code = max(code, 1)
            diff, agreeing = result["max_abs_logit_diff"], result["greedy_token_agreement"]
            reasons.append(f"{name}: parity beyond the thresholds (largest |CUDA - CPU| logit {diff:.4g}, "
                           f"greedy steps agreeing {agreeing:.3f})")
    if error := record.get("rows", {}).get("error"):
        code, reasons = 2, [*reasons, str(error)]
    return code, reasons


def parity_table(parity: dict[str, Any], device: str) -> list[str]:
    head = f"| parity, {device} against CPU (teacher-forced greedy) | largest abs logit diff | mean abs logit | " \
           "greedy steps agreeing | sequences equal | passed |"
    lines = [head, "|---|---|---|---|---|---|"]
    for name, r in parity.items():
        if "skipped" in r:
            lines.append(f"| {name} | skipped: {r['skipped']} | | | | |")
            continue
        lines.append(f"| {name} | {r['max_abs_logit_diff']:.4g} | {r['mean_abs_logit']:.3g} | "
                     f"{r['greedy_token_agreement']:.3f} | {r['sequences_equal_share']:.2f} | "
                     f"{'yes' if r['passed'] else 'NO'} |")
    return lines


def rows_table(rows: dict[str, Any]) -> list[str]:
    from benchmarks.peers_engines import ROWS

    if "engines" not in rows:
        return [f"real-size rows skipped: {rows.get('skipped')}"]
    engines = rows["engines"]
    others = [e for e in engines if e != "ours"]
    ratios = others if "ours" in engines else []
    scale = "" if rows["scale"] == 1 else f" (--scale {rows['scale']:g})"
    head = [f"{rows['model']} shape, on {rows['device']}{scale}", *engines, *(f"ours / {e}" for e in ratios)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in rows["rows"]:
        key = ROWS[name].measure
        values = [engines[e].get(name, {}).get(key) for e in engines]
        cells = ["" if v is None else f"{v:,.1f}" for v in values]
        mine = engines.get("ours", {}).get(name, {}).get(key)
        for e in ratios:
            theirs = engines[e].get(name, {}).get(key)
            cells.append(f"{mine / theirs:.2f}" if mine and theirs else "")
        lines.append("| " + " | ".join([ROWS[name].label, *cells]) + " |")
    return lines + [f"skipped {engine}: {why}" for engine, why in rows["skipped"].items()]


def table(record: dict[str, Any]) -> str:
    gpu = record.get("gpu") or {}
    used = {"True": "yes", "False": "NO"}.get(str(record.get("cuda")), "unknown")
    lines = [f"GPU: {gpu.get('name', 'none')} (driver {gpu.get('driver', '-')}, {gpu.get('memory', '-')}); "
             f"onnxruntime {record.get('onnxruntime', '-')}; {CUDA} in use: {used}"]
    if record.get("parity"):
        lines += ["", *parity_table(record["parity"], record.get("device", "cuda"))]
    if record.get("rows"):
        lines += ["", *rows_table(record["rows"])]
    if record.get("failures"):
        lines += ["", *(f"FAILED: {reason}" for reason in record["failures"])]
    return "\n".join(lines)


def finish(record: dict[str, Any], args: argparse.Namespace) -> int:
    """Write the JSON and the table (.md beside it), print the table; the exit status."""
    code, record["failures"] = verdict(record)
    record["status"] = "passed" if code == 0 else "failed"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2, default=str) + "\n")
    text = table(record)
    args.out.with_suffix(".md").write_text(text + "\n")
    print(f"\n{text}\n\nwrote {args.out}", flush=True)
    if code:
        print("GPU CHECK FAILED: " + "; ".join(record["failures"]), file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if args.measure:
        return measure(args, argv[: argv.index("--measure")])
    return prepare(args, argv)


if __name__ == "__main__":
    sys.exit(main())
