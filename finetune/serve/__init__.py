"""Serving: a fine-tuned model answering users' texts with early exiting — `EarlyExitClassifier` (`predict.py`, a
thin face over what it loads, `loading.py`, the input judging, `input_checks.py` and `verdicts.py`, and the engine's
stream, `predict_stream.py`), the inputs `predict` reads (`inputs.py`), the ONNX exporter (`onnx_export.py`,
`onnx_graphs.py`) and runtime (`onnx_runtime.py`), early exit itself (`early_exit/`: rules, LTE head, operating
points and the `early-exit` sweep), and the `predict`, `save-early-exit` and `export` commands (`cli.py`). Serving
never imports `finetune.train`: a server installs no trainer."""
