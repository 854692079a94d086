"""Where a pre-training step's time goes: torch.profiler operator tables (self CPU time) for ElasticBERT with all
exits active and for the informed plain-`transformers` baseline of `bench/pretrain/model_step.py`, same batches.

    .venv/bin/python bench/pretrain/step_profile.py --hidden 256 768 --steps 2 [--by-shape] [--top 14]

Prints, per hidden size, the operators by self CPU time for both models side by side (ms per step, share of the
step), so a difference between the two names its operator; `--by-shape` splits each operator by its input shapes
(the decoder's [M, 30522] products apart from the encoder's).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: bench.harness and the packages

from bench.harness import bert_size  # noqa: E402
from bench.pretrain.model_step import LAYERS, VOCAB, PlainBertMultiExit, make_batches, timed_step  # noqa: E402
from elasticbert import ElasticBertConfig, ElasticBertForPreTraining  # noqa: E402


def operator_times(
    model: torch.nn.Module, batches: list, exits: tuple[int, ...], by_shape: bool = False
) -> dict[str, float]:
    """Self CPU ms per step of each operator over `batches` (after one warm-up step); `by_shape`: per operator and
    input shapes (e.g. the decoder's [M, 30522] products apart from the encoder's)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    timed_step(model, optimizer, batches[0], exits)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=by_shape) as prof:
        for batch in batches[1:]:
            timed_step(model, optimizer, batch, exits)
    steps = len(batches) - 1
    events = prof.key_averages(group_by_input_shape=by_shape)
    return {_label(e, by_shape): e.self_cpu_time_total / 1000 / steps for e in events}


def _label(event: object, by_shape: bool) -> str:
    shapes = [s for s in getattr(event, "input_shapes", None) or [] if s] if by_shape else []
    return f"{event.key} {'x'.join(str(s) for s in shapes)}".replace(" ", "") if shapes else event.key


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, nargs="+", default=[256, 768])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--top", type=int, default=14)
    parser.add_argument("--by-shape", action="store_true", help="one row per operator and input shapes")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    exits = tuple(range(1, LAYERS + 1))
    for hidden in args.hidden:
        cfg = ElasticBertConfig(**bert_size(hidden, LAYERS, vocab=VOCAB))
        batches = make_batches(args.steps + 1)
        ours = operator_times(ElasticBertForPreTraining(cfg).train(), batches, exits, args.by_shape)
        base = operator_times(
            PlainBertMultiExit(hidden, "sdpa", sparse_mlm=True).train(), batches, exits, args.by_shape
        )
        total_ours, total_base = sum(ours.values()), sum(base.values())
        threads = torch.get_num_threads()
        print(f"\nhidden {hidden}, threads {threads}: self CPU per step, ElasticBERT {total_ours:.0f} ms, ", end="")
        print(f"informed {total_base:.0f} ms")
        width = 80 if args.by_shape else 44
        print(
            f"  {'operator':{width}s} {'ours ms':>9s} {'share':>6s} {'informed ms':>12s} {'share':>6s} {'diff ms':>8s}"
        )
        for name in sorted(set(ours) | set(base), key=lambda n: -max(ours.get(n, 0), base.get(n, 0)))[: args.top]:
            o, b = ours.get(name, 0.0), base.get(name, 0.0)
            shares = f"{o / total_ours:6.1%} {b:12.1f} {b / total_base:6.1%}"
            print(f"  {name[:width]:{width}s} {o:9.1f} {shares} {o - b:+8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
