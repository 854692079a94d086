"""Multi-exit training methods as a list of phases; the trainer runs phases and knows nothing method-specific.

- JT: one phase; every step trains all exits, loss Σ_l w_l·L_l (w = 1, or ∝ l rescaled to sum to the exit count).
- 2ST: stage 1 trains backbone + last exit; stage 2 freezes both (eval mode, no gradient, not in the optimizer) and
  trains the intermediate exits, distilling from the last exit (the teacher).
- ALT (BERxiT): one phase; odd steps (1-based) train all exits, even steps the last exit only.
A single exit (plain fine-tuning or static truncation) is JT with one exit.
- HashEE: one phase training the top exit of a token-level exit model (`elasticbert.hashee`; its token map is built
  with the model, `finetune.hashee`): the tokens leave by their map, so there are no other exits to train.
Each phase gets a fresh optimizer (`build_optimizer`: AdamW over what the phase trains) and schedule
(`linear_schedule`); a DeepSpeed engine gets them as they are (`ds_config`: the JSON checked against them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from common.dist import resolve_env
from common.ds_config import AUTO, DsFill, load_ds_json
from elasticbert import ElasticBertForSequenceClassification

from ..config import FinetuneConfig
from ..model import exit_parameters


@dataclass(frozen=True)
class Phase:
    """One optimisation phase: its own optimizer and schedule, the exits it trains, what is frozen."""

    name: str
    trained_exits: tuple[int, ...]
    teacher: int | None = None  # exit whose detached outputs serve KD / ACL-CL targets
    freeze_backbone: bool = False  # embeddings, encoder layers and the teacher exit
    alternate: bool = False  # ALT
    epochs_key: str = "train.epochs"  # which config key sets this phase's length

    @property
    def last_exit(self) -> int:
        return max(self.trained_exits if self.teacher is None else (*self.trained_exits, self.teacher))

    def exits_at(self, step: int) -> tuple[int, ...]:
        """Exits whose losses count at optimizer step `step` (1-based)."""
        if self.alternate and step % 2 == 0:
            return (self.last_exit,)
        return self.trained_exits

    def forward_exits(self, step: int) -> tuple[int, ...]:
        """Exits the forward pass must produce: the trained ones plus the teacher."""
        exits = set(self.exits_at(step))
        if self.teacher is not None:
            exits.add(self.teacher)
        return tuple(sorted(exits))


def build_phases(method: str, exits: list[int]) -> list[Phase]:
    """The phases of `method` for the sorted exit layers `exits`."""
    exits = sorted(exits)
    last = exits[-1]
    if method == "hashee":
        if len(exits) != 1:
            raise ValueError(f"HashEE trains one exit at the top, got exits {exits}")
        return [Phase("train", (last,))]
    if len(exits) == 1:
        return [Phase("train", (last,))]
    if method == "jt":
        return [Phase("train", tuple(exits), teacher=last)]
    if method == "alt":
        return [Phase("train", tuple(exits), teacher=last, alternate=True)]
    if method == "2st":
        return [
            Phase("stage1", (last,)),
            Phase("stage2", tuple(exits[:-1]), teacher=last, freeze_backbone=True, epochs_key="method.stage2_epochs"),
        ]
    raise ValueError(f"unknown method {method!r}")


def exit_weights(exits: tuple[int, ...], scheme: str) -> dict[int, float]:
    """JT loss weights: "uniform" = 1 each (the official ElasticBERT sum); "layer" = ∝ l, rescaled to sum to k."""
    if scheme == "uniform":
        return {layer: 1.0 for layer in exits}
    if scheme == "layer":
        total = float(sum(exits))
        return {layer: len(exits) * layer / total for layer in exits}
    raise ValueError(f"unknown exit weighting {scheme!r}")


def linear_schedule(optimizer: torch.optim.Optimizer, total: int, warm: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup over `warm` steps (`common.config.warmup_for`), then linear decay to 0 (BERT's schedule)."""

    def factor(step: int) -> float:
        if warm and step < warm:
            return (step + 1) / warm
        return max(0.0, (total - step) / max(1, total - warm))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def build_optimizer(model: ElasticBertForSequenceClassification, cfg: FinetuneConfig) -> torch.optim.AdamW:
    """AdamW over the trainable parameters; no weight decay on biases and LayerNorm; exits may get `exit_lr`."""
    head_ids = {id(p) for layer in model.exit_layers for p in exit_parameters(model, layer)}
    groups: dict[tuple[bool, bool], list[torch.nn.Parameter]] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        no_decay = param.ndim < 2 or "LayerNorm" in name
        groups.setdefault((id(param) in head_ids, no_decay), []).append(param)
    param_groups = [
        {
            "params": params,
            "weight_decay": 0.0 if no_decay else cfg.optim.weight_decay,
            "lr": (cfg.optim.exit_lr if cfg.optim.exit_lr is not None else cfg.optim.lr) if is_head else cfg.optim.lr,
        }
        for (is_head, no_decay), params in groups.items()
    ]
    return torch.optim.AdamW(param_groups, lr=cfg.optim.lr)


