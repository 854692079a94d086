"""Dynamic early exit at inference: which file holds what.

The inference core - the rule table (`elasticbert.exit_setting.RULES`: every rule's name, threshold range, factory),
the rules that need no trained side model (entropy, maxprob, patience, PCEE, static) and the batched engine
`run_batch` - is `elasticbert.early_exit` (the model's own forward runs it when its config carries an early-exit
setting, `elasticbert.EarlyExitSetting`, the one record of a rule's parameters); it is re-exported here, with what
fine-tuning adds:
- `rules.py`: the LTE rule, registered into that table;
- `engine.py`: `run_dataset` (the engine over a split's batches), the full-model reference `run_full_model`, static
  FLOPs (and the engine's re-exports);
- `lte.py`: BERxiT's learned exit head, its features, errors and training;
- `sweep.py`: operating points, the static curve, `SweepConfig`, `sweep`, the summary table, merging results;
- `operating_point.py`: choosing one point of a result by a rule (`fastest-within=1.0`, `best`, `entropy=0.2`);
- `cli.py`: the `early-exit` command.
Plots are in `finetune.plots`, ELUE scoring in `finetune.score.elue`, submission files in `finetune.score.submission`,
predictions on users' texts in `finetune.serve.predict` (`EarlyExitClassifier`) and `finetune.serve.cli`.
"""

from elasticbert.early_exit import (
    EntropyRule,
    ExitRule,
    MaxProbRule,
    PatienceRule,
    PCEERule,
    StaticRule,
    entropy_nats,
    make_rule,
    rule_for,
)
from elasticbert.exit_setting import EarlyExitSetting, default_sweep

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
from .operating_point import OperatingPoint, choose_operating_point, load_result
from .rules import PREDICT_STRATEGIES, STRATEGIES, LearnedExitRule
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
    "PREDICT_STRATEGIES",
    "RESULT_FORMAT",
    "STRATEGIES",
    "EarlyExitResult",
    "EarlyExitSetting",
    "EntropyRule",
    "ExitRule",
    "LearnedExitHead",
    "LearnedExitRule",
    "OperatingPoint",
    "MaxProbRule",
    "PCEERule",
    "PatienceRule",
    "Reference",
    "StaticRule",
    "SweepConfig",
    "add_speedups",
    "choose_operating_point",
    "default_sweep",
    "entropy_nats",
    "evaluate_point",
    "exit_errors",
    "exit_features",
    "exit_histogram",
    "is_early_exit_result",
    "load_result",
    "make_rule",
    "measure_reference",
    "merge_results",
    "parse_thresholds",
    "per_sample_flops",
    "resolve_strategies",
    "rule_for",
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
