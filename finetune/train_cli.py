"""`finetune train`: argparse front end of `TrainConfig` + `run_training`."""

from __future__ import annotations

import argparse
import json

from .config import ANGLE_SCOPES, EXIT_TYPES, JT_WEIGHTS, METHODS, OBJECTIVES, TrainConfig, parse_exits

EPILOG = """examples:
  # plain fine-tuning (one exit at the top), then static truncation to 3 layers
  python -m finetune train --model MODEL --task RTE --data-dir GLUE --output runs/rte
  python -m finetune train --model MODEL --task RTE --data-dir GLUE --layers 3 --output runs/rte-l3
  # multi-exit: all layers, MHA exits, two-stage training with ACL and ACL-Grad
  python -m finetune train --model MODEL --task SST-2 --data-dir GLUE --exits all --exit-type mha \\
      --method 2st --objective acl --acl-grad on --output runs/sst2-2st-acl
The model lands in OUTPUT/best (load with elasticbert.load_pretrained(ElasticBertForSequenceClassification, dir)).
"""


def _on_off(text: str) -> bool:
    if text.lower() in ("on", "true", "1", "yes"):
        return True
    if text.lower() in ("off", "false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected on/off, got {text!r}")


def add_subparser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train",
        help="fine-tune on a GLUE/ELUE task (static truncation, multi-exit JT/2ST/ALT, CE/SCL/ACL objectives)",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d = TrainConfig.__dataclass_fields__
    g = p.add_argument_group("data and model")
    g.add_argument("--model", required=True, help="HF dir: our export, a fine-tuned run, a BERT checkpoint, fnlp")
    g.add_argument("--task", required=True, help="GLUE task (CoLA, SST-2, ...) or elue/NAME")
    g.add_argument("--data-dir", help="GLUE/ELUE data root or one task folder; hf:NAME loads GLUE from the hub")
    g.add_argument("--output", required=True, help="run directory")
    g.add_argument("--tokenizer", help="tokenizer dir (default: --model)")
    g.add_argument("--seed", type=int, default=d["seed"].default)
    g.add_argument("--max-train-examples", type=int, help="seeded subset of the training set")
    g.add_argument("--max-dev-examples", type=int, help="seeded subset of the dev set")
    g.add_argument("--dev-subset-seed", type=int, default=0,
                   help="seed of that subset (default 0: the same rows for every --seed, and for early-exit --limit)")
    g.add_argument("--max-length", type=int, default=d["max_length"].default)

    g = p.add_argument_group("exits and method")
    g.add_argument("--layers", type=int, help="static truncation: keep the first l layers (one exit at l)")
    g.add_argument("--exits", nargs="?", const="all", help="multi-exit: 'all' (default if bare) or e.g. 1,3,6")
    g.add_argument("--exit-type", choices=EXIT_TYPES, default=d["exit_type"].default)
    g.add_argument("--mha-dim", type=int, default=d["mha_dim"].default, help="MHA exit width d_e")
    g.add_argument("--mha-heads", type=int, default=d["mha_heads"].default)
    g.add_argument("--method", choices=METHODS, default=d["method"].default)
    g.add_argument("--jt-weights", choices=JT_WEIGHTS, default=d["jt_weights"].default)
    g.add_argument("--stage2-epochs", type=float, help="2ST stage-2 epochs (default: --epochs)")
    g.add_argument("--gradient-equilibrium", action="store_true")

    g = p.add_argument_group("objective")
    g.add_argument("--objective", choices=OBJECTIVES, default=d["objective"].default)
    g.add_argument("--lambda", dest="lam", type=float, default=d["lam"].default, help="contrastive weight λ")
    g.add_argument("--tau", type=float, default=d["tau"].default, help="contrastive temperature τ")
    g.add_argument("--contrastive-reduction", choices=("sum", "mean"), default="sum")
    g.add_argument("--kd-weight", type=float, help="β in (1−β)·CE + β·KD (default 0.5 in 2ST stage 2, else 0)")
    g.add_argument("--kd-temperature", type=float, default=d["kd_temperature"].default)
    g.add_argument("--acl-grad", type=_on_off, default=False, metavar="on|off")
    g.add_argument("--acl-grad-scope", choices=ANGLE_SCOPES, default=d["acl_grad_scope"].default)
    g.add_argument("--acl-grad-threshold", type=float, default=d["acl_grad_threshold"].default, help="degrees")
    g.add_argument("--acl-grad-granularity", choices=("batch", "exit"), default="batch")
    g.add_argument("--log-angles", type=_on_off, default=True, metavar="on|off",
                   help="measure CE/contrastive gradient angles even with ACL-Grad off")

    g = p.add_argument_group("optimisation")
    for name in ("lr", "weight_decay", "warmup", "dropout", "epochs", "grad_clip"):
        g.add_argument(f"--{name.replace('_', '-')}", type=float, default=d[name].default)
    g.add_argument("--exit-lr", type=float, help="learning rate of the exit heads (default: --lr)")
    g.add_argument("--batch-size", type=int, default=d["batch_size"].default)
    g.add_argument("--eval-batch-size", type=int, default=d["eval_batch_size"].default)
    g.add_argument("--max-steps", type=int, help="steps per phase (overrides --epochs)")
    g.add_argument("--eval-every", type=int, help="evaluate every N steps (default: every epoch)")
    g.add_argument("--deepspeed", help="DeepSpeed JSON config (optional)")
    g.add_argument("--no-progress", dest="progress", action="store_false")
    p.set_defaults(func=_main)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    fields = TrainConfig.__dataclass_fields__
    values = {k: v for k, v in vars(args).items() if k in fields and k != "extra"}
    values["exits"] = parse_exits(args.exits)
    return TrainConfig(**values)


def _main(args: argparse.Namespace) -> int:
    from .trainer import run_training

    summary = run_training(config_from_args(args))
    best = summary["best"]
    curve = ", ".join(f"L{k}: {v[summary['main_metric']]:.2f}" for k, v in best["exits"].items())
    print(f"{summary['task']}: best ({best['phase']}, step {best['step']}) dev {summary['main_metric']} per exit: "
          f"{curve}")
    print(json.dumps({"output": args.output, "seconds": summary["seconds"]}))
    return 0
