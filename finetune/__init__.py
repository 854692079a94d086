"""GLUE/ELUE fine-tuning: tasks, multi-exit methods, ACL objectives, early exit, FLOPs, ELUE score and submission
files. finetune/README.md maps each file to what it holds."""
