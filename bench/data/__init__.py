"""Benchmarks of the data path: tokenising, dedup, the sample index (docs/benches.md)."""
