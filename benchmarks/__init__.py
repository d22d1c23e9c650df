"""Benchmark scripts: each prints a markdown table and writes JSON rows (see benchmarks/README.md)."""
