"""Benchmarks of fine-tuning: the step per method, ACL (docs/benches.md)."""
