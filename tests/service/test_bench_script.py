"""Keep benchmarks/serving.py from rotting: its in-process part runs on the tiny artifacts."""

from pathlib import Path

from benchmarks.http_load import Cell
from benchmarks.serving import kv_cache_vs_recompute, table


def test_kv_cache_vs_recompute_agree(tiny_artifacts: Path) -> None:
    result = kv_cache_vs_recompute(tiny_artifacts, threads=1, prompt_len=8, new_tokens=6)
    assert result["new_tokens"] == 6 and result["speedup"] > 0  # the function asserts equal tokens itself


def test_summary_and_table() -> None:
    cell = Cell("classify", 8, 4, 2.0, latencies=[0.1, 0.2, 0.3, 0.4], tokens=0)
    row = cell.summary()
    assert row["requests_per_s"] == 2.0 and row["p50_ms"] == 250.0 and row["tokens_per_s"] is None
    assert table([row]).splitlines()[2].startswith("| classify | 8 | 2.0 |")
