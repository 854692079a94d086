"""GLUE/ELUE fine-tuning: tasks, multi-exit methods, ACL objectives, early exit, FLOPs, ELUE score."""
