"""The benchmark programs: each prints a table and writes JSON under bench_results/ (docs/benchmarks.md)."""
