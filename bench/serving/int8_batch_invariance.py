"""Batch-invariant int8 on ONNX Runtime, measured: one exported layer piece, three ways, side by side.

`finetune export --format onnx` writes each layer's int8 piece with activations quantized per call with one scale per
token (`finetune.serve.onnx_export.per_token_int8`). The common route, `onnxruntime.quantization.quantize_dynamic` (what
the export wrote before, and what the bench's full-model ORT int8 row uses), takes one scale per tensor, over the whole
batch, so an input's logits move with the inputs it is batched with: on MRPC dev by up to 1.06, enough that the
serving bench's threshold had to fall from τ 0.46 to 0.26 to keep 1 point of accuracy in every batching. This bench
shows what per token costs and buys, on one layer of an export, against that piece rebuilt with `quantize_dynamic`:

- error against fp32 (max |Δ hidden|) and batch dependence (max |Δ| of the first input alone vs inside the batch);
- ms per run at batch 1 (a request), 32 short rows, 8 long rows; best of `--rounds` interleaved rounds.

Real inputs: dev sentences through the export's tokenizer and first step (the layer measured is a later step without
its exit head, `onnx.utils.extract_model`).

    .venv/bin/python bench/serving/int8_batch_invariance.py --export exports/sst2_onnx --task SST-2
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: bench.harness and the packages

from bench.harness import GLUE_DIR, write_result  # noqa: E402
from bench.harness import ort_session as session  # noqa: E402
from finetune.tasks import get_task, load_split  # noqa: E402

PER_TENSOR = "int8 per tensor (quantize_dynamic)"


def hidden_states(export: Path, texts: list[str], rows: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """`rows` dev texts through the export's tokenizer and first step (embeddings and layer 0, fp32), padded or cut
    to `length` tokens: the hidden states layer 1 reads."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(export / "tokenizer.json"))
    tokenizer.enable_truncation(length)
    tokenizer.enable_padding(length=length)
    encodings = tokenizer.encode_batch(texts[:rows])
    ids = np.array([e.ids for e in encodings], dtype=np.int64)
    mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
    first = session(export / "onnx" / "step_0.onnx")
    feeds = {"input_ids": ids, "token_type_ids": np.zeros_like(ids), "mask": mask, "exit_rows": np.zeros(1, np.int64)}
    wanted = {i.name for i in first.get_inputs()}
    return first.run(["hidden_out"], {k: v for k, v in feeds.items() if k in wanted})[0], mask


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--export", type=Path, required=True, help="a `finetune export --format onnx` directory")
    parser.add_argument("--task", default="SST-2", help="GLUE task whose dev sentences feed the layer")
    parser.add_argument("--layer", type=int, default=1, help="a layer after the first (the first reads token ids)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    from onnx.utils import extract_model
    from onnxruntime.quantization import QuantType, quantize_dynamic

    pieces = args.export / "onnx"
    steps = pieces / f"step_{args.layer}.onnx", pieces / f"step_{args.layer}.int8.onnx"
    manifest = json.loads((pieces / "manifest.json").read_text()) if (pieces / "manifest.json").is_file() else {}
    if args.layer < 1 or not all(p.is_file() for p in steps) or not str(manifest.get("int8", "")).startswith("per-"):
        sys.exit(f"{args.export}: no step {args.layer} with per-token int8 (finetune export --format onnx, format 2)")
    with tempfile.TemporaryDirectory() as work:
        fp32, int8, per_tensor = (Path(work) / name for name in ("fp32.onnx", "int8.onnx", "per_tensor.onnx"))
        for step, layer in zip(steps, (fp32, int8)):  # the layer alone: the step without its exit head
            extract_model(str(step), str(layer), ["hidden", "mask"], ["hidden_out"])
        quantize_dynamic(str(fp32), str(per_tensor), weight_type=QuantType.QInt8, per_channel=True)
        sessions = {"fp32": session(fp32), PER_TENSOR: session(per_tensor), "int8 per token (export)": session(int8)}
    texts = [e.text_a for e in load_split(get_task(args.task), GLUE_DIR, "dev")]

    hidden, mask = hidden_states(args.export, texts, 32, 48)
    reference = sessions["fp32"].run(None, {"hidden": hidden, "mask": mask})[0]
    print(f"layer {args.layer} of {args.export}, 32 {args.task} dev sentences (48 tokens):")
    figures: dict = {name: {} for name in sessions}
    for name, s in sessions.items():
        batch = s.run(None, {"hidden": hidden, "mask": mask})[0]
        alone = s.run(None, {"hidden": hidden[:1], "mask": mask[:1]})[0]
        figures[name]["error_vs_fp32"] = float(np.abs(batch - reference).max())
        figures[name]["batch_dependence"] = float(np.abs(batch[:1] - alone).max())
        print(
            f"  {name:34s} max |Δ| vs fp32 {figures[name]['error_vs_fp32']:.4f}   "
            f"first input alone vs in the batch {figures[name]['batch_dependence']:.2e}"
        )
    shapes = {"batch 1 × 24 tokens": (1, 24), "batch 32 × 30": (32, 30), "batch 8 × 128": (8, 128)}
    feeds = {
        label: dict(zip(("hidden", "mask"), hidden_states(args.export, texts, *shape)))
        for label, shape in shapes.items()
    }
    best = {(label, name): np.inf for label in shapes for name in sessions}
    for _ in range(args.rounds):
        for label, feed in feeds.items():
            repeats = 200 if shapes[label][0] == 1 else 20
            for name, s in sessions.items():
                s.run(None, feed)
                start = time.perf_counter()
                for _ in range(repeats):
                    s.run(None, feed)
                best[label, name] = min(best[label, name], (time.perf_counter() - start) / repeats)
    print("ms per run (best of rounds; × int8 per tensor):")
    for label in shapes:
        base = best[label, PER_TENSOR]
        cells = "   ".join(
            f"{name} {1e3 * best[label, name]:.3f} ({best[label, name] / base:.2f}×)" for name in sessions
        )
        print(f"  {label:20s} {cells}")
        for name in sessions:
            figures[name].setdefault("ms", {})[label] = 1e3 * best[label, name]
    if args.json is not None:
        write_result(args.json, figures, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
