"""Benchmark workloads and harness. Results land in BENCHMARKS.md (see report.py)."""
