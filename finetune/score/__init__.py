"""Scoring: the commands that measure a fine-tuned model (`cli.py`: `evaluate`, `plot-angles`, `plot-embeddings`,
`elue-score`, `submission`) and their libraries — per-exit dev scores and GLUE/ELUE test prediction files
(`evaluation.py`), the ACL diagnostics' arrays (`diagnostics.py`), the ELUE score (`elue.py`) and ELUE submission files
(`submission.py`, with the per-task ELUE rules in `elue_modules.py`). It runs models through the early-exit engine of
`finetune.serve.early_exit` and never imports `finetune.train`."""
