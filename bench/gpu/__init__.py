"""Benchmarks for a lent GPU: gpu_check.sh and what it runs (docs/benches.md)."""
