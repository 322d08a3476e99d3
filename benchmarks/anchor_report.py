"""The anchor's results: the rounds summarized per row (medians of each engine's figure and of the ratios
taken within each round), the Markdown table, and what the record says about the machine and the versions."""

from __future__ import annotations

import json
import platform
import statistics
from pathlib import Path
from typing import Any

from benchmarks.anchor_engines import ROWS
from benchmarks.anchor_shapes import Shapes


def summarize(rounds: list[dict[str, Any]], rows: list[str], shapes: Shapes) -> dict[str, Any]:
    def med(values: list[float | None], digits: int) -> float | None:
        numbers = [v for v in values if v is not None]  # an engine measured in one round is measured in all
        return None if values[0] is None else round(statistics.median(numbers), digits)

    out: dict[str, Any] = {}
    for key in rows:
        workload, unit, concurrency = ROWS[key].workload, ROWS[key].unit, ROWS[key].concurrency
        per = [r[key] for r in rounds]
        lengths = per[-1]["lengths"]
        out[key] = {
            "workload": workload, "unit": unit, "concurrency": concurrency,
            **{e: med([p[e] for p in per], 1) for e in ("ours", "engine", "ct2", "hf", "floor")},
            **{k: med([p[k] for p in per], 3)
               for k in ("ours_per_ct2", "ours_per_hf", "engine_per_ct2", "ceiling_per_ct2")},
            # The spread of the per-round ratio: how far one round's ratio can be from the median here.
            "ours_per_ct2_range": [round(min(p["ours_per_ct2"] for p in per), 3),
                                   round(max(p["ours_per_ct2"] for p in per), 3)],
            "output_tokens": lengths,
            "other_cores_max": max(p["other_cores"] for p in per),
            "equal_lengths": len({json.dumps(v) for v in lengths.values() if v is not None}) == 1,
        }
    itl = [r["inter_token_ms"] for r in rounds if "inter_token_ms" in r]
    if itl:
        p50, p99 = (statistics.median(x[q] for x in itl) for q in ("p50", "p99"))
        out["inter_token_latency_c16"] = {"workload": "inter-token latency, 16 streams", "unit": "ms",
                                          "p50": round(p50, 2), "p99": round(p99, 2),
                                          "p99_per_p50": round(p99 / p50, 2) if p50 >= 0.01 else None}
    return out


def table(summary: dict[str, Any]) -> str:
    lines = ["| workload | ours, through HTTP | CTranslate2 | HF eager | ours / CT2 | its rounds | "
             "ceiling over HTTP / CT2 | ours / HF | our engine in process / CT2 | lengths equal | other cores |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, r in summary.items():
        if key.startswith("inter_token"):
            lines.append(f"| {r['workload']} | p50 {r['p50']} ms, p99 {r['p99']} ms | | | | | | | | "
                         f"p99/p50 {r['p99_per_p50']} | |")
            continue

        def fmt(v: float | None) -> str:
            return "-" if v is None else f"{v:,.1f}"

        def ratio(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f}"

        lines.append(f"| {r['workload']} | {fmt(r['ours'])} {r['unit']} | {fmt(r['ct2'])} | {fmt(r['hf'])} | "
                     f"{ratio(r['ours_per_ct2'])} | {'-'.join(ratio(v) for v in r['ours_per_ct2_range'])} | "
                     f"{ratio(r['ceiling_per_ct2'])} | "
                     f"{ratio(r['ours_per_hf'])} | {ratio(r['engine_per_ct2'])} | "
                     f"{'yes' if r['equal_lengths'] else 'NO'} | "
                     f"{r['other_cores_max']} |")
    return "\n".join(lines)


def cpu_model() -> str:
    """The processor, as far as the machine tells: its name, family and model, and its widest vector
    extension (the ratios move with it: a virtual machine may say only "AMD EPYC", and CTranslate2's int8
    kernels ran slower than its float32 ones on one such machine and faster on another)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    first = text.split("\n\n", 1)[0].splitlines()  # the first processor's block
    field = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in first)}
    flags = set(field.get("flags", "").split())
    vectors = next((f for f in ("avx512f", "avx2", "avx", "sse4_2") if f in flags), "none")
    return (f"{field.get('model name', platform.processor())} (family {field.get('cpu family', '?')}, "
            f"model {field.get('model', '?')}, {vectors})")


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("ctranslate2", "onnxruntime", "torch", "transformers"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "absent"
    return out
