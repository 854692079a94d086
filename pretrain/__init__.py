"""Multi-exit MLM+SOP pre-training of ElasticBERT with DeepSpeed: samples, trainer, checkpoints, export."""
