"""The one-file early-exit model against our Python engine on real dev rows (issue 60's "same answers", at the size CI
cannot afford: tests/finetune_early_exit/test_onnx_single_file.py checks the same on 32 rows).

For each fine-tuned model and rule (entropy, maxprob, patience, PCEE; each at a threshold where rows leave at several
exits: the median of its first exit's score on these rows), on the first `--rows` dev rows of its task, at batch 1
(each row alone, unpadded) and 32 (dev order, padded to each batch's longest row):

- fp32: the file (`onnx_single`, fp32) against the eager engine (`elasticbert.early_exit.run_batch`): labels, exit
  layers and FLOPs equal, probabilities within 1e-5;
- int8: the file (per-token int8) against the same engine on the export's per-layer int8 pieces (`OnnxLayers`):
  labels, exit layers, FLOPs equal, probabilities within 1e-5.

    .venv/bin/python bench/serving_one_file.py --model SST-2=RUN1/best --model MRPC=RUN2/best --rows 400 \\
        --output docs/results/onnx_single_file/equality.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from elasticbert.early_exit import (  # noqa: E402
    EarlyExitSetting,
    entropy_nats,
    make_rule,
    per_sample_flops,
    run_batch,
)
from experiments.common import GLUE_DIR  # noqa: E402
from finetune.data import EncodedSplit, load_tokenizer  # noqa: E402
from finetune.model import exit_logits, load_finetuned  # noqa: E402
from finetune.serve.predict import trained_max_length  # noqa: E402
from finetune.tasks import get_task, load_split  # noqa: E402


def settings(model, split: EncodedSplit) -> dict[str, EarlyExitSetting]:
    """A setting per rule at the median of its first exit's score on `split` (rows leave at several exits)."""
    with torch.inference_mode():
        out = model(split.input_ids, attention_mask=split.attention_mask, token_type_ids=split.token_type_ids)
    logits = exit_logits(out)[0]
    entropy = entropy_nats(logits)
    k = logits.shape[-1]
    return {
        "entropy": EarlyExitSetting("entropy", round(float(entropy.median()), 4)),
        "maxprob": EarlyExitSetting("maxprob", round(float(torch.softmax(logits, -1).amax(-1).median()), 4)),
        "patience": EarlyExitSetting("patience", 2),
        "pcee": EarlyExitSetting("pcee", round(float((entropy / math.log(k)).median()), 4), patience=2),
    }


def batches(split: EncodedSplit, batch: int):
    for start in range(0, len(split), batch):
        rows = slice(start, start + batch)
        longest = int(split.lengths[rows].max())
        yield tuple(t[rows, :longest] for t in (split.input_ids, split.attention_mask, split.token_type_ids))


def compare(session, engine, split: EncodedSplit, rule_factory, config, batch: int) -> dict:
    """Counts of rows whose label / exit layer / FLOPs differ, the largest probability difference, the exits."""
    differ = {"label": 0, "exit_layer": 0, "flops": 0}
    worst, layers = 0.0, []
    for ids, mask, types in batches(split, batch):
        reference = run_batch(engine, ids, mask, types, rule_factory())
        feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": types.numpy()}
        got = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
        differ["label"] += int((got["label"] != reference.predictions.numpy()).sum())
        differ["exit_layer"] += int((got["exit_layer"] != reference.exit_layers.numpy()).sum())
        flops = per_sample_flops(config, reference)[0].astype(np.int64)
        differ["flops"] += int((got["flops"] != flops).sum())
        probabilities = torch.softmax(reference.logits.double(), -1).numpy()
        worst = max(worst, float(np.abs(got["probabilities"] - probabilities).max()))
        layers += reference.exit_layers.tolist()
    histogram = {str(layer): layers.count(layer) for layer in sorted(set(layers))}
    return {"rows": len(split), "differ": differ, "max_probability_difference": worst, "exits": histogram}


def check_task(task_name: str, model_dir: Path, rows: int) -> dict:
    import onnxruntime as ort

    from finetune.serve.onnx_export import export_onnx, trace_pieces
    from finetune.serve.onnx_runtime import OnnxLayers
    from finetune.serve.onnx_single import rule_plan, single_file, single_metadata

    task = get_task(task_name)
    examples = load_split(task, GLUE_DIR, "dev")[:rows]
    split = EncodedSplit.from_examples(load_tokenizer(model_dir), examples, trained_max_length(model_dir))
    model = load_finetuned(model_dir, require_trained=True).eval()
    model.config.early_exit = None
    traced = trace_pieces(model)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.log_severity_level = 1, 3
    out: dict = {}
    with tempfile.TemporaryDirectory() as work:
        export = Path(work) / "export"
        export_onnx(model_dir, export, max_length=trained_max_length(model_dir))
        engines = {"fp32": model, "int8": OnnxLayers(export, "int8", threads=1)}
        for name, setting in settings(model, split).items():
            plan = rule_plan(setting, model.config.num_labels)
            metadata = single_metadata(model.config, setting, plan, list(model.exit_layers), 128)
            for precision, engine in engines.items():
                proto = single_file(traced, precision, plan, model.config, metadata)
                session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])

                def rule(s=setting):
                    return make_rule(s.strategy, s.threshold, model.config.num_labels, patience=s.patience)

                for batch in (1, 32):
                    key = f"{name} τ={setting.threshold} {precision} b{batch}"
                    out[key] = compare(session, engine, split, rule, model.config, batch)
                    print(f"{task_name} {key}: {out[key]}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", required=True, metavar="TASK=DIR")
    parser.add_argument("--rows", type=int, default=400)
    parser.add_argument("--output", type=Path, default=None, help="write the results here (JSON)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = {}
    for spec in args.model:
        task, _, directory = spec.partition("=")
        results[task] = check_task(task, Path(directory), args.rows)
    failed = [
        f"{task} {key}"
        for task, cells in results.items()
        for key, cell in cells.items()
        if any(cell["differ"].values()) or cell["max_probability_difference"] > 1e-5
    ]
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps({"results": results, "failed": failed}, indent=1), encoding="utf-8")
    print("every cell equal" if not failed else f"DIFFERENT: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
