"""Dynamic early exit at inference: which file holds what.

- `rules.py`: the exit rules (entropy, maxprob, patience, PCEE, LTE, static), `make_rule`, `default_sweep`;
- `engine.py`: `run_batch` (samples leave the batch as their rule fires), `run_dataset`, the full-model reference
  `run_full_model`, FLOPs per sample;
- `lte.py`: BERxiT's learned exit head, its features, errors and training;
- `sweep.py`: operating points, the static curve, `SweepConfig`, `sweep`, the summary table, merging results;
- `cli.py`: the `early-exit` command.
Plots are in `finetune.plots`, ELUE scoring in `finetune.elue`, submission files in `finetune.submission`.
"""

from .engine import (
    EarlyExitResult,
    exit_histogram,
    per_sample_flops,
    run_batch,
    run_dataset,
    run_full_model,
    static_flops,
)
from .lte import LearnedExitHead, exit_errors, exit_features, train_lte_head
from .rules import (
    CLASSIFICATION_ONLY,
    STRATEGIES,
    EntropyRule,
    ExitRule,
    LearnedExitRule,
    MaxProbRule,
    PatienceRule,
    PCEERule,
    StaticRule,
    Strategy,
    default_sweep,
    entropy_nats,
    make_rule,
)
from .sweep import (
    RESULT_FORMAT,
    Reference,
    SweepConfig,
    add_speedups,
    evaluate_point,
    is_early_exit_result,
    measure_reference,
    merge_results,
    parse_thresholds,
    resolve_strategies,
    score_logits,
    static_curve,
    summary_table,
    sweep,
    write_samples,
)

__all__ = [
    "CLASSIFICATION_ONLY",
    "RESULT_FORMAT",
    "STRATEGIES",
    "EarlyExitResult",
    "EntropyRule",
    "ExitRule",
    "LearnedExitHead",
    "LearnedExitRule",
    "MaxProbRule",
    "PCEERule",
    "PatienceRule",
    "Reference",
    "StaticRule",
    "Strategy",
    "SweepConfig",
    "add_speedups",
    "default_sweep",
    "entropy_nats",
    "evaluate_point",
    "exit_errors",
    "exit_features",
    "exit_histogram",
    "is_early_exit_result",
    "make_rule",
    "measure_reference",
    "merge_results",
    "parse_thresholds",
    "per_sample_flops",
    "resolve_strategies",
    "run_batch",
    "run_dataset",
    "run_full_model",
    "score_logits",
    "static_curve",
    "static_flops",
    "summary_table",
    "sweep",
    "train_lte_head",
    "write_samples",
]
