"""Benchmarks of pre-training: the step, the trainer, memory, packing, the Slurm job (docs/benches.md)."""
