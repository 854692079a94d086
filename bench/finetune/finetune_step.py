"""Fine-tuning train step per method × exit type, relative to plain single-exit fine-tuning of the same model.

    python bench/finetune/finetune_step.py [--model DIR] [--task RTE] [--batch 16] [--seq 64] [--steps 4] [--rounds 3]

Same model (MiniLM weights, 6 layers, hidden 384 by default), same real GLUE batch, fp32, the trainer's own
`train_step` (forward, per-exit losses, backward, clipping, AdamW, schedule). Cases are interleaved round-robin
(A B C … A B C …) so machine noise hits all alike; the median step time per case is reported, as a ratio to
"plain" (one linear exit on the top layer, CE). Wall and process-CPU time are both reported: on a shared
machine run with --threads 1, where CPU time is the steadier measure. Multi-exit cases put an exit on every layer.
ALT alternates between all exits and the last one, so its median covers both kinds of steps; 2ST is timed per
stage.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: bench.harness and the packages

from bench.harness import GLUE_DIR as GLUE  # noqa: E402
from elasticbert import minilm_dir  # noqa: E402
from finetune.config import from_shortcuts  # noqa: E402
from finetune.data import encode_examples, load_tokenizer  # noqa: E402
from finetune.model import build_model  # noqa: E402
from finetune.tasks import get_task, load_split  # noqa: E402
from finetune.train.methods import Phase, build_phases  # noqa: E402
from finetune.train.trainer import Trainer, set_seed  # noqa: E402


@dataclass
class Case:
    name: str
    trainer: Trainer
    phase: Phase
    optimizer: torch.optim.Optimizer
    scheduler: object
    step: int = 0
    times: list | None = None  # wall seconds per step
    cpu: list | None = None  # process CPU seconds per step (robust on a shared machine with --threads 1)


def build_case(name: str, args: argparse.Namespace, phase_index: int = 0, **overrides: object) -> Case:
    """A trainer positioned at the start of one phase of a method, ready for `train_step`."""
    cfg = from_shortcuts(model=str(args.model), task=args.task, progress=False, log_angles=False, **overrides)
    task = get_task(cfg.data.task)
    set_seed(0)
    model, _ = build_model(cfg, task)
    trainer = Trainer(cfg, task, model, tokenizer=None, train=[], dev=[], run_dir=Path(tempfile.mkdtemp()))
    phase = build_phases(cfg.method.name, list(model.exit_layers))[phase_index]
    optimizer, scheduler = trainer.start_phase(phase, total=10_000)
    return Case(name, trainer, phase, optimizer, scheduler, times=[], cpu=[])


def real_batch(args: argparse.Namespace) -> dict[str, torch.Tensor]:
    examples = load_split(args.task, args.data_dir, "train")[: args.batch]
    return encode_examples(load_tokenizer(args.model), examples, args.seq)


def run_interleaved(cases: list[Case], batch: dict[str, torch.Tensor], rounds: int, steps: int) -> None:
    """Warm up each case, then `rounds` × (`steps` timed steps per case), round-robin."""
    for case in cases:
        for _ in range(2):
            case.step += 1
            case.trainer.train_step(case.phase, case.step, batch, case.optimizer, case.scheduler)
    for _ in range(rounds):
        for case in cases:
            for _ in range(steps):
                case.step += 1
                start, start_cpu = time.perf_counter(), time.process_time()
                case.trainer.train_step(case.phase, case.step, batch, case.optimizer, case.scheduler)
                case.times.append(time.perf_counter() - start)
                case.cpu.append(time.process_time() - start_cpu)


def report(cases: list[Case], baseline: str, title: str) -> dict[str, tuple[float, float]]:
    """Median wall and CPU time per step and their ratios to `baseline`; returns (wall, cpu) ratios per case."""
    base = next(c for c in cases if c.name == baseline)
    base_wall, base_cpu = statistics.median(base.times), statistics.median(base.cpu)
    print(f"\n{title}")
    print(f"{'case':<36} {'wall ms':>9} {'ratio':>7} {'cpu ms':>9} {'ratio':>7}")
    ratios = {}
    for case in cases:
        wall, cpu = statistics.median(case.times), statistics.median(case.cpu)
        ratios[case.name] = (wall / base_wall, cpu / base_cpu)
        print(f"{case.name:<36} {1000 * wall:9.1f} {wall / base_wall:6.2f}x {1000 * cpu:9.1f} {cpu / base_cpu:6.2f}x")
    return ratios


def parse_args(argv: list[str] | None = None, doc: str | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=doc or __doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="HF model dir (default: the MiniLM package)")
    p.add_argument("--task", default="RTE")
    p.add_argument("--data-dir", default=str(GLUE))
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--steps", type=int, default=4, help="timed steps per case per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    args.model = Path(args.model) if args.model else minilm_dir()
    if args.threads:
        torch.set_num_threads(args.threads)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    batch = real_batch(args)
    print(
        f"model {args.model} | task {args.task} | batch {args.batch} x seq {batch['input_ids'].shape[1]} | "
        f"threads {torch.get_num_threads()} | {args.rounds} rounds x {args.steps} steps, median"
    )
    cases = [build_case("plain (1 linear exit, top)", args)]
    cases.append(build_case("plain (1 mha exit, top)", args, exit_type="mha"))
    for exit_type in ("linear", "mha"):
        cases.append(
            build_case(
                f"jt {exit_type} (all exits)", args, exits="all", exit_type=exit_type, gradient_equilibrium=False
            )
        )
    cases.append(build_case("jt linear + grad. equilibrium", args, exits="all", gradient_equilibrium=True))
    for exit_type in ("linear", "mha"):
        cases.append(
            build_case(
                f"alt {exit_type}", args, exits="all", exit_type=exit_type, method="alt", gradient_equilibrium=False
            )
        )
    for exit_type in ("linear", "mha"):
        for stage in (0, 1):
            cases.append(
                build_case(
                    f"2st {exit_type} stage {stage + 1}", args, stage, exits="all", exit_type=exit_type, method="2st"
                )
            )
    run_interleaved(cases, batch, args.rounds, args.steps)
    report(cases, cases[0].name, "train step time relative to plain single-exit fine-tuning (linear exit)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
