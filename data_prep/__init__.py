"""Corpus -> tokenizer -> sharded memory-mapped token files (.bin/.idx) -> manifest; verify."""
