"""Benchmarks of early exit and serving on a CPU: eager, int8, ONNX Runtime (docs/benches.md)."""
