"""Training: the `train` command (`cli.py`) and what it drives — the fine-tuning loop (`trainer.py`, a short loop over
its components: `phases.py`, `dev_eval.py`, `metrics.py`, `resume.py` with `checkpoint.py`, and `run_dir.py`), the
multi-exit methods with their optimizer, schedule and DeepSpeed engine (`methods.py`), the per-exit objectives
(`objectives.py`) and ACL-Grad's gated backward (`acl_grad.py`). Scoring (`finetune.score`) and serving
(`finetune.serve`) never import from here; the trainer scores its dev sets with `finetune.score.evaluation`."""
