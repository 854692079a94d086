"""Multi-exit MLM+SOP pre-training of ElasticBERT with DeepSpeed: config, corpora and samples, model setup, the
training loop, checkpoints, export (module map: pretrain/README.md). Uses `data_prep`, `elasticbert` and `common`."""
