"""Eager int8 (`--precision int8` on torch, `elasticbert.precision`): per-token activation scales against torch's
`quantize_dynamic` (one scale per call over the whole batch: what eager int8 was before), on one fine-tuned model,
side by side in one process:

- batch dependence: each of `--rows` dev sentences answered alone (batch 1, its own length) and inside batches of 32
  (padded to the batch's longest) by the early-exit engine (`run_batch`, entropy at `--threshold`, default the median
  first-exit entropy of fp32 on these rows: exits spread over the layers): how many labels and exit layers differ;
- closeness to fp32: the full model's labels that differ from fp32's, and dev accuracy of the full model;
- speed: the full model's forward over the same rows at batch 1 (each row alone) and 32, best of `--rounds` rounds,
  the three models interleaved within each round (the machine is shared), and the ratio per token ÷ per tensor.

    python bench/int8_eager_per_token.py --model RUN/best --task SST-2 --rows 400 --rounds 3 [--json OUT]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from elasticbert.early_exit import entropy_nats  # noqa: E402
from elasticbert.precision import for_inference, quantized_engine  # noqa: E402
from experiments.common import GLUE_DIR  # noqa: E402
from finetune.data import EncodedSplit, load_tokenizer  # noqa: E402
from finetune.model import exit_logits, load_finetuned  # noqa: E402
from finetune.serve.early_exit import make_rule, run_batch  # noqa: E402
from finetune.tasks import get_task, load_split  # noqa: E402

PER_TENSOR, PER_TOKEN = "int8 per tensor (quantize_dynamic)", "int8 per token"


def per_tensor_int8(model: nn.Module) -> nn.Module:
    """The encoder's linear layers through `quantize_dynamic` (per-channel weights, one activation scale per call):
    eager int8 as `elasticbert.precision` made it before per-token scales."""
    quantized = copy.deepcopy(model).eval()
    torch.backends.quantized.engine = quantized_engine()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = {nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}
        torch.ao.quantization.quantize_dynamic(quantized.elasticbert.encoder.layer, config, inplace=True)
    return quantized


def rows_alone(split: EncodedSplit) -> list[tuple[torch.Tensor, ...]]:
    columns = (split.input_ids, split.attention_mask, split.token_type_ids)
    return [tuple(t[i : i + 1, :n] for t in columns) for i, n in enumerate(split.lengths.tolist())]


def batches_of(split: EncodedSplit, size: int) -> list[tuple[torch.Tensor, ...]]:
    """Rows in file order, `size` at a time, padded to each batch's longest (as a caller's batch is)."""
    out = []
    for start in range(0, len(split), size):
        longest = int(split.lengths[start : start + size].max())
        columns = (split.input_ids, split.attention_mask, split.token_type_ids)
        out.append(tuple(t[start : start + size, :longest] for t in columns))
    return out


@torch.inference_mode()
def early_exit_answers(model: nn.Module, parts: list[tuple[torch.Tensor, ...]], rule) -> tuple[list, list]:
    """(labels, exit layers) of every row, through the early-exit engine, part by part."""
    labels, layers = [], []
    for ids, mask, types in parts:
        result = run_batch(model, ids, mask, types, rule)
        labels += result.logits.argmax(-1).tolist()
        layers += result.exit_layers.tolist()
    return labels, layers


@torch.inference_mode()
def full_labels(model: nn.Module, parts: list[tuple[torch.Tensor, ...]]) -> list[int]:
    return [
        label
        for ids, mask, types in parts
        for label in exit_logits(model(ids, attention_mask=mask, token_type_ids=types))[-1].argmax(-1).tolist()
    ]


@torch.inference_mode()
def seconds(model: nn.Module, parts: list[tuple[torch.Tensor, ...]]) -> float:
    start = time.perf_counter()
    for ids, mask, types in parts:
        model(ids, attention_mask=mask, token_type_ids=types)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="a fine-tuned model directory (RUN/best)")
    parser.add_argument("--task", default="SST-2")
    parser.add_argument("--data-dir", type=Path, default=GLUE_DIR)
    parser.add_argument("--rows", type=int, default=400, help="dev rows (the first ones)")
    parser.add_argument("--threshold", type=float, default=None, help="entropy threshold, nats (default: see above)")
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    task = get_task(args.task)
    fp32 = load_finetuned(args.model).eval()
    models = {"fp32": fp32, PER_TENSOR: per_tensor_int8(fp32), PER_TOKEN: for_inference(fp32, "int8")}
    examples = load_split(task, args.data_dir, "dev")[: args.rows]
    split = EncodedSplit.from_examples(load_tokenizer(args.model), examples, args.max_length)
    alone, batched = rows_alone(split), batches_of(split, 32)
    tau = args.threshold
    if tau is None:
        with torch.inference_mode():
            first = torch.cat([exit_logits(fp32(*part[:1], attention_mask=part[1]))[0] for part in batched])
        tau = float(entropy_nats(first).median())
    rule = make_rule("entropy", tau, task.num_labels)
    gold = [e.label for e in examples]
    reference = full_labels(fp32, batched)
    figures: dict = {"rows": len(examples), "threshold_nats": tau, "models": {}}
    print(f"{args.model}, {len(examples)} {task.name} dev rows, entropy τ {tau:.4f} nats, 1 thread")
    for name, model in models.items():
        labels_1, layers_1 = early_exit_answers(model, alone, rule)
        labels_32, layers_32 = early_exit_answers(model, batched, rule)
        full = full_labels(model, batched)
        entry = {
            "labels_differ_batch1_vs_32": sum(a != b for a, b in zip(labels_1, labels_32)),
            "exit_layers_differ_batch1_vs_32": sum(a != b for a, b in zip(layers_1, layers_32)),
            "full_model_labels_differ_from_fp32": sum(a != b for a, b in zip(full, reference)),
            "full_model_accuracy": 100 * sum(a == b for a, b in zip(full, gold)) / len(gold),
        }
        figures["models"][name] = entry
        print(
            f"  {name:36s} batch 1 vs 32: {entry['labels_differ_batch1_vs_32']} labels, "
            f"{entry['exit_layers_differ_batch1_vs_32']} exit layers differ; full model: "
            f"{entry['full_model_labels_differ_from_fp32']} labels differ from fp32, "
            f"accuracy {entry['full_model_accuracy']:.2f}"
        )
    best = {(name, b): float("inf") for name in models for b in ("batch 1", "batch 32")}
    for _ in range(args.rounds):  # interleaved: every model once per round, at both batch sizes
        for name, model in models.items():
            best[name, "batch 1"] = min(best[name, "batch 1"], seconds(model, alone))
            best[name, "batch 32"] = min(best[name, "batch 32"], seconds(model, batched))
    print(f"full-model forward over the {len(examples)} rows, best of {args.rounds} interleaved rounds:")
    for b in ("batch 1", "batch 32"):
        cells = "   ".join(f"{name} {best[name, b]:.2f} s" for name in models)
        ratio = best[PER_TOKEN, b] / best[PER_TENSOR, b]
        print(f"  {b:9s} {cells}   per token ÷ per tensor {ratio:.2f}×")
        figures[f"seconds_{b.replace(' ', '')}"] = {name: best[name, b] for name in models}
        figures[f"per_token_over_per_tensor_{b.replace(' ', '')}"] = ratio
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
