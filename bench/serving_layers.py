"""Batch 1, layer by layer: what each layer (+ its exit) costs in eager torch fp32, eager torch int8, and as its own
ONNX Runtime session (fp32, int8) — the early-exit engine's unit of work. A prototype measurement for the serving
path's batch-1 shortfall (docs/serving.md); the engine itself runs eager torch.

    .venv/bin/python bench/serving_layers.py --model RUN/best --task SST-2 --examples 200

Every configuration runs all layers and exits of each dev sentence at batch 1 (no exit taken, so every configuration
does the same work); rounds are interleaved and the best of `--rounds` is kept. The ORT fp32 blocks are checked
against eager fp32 (max |Δ logits| printed), so the export is the model.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from elasticbert.precision import for_inference  # noqa: E402
from experiments.common import GLUE_DIR  # noqa: E402
from finetune.data import EncodedSplit, load_tokenizer  # noqa: E402
from finetune.model import load_finetuned  # noqa: E402
from finetune.tasks import get_task, load_split  # noqa: E402


class LayerAndExit(nn.Module):
    """Layer `index` and the exit on top of it: (hidden states, exit logits) from (hidden states, 1/0 mask)."""

    def __init__(self, model: nn.Module, index: int) -> None:
        super().__init__()
        self.model, self.index = model, index

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor):
        hidden = self.model.elasticbert.encoder.run_layer(self.index, hidden, mask[:, None, None, :].bool())
        return hidden, self.model.classify(self.index + 1, hidden, mask)[1]


def ort_blocks(model: nn.Module, work: Path, threads: int) -> dict[str, list]:
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    work.mkdir(parents=True, exist_ok=True)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sessions: dict[str, list] = {"ORT fp32": [], "ORT int8": []}
    d = model.config.hidden_size
    for index in range(model.exit_layers[-1]):
        fp32, int8 = work / f"layer{index}.onnx", work / f"layer{index}_int8.onnx"
        if not int8.is_file():
            torch.onnx.export(
                LayerAndExit(model, index).eval(),
                (torch.randn(2, 8, d), torch.ones(2, 8, dtype=torch.long)),
                str(fp32),
                input_names=["hidden", "mask"],
                output_names=["out", "logits"],
                dynamic_axes={"hidden": {0: "b", 1: "t"}, "mask": {0: "b", 1: "t"}, "out": {0: "b", 1: "t"}},
                opset_version=17,
                dynamo=False,
            )
            quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8, per_channel=True)
        for name, path in (("ORT fp32", fp32), ("ORT int8", int8)):
            sessions[name].append(ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]))
    return sessions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--task", default="SST-2")
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/serving_layers"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load_finetuned(args.model, require_trained=True).eval()
    int8 = for_inference(model, "int8")
    examples = load_split(get_task(args.task), GLUE_DIR, "dev")[: args.examples]
    split = EncodedSplit.from_examples(load_tokenizer(args.model), examples, args.max_length)
    samples = []
    with torch.inference_mode():
        for i in range(len(split)):
            n = int(split.lengths[i])
            ids, types = split.input_ids[i : i + 1, :n], split.token_type_ids[i : i + 1, :n]
            samples.append((model.elasticbert.embeddings(ids, types, None), torch.ones(1, n, dtype=torch.long)))
    sessions = ort_blocks(model, args.work_dir, args.threads)
    layers = model.exit_layers[-1]

    def eager(m: nn.Module):
        def run(hidden, mask):
            logits = []
            for index in range(layers):
                hidden = m.elasticbert.encoder.run_layer(index, hidden, None)  # batch 1: no padding, no mask
                logits.append(m.classify(index + 1, hidden, None)[1])
            return logits

        return run

    def ort_run(blocks):
        def run(hidden, mask):
            h, m, logits = hidden.numpy(), mask.numpy(), []
            for block in blocks:
                h, lg = block.run(None, {"hidden": h, "mask": m})
                logits.append(lg)
            return logits

        return run

    configs = {
        "torch fp32": eager(model),
        "torch int8": eager(int8),
        "ORT fp32": ort_run(sessions["ORT fp32"]),
        "ORT int8": ort_run(sessions["ORT int8"]),
    }
    with torch.inference_mode():
        worst = max(
            float(np.abs(np.asarray(o) - r.numpy()).max())
            for h, m in samples[:20]
            for o, r in zip(configs["ORT fp32"](h, m), configs["torch fp32"](h, m))
        )
        best = dict.fromkeys(configs, float("inf"))
        for _ in range(args.rounds):
            for name, run in configs.items():
                start = time.perf_counter()
                for hidden, mask in samples:
                    run(hidden, mask)
                best[name] = min(best[name], time.perf_counter() - start)
    per_layer = {name: seconds / len(samples) / layers * 1e6 for name, seconds in best.items()}
    print(f"{args.task}: {len(samples)} sentences at batch 1, {layers} layers + exits each, {args.threads} thread(s)")
    print(f"ORT fp32 blocks vs eager fp32: max |Δ logits| {worst:.2e}")
    for name, us in per_layer.items():
        print(f"  {name:10s} {us:7.0f} µs per layer + exit   ×{per_layer['torch int8'] / us:.2f} vs torch int8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