# What `build_optimizer` makes, as DeepSpeed's optimizer section would say it (torch.optim.AdamW's betas and eps).
ADAMW_BETAS = [0.9, 0.999]
ADAMW_EPS = 1e-8


def ds_config(raw: dict[str, Any], cfg: FinetuneConfig, world_size: int) -> dict[str, Any]:
    """The DeepSpeed config of a fine-tuning run, under the policy pre-training follows (`common.ds_config`): the
    batch and clipping fields filled from the run config (one optimizer step per batch), a disagreeing value refused,
    no scheduler. The trainer builds its AdamW and schedule itself and hands them to the engine: a JSON `optimizer`
    section is checked against that AdamW and dropped; one that asks for anything else is refused. Fine-tuning
    trains in fp32: `bf16` / `fp16` sections left "auto" are filled disabled."""
    fill = DsFill(raw)
    t, o = cfg.train, cfg.optim
    keys = ("train.batch_size × world size", "train.batch_size", "1 (fine-tuning steps every batch)")
    fill.batch(t.batch_size * world_size, t.batch_size, 1, keys)
    fill.fill(fill.ds, "", "gradient_clipping", float(o.grad_clip), "optim.grad_clip")
    fill.refuse_scheduler()
    adamw = "the trainer's torch.optim.AdamW"
    if "optimizer" in fill.ds:
        params = fill.optimizer(
            "AdamW",
            {
                "lr": (float(o.lr), "optim.lr"),
                "betas": (ADAMW_BETAS, adamw),
                "eps": (ADAMW_EPS, adamw),
                "weight_decay": (float(o.weight_decay), "optim.weight_decay"),
                "torch_adam": (True, adamw),
            },
            "optim (fine-tuning builds AdamW)",
        )
        for name in sorted(set(params) - {"lr", "betas", "eps", "weight_decay", "torch_adam"}):
            fill.problems.append(
                f"optimizer.params.{name} in the DeepSpeed JSON {fill.source}: fine-tuning builds {adamw} from the "
                "run config (optim.*) and cannot honour it; remove it"
            )
        fill.ds.pop("optimizer")  # checked: the engine gets the trainer's own optimizer
    for section in ("bf16", "fp16"):
        if isinstance(fill.ds.get(section), dict) and fill.ds[section].get("enabled") == AUTO:
            fill.ds[section]["enabled"] = False
    fill.ds.setdefault("steps_per_print", 10**9)
    return fill.done()


def deepspeed_engine(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: object, cfg: FinetuneConfig
) -> tuple:
    """Wrap model/optimizer/schedule in a DeepSpeed engine (single process needs no launcher). DeepSpeed is imported
    as pre-training imports it (`common.deepspeed_import`): on CPU no rank builds or loads its shm op (the first
    rank's JIT build took 37 s while the other waited), and no rank compiles its Muon kernel."""
    from common.deepspeed_import import import_deepspeed

    deepspeed = import_deepspeed(type(optimizer).__name__)

    env = resolve_env()  # exports RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT (rank 0 of 1 without a launcher)
    config = ds_config(load_ds_json(cfg.train.ds_config), cfg, env.world_size)
    engine, optimizer, _, scheduler = deepspeed.initialize(
        model=model, optimizer=optimizer, lr_scheduler=scheduler, config=config
    )
    return engine, optimizer, scheduler
