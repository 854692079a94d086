"""GLUE/ELUE fine-tuning of ElasticBERT, in three rooms named for their jobs: `train/` (the `train` command, the
trainer, multi-exit methods, objectives, ACL-Grad, checkpoints), `score/` (evaluation, ACL diagnostics, the ELUE score
and submission files) and `serve/` (`EarlyExitClassifier`, ONNX export and runtime, `early_exit/`); what all three
use (tasks, config, data, model, task checks, results, plots) sits here at the top. finetune/README.md maps each
file to what it holds.

The modules that lived flat in `finetune/` before the rooms were built keep their old import paths for one release:
`from finetune.predict import EarlyExitClassifier` gives the class of `finetune.serve.predict` after a
DeprecationWarning that names the new path (`common.moved_modules`; no file is left at the old path).
"""

from common.moved_modules import alias_moved_modules

MOVED_MODULES = {
    "finetune.acl_grad": "finetune.train.acl_grad",
    "finetune.checkpoint": "finetune.train.checkpoint",
    "finetune.methods": "finetune.train.methods",
    "finetune.objectives": "finetune.train.objectives",
    "finetune.run_dir": "finetune.train.run_dir",
    "finetune.trainer": "finetune.train.trainer",
    "finetune.train_cli": "finetune.train.cli",
    "finetune.diagnostics": "finetune.score.diagnostics",
    "finetune.elue": "finetune.score.elue",
    "finetune.elue_modules": "finetune.score.elue_modules",
    "finetune.evaluation": "finetune.score.evaluation",
    "finetune.submission": "finetune.score.submission",
    "finetune.diagnostics_cli": "finetune.score.cli",
    "finetune.elue_cli": "finetune.score.cli",
    "finetune.evaluate_cli": "finetune.score.cli",
    "finetune.submission_cli": "finetune.score.cli",
    "finetune.early_exit": "finetune.serve.early_exit",
    "finetune.inputs": "finetune.serve.inputs",
    "finetune.onnx_export": "finetune.serve.onnx_export",
    "finetune.onnx_graphs": "finetune.serve.onnx_graphs",
    "finetune.onnx_runtime": "finetune.serve.onnx_runtime",
    "finetune.predict": "finetune.serve.predict",
    "finetune.predict_stream": "finetune.serve.predict_stream",
    "finetune.verdicts": "finetune.serve.verdicts",
    "finetune.export_cli": "finetune.serve.cli",
    "finetune.predict_cli": "finetune.serve.cli",
}
alias_moved_modules(MOVED_MODULES)
