"""Does early exit turn saved FLOPs into saved time?  wall-time speed-up ÷ FLOPs speed-up, batch 1 and batch 32, CPU.

For one fine-tuned multi-exit model and a real dev set, three operating points of one rule (default: entropy) are
timed against the full model's own forward on the same length-sorted batches. Timing is paired per batch: each batch
runs the reference and every operating point back to back, `--rounds` times, and the minimum per (batch, config) is
summed. On a shared machine load changes over seconds, so pairing at the millisecond scale keeps both sides under the
same conditions. Process CPU time is reported beside wall time as a cross-check. Target: ratio >= 0.9 everywhere.

    .venv/bin/python bench/serving/early_exit.py --model runs/sst2-jt/best --task SST-2

Operating points: by default the thresholds of a quick sweep whose FLOPs speed-up is nearest 1.5x, 2x and 3x
(`--targets`), or pass `--thresholds`. Predictions must not depend on the batch size (checked and printed).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: bench.harness and the packages

from common.cli import add_data_dir, add_threads  # noqa: E402
from finetune.data import EncodedSplit, in_dataset_order, load_tokenizer, subsample  # noqa: E402
from finetune.model import load_finetuned  # noqa: E402
from finetune.serve.early_exit import (  # noqa: E402
    default_sweep,
    make_rule,
    per_sample_flops,
    run_batch,
    run_dataset,
    run_full_model,
    static_flops,
)
from finetune.tasks import get_task, load_split  # noqa: E402


def timed(fn, *args, **kwargs):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - wall, time.process_time() - cpu


def pick_thresholds(model, split, task, strategy, targets, batch_size):
    """Thresholds of a default sweep whose FLOPs speed-up is nearest each target (distinct)."""
    full = static_flops(model.config, split.lengths, model.exit_layers[-1]).mean()
    batches = split.batches(batch_size)
    found = []
    for tau in default_sweep(strategy, model.config.num_labels, len(model.exit_layers)):
        result, _ = run_dataset(model, batches, make_rule(strategy, tau, model.config.num_labels))
        found.append((tau, full / per_sample_flops(model.config, result)[0].mean()))
    chosen = []
    for target in targets:
        tau, _ = min((f for f in found if f[0] not in chosen), key=lambda f: abs(f[1] - target))
        chosen.append(tau)
    return sorted(chosen, key=lambda t: dict(found)[t])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="fine-tuned multi-exit model (e.g. OUTPUT/best of finetune train)")
    p.add_argument("--task", default="SST-2")
    add_data_dir(p)
    p.add_argument("--split", default="dev")
    p.add_argument("--strategy", default="entropy")
    p.add_argument("--thresholds", default=None, help="three thresholds (default: picked by --targets)")
    p.add_argument("--targets", default="1.5,2,3", help="FLOPs speed-ups the picked operating points aim at")
    p.add_argument("--batch-sizes", default="1,32")
    p.add_argument("--max-examples", type=int, default=None, help="seeded subset of the dev set")
    p.add_argument("--max-examples-batch1", type=int, default=400, help="subset used at batch 1 (it is the slow one)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds; the minimum is kept")
    add_threads(p, default=1, help="torch threads (1: robust on a shared machine)")
    p.add_argument("--max-length", type=int, default=128)
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    task = get_task(args.task)
    model = load_finetuned(args.model)
    tokenizer = load_tokenizer(args.model)
    examples = subsample(load_split(task, args.data_dir, args.split), args.max_examples)
    split = EncodedSplit.from_examples(tokenizer, examples, args.max_length)
    labels = split.labels.numpy() if split.labels is not None else None
    print(
        f"model {args.model}  exits {list(model.exit_layers)}  task {task.name} {args.split} ({len(split)} rows, mean "
        f"length {split.lengths.float().mean():.1f})  strategy {args.strategy}  threads {torch.get_num_threads()}"
    )
    if args.thresholds:
        thresholds = [float(t) for t in args.thresholds.split(",")]
    else:
        targets = [float(t) for t in args.targets.split(",")]
        thresholds = pick_thresholds(model, split, task, args.strategy, targets, 32)
    rules = [make_rule(args.strategy, tau, model.config.num_labels) for tau in thresholds]
    full_flops = static_flops(model.config, split.lengths, model.exit_layers[-1]).mean()

    rows, reference_predictions = [], {}
    for batch_size in [int(b) for b in args.batch_sizes.split(",")]:
        subset = split
        if batch_size == 1 and args.max_examples_batch1 and args.max_examples_batch1 < len(split):
            rng = np.random.default_rng(0)
            picked = torch.from_numpy(np.sort(rng.choice(len(split), args.max_examples_batch1, replace=False)))
            subset = split.select(picked)
        batches = subset.batches(batch_size)
        sub_full_flops = static_flops(model.config, subset.lengths, model.exit_layers[-1]).mean()
        run_full_model(model, batches)  # warm-up pass over every batch shape
        n_cfg = 1 + len(rules)  # 0 = reference, 1.. = operating points
        wall = np.full((n_cfg, len(batches)), np.inf)
        cpu = np.full((n_cfg, len(batches)), np.inf)
        parts = [[None] * len(batches) for _ in rules]
        last = model.exit_layers[-1]
        with torch.inference_mode():
            for b, (_, ids, mask, types) in enumerate(batches):
                for _ in range(args.rounds):
                    _, w, c = timed(model, ids, attention_mask=mask, token_type_ids=types, exit_layers=[last])
                    wall[0, b], cpu[0, b] = min(wall[0, b], w), min(cpu[0, b], c)
                    for i, rule in enumerate(rules):
                        out, w, c = timed(run_batch, model, ids, mask, types, rule)
                        wall[i + 1, b], cpu[i + 1, b] = min(wall[i + 1, b], w), min(cpu[i + 1, b], c)
                        parts[i][b] = out
        results = [in_dataset_order(p, batches) for p in parts]
        ref_wall, ref_cpu = wall[0].sum(), cpu[0].sum()
        point_wall, point_cpu = wall[1:].sum(1), cpu[1:].sum(1)
        for i, (tau, result) in enumerate(zip(thresholds, results)):
            flops = per_sample_flops(model.config, result)[0].mean()
            preds = result.predictions
            score = task.compute_metrics(preds.numpy(), subset.labels.numpy())["score"] if labels is not None else None
            reference_predictions.setdefault(tau, {})[batch_size] = dict(zip(subset.index.tolist(), preds.tolist()))
            flops_speedup = sub_full_flops / flops
            wall_speedup = ref_wall / point_wall[i]
            cpu_speedup = ref_cpu / point_cpu[i]
            rows.append(
                (
                    batch_size,
                    tau,
                    score,
                    float(result.exit_layers.float().mean()),
                    flops_speedup,
                    wall_speedup,
                    wall_speedup / flops_speedup,
                    cpu_speedup / flops_speedup,
                    ref_wall,
                    point_wall[i],
                )
            )
    print(f"full model mean FLOPs/sample {full_flops / 1e6:.1f} M")
    header = (
        f"{'batch':>5} {'tau':>7} {'score':>6} {'exit':>5} {'FLOPs x':>8} {'wall x':>7} {'wall/FLOPs':>10} "
        f"{'cpu/FLOPs':>9} {'ref s':>7} {'run s':>7}"
    )
    print(header)
    for b, tau, score, exit_mean, fx, wx, ratio, cratio, ref, run in rows:
        score_text = f"{score:6.2f}" if score is not None else "   n/a"
        print(
            f"{b:>5} {tau:>7g} {score_text} {exit_mean:>5.2f} {fx:>8.2f} {wx:>7.2f} {ratio:>10.3f} {cratio:>9.3f} "
            f"{ref:>7.2f} {run:>7.2f}"
        )
    worst = min(r[6] for r in rows)
    # batch-size independence: the rows timed at batch 1 must get the same predictions at batch 32
    agree = []
    for by_batch in reference_predictions.values():
        sizes = sorted(by_batch)
        if len(sizes) > 1:
            small, large = by_batch[sizes[0]], by_batch[sizes[-1]]
            agree.append(all(large[k] == v for k, v in small.items()))
    print(f"predictions identical across batch sizes: {all(agree) if agree else 'n/a'}")
    verdict = "PASS" if worst >= 0.9 else "FAIL"
    print(f"min wall-time speed-up / FLOPs speed-up = {worst:.3f}  (target >= 0.9: {verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
