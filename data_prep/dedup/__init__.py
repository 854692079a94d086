"""Deduplication and decontamination, the stage before tokenizing (`python -m data_prep dedup`): exact and
near-duplicate removal across the corpora of a run (MinHash LSH) and the removal of evaluation-set n-grams, writing
the JSONL.zst text that `tokenize` reads. It owns the run and its four resumable stages (`run`: `dedup_corpus`, the
order of the stages; `stages`: the process pool they share and stage 1, signatures; `lsh`: stage 2, clusters;
`write`: stage 3, the kept text; `report`: stage 4, the report and checksums), the plan and settings (`plan`:
`DedupConfig`, `DedupRun`), text normalisation and MinHash signatures (`text`), the evaluation-set n-gram table and
its cutting rule (`evalsets`), what `tokenize` records of a dedup output it reads (`manifest`), and the `dedup`
command (`cli`). The tokenizer pipeline beside it (`data_prep.pipeline` ...) reads its output like any other input.

`dedup_corpus` is imported on first use: the run needs the MinHash library (rensa, of the `train` extra), which
`tokenize`, importing `manifest` from here, must not.
"""

from __future__ import annotations

from typing import Any

from .plan import DedupConfig, DedupRun

_RUN_NAMES = ("dedup_corpus", "run_stages", "DEDUP_OUTPUT")


def __getattr__(name: str) -> Any:
    if name in _RUN_NAMES:
        from . import run

        return getattr(run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DedupConfig", "DedupRun", "dedup_corpus"]
