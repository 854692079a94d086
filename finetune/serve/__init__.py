"""Serving: a fine-tuned model answering users' texts with early exiting — `EarlyExitClassifier` (`predict.py`, a
thin face over the engine in `predict_stream.py` and the input judging in `inputs.py` and `verdicts.py`), the ONNX
exporter (`onnx_export.py`, `onnx_graphs.py`) and runtime (`onnx_runtime.py`), early exit itself (`early_exit/`: the
engine, rules, LTE head, operating points and the `early-exit` sweep), and the `predict`, `save-early-exit` and
`export` commands (`cli.py`). Serving never imports `finetune.train`: a server installs no trainer."""
