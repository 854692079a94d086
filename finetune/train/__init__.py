"""Training: the `train` command (`cli.py`) and what it drives — the fine-tuning loop (`trainer.py`, a short loop over
its components: `phases.py`, `steps.py`, `dev_eval.py`, `checkpoint.py`, `run_dir.py`), the multi-exit methods and their
optimizer and schedule (`methods.py`), the per-exit objectives (`objectives.py`) and ACL-Grad's gated backward
(`acl_grad.py`). Scoring (`finetune.score`) and serving (`finetune.serve`) never import from here; the trainer uses
`finetune.score.evaluation` to score its dev sets."""
