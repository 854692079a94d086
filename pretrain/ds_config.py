"""DeepSpeed JSON from ds_configs/ with its "auto" fields filled from the run config, under the policy both
trainers share (`common.ds_config`: where the file is read from, "auto" filled, a disagreeing value refused naming
the key, the file and both values, no `scheduler`).

The run config is the single source of truth for batch sizes, optimiser and clipping; the JSON holds what is
specific to the hardware (ZeRO stage and buckets, fp16 loss-scaling settings). The precision sections are generated
from `train.precision` and the device (`pretrain.precision`). Pre-training hands the filled `optimizer` section to
DeepSpeed, which builds the optimizer from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from common.ds_config import AUTO, DsFill, load_ds_json

from .config import ConfigError, OptimConfig, RunConfig
from .precision import DeviceCaps, apply_precision, choose_precision, precision_problems

__all__ = ["AUTO", "BatchLayout", "batch_layout", "fill_ds_config", "load_ds_json"]
OPTIMIZER_TYPES = {"adamw": "AdamW", "lamb": "Lamb"}  # optim.name -> DeepSpeed's optimizer.type


@dataclass(frozen=True)
class BatchLayout:
    """What DeepSpeed will actually do per optimizer step (reported at start)."""

    global_batch: int
    micro_batch: int
    grad_accum: int
    world_size: int

    def __str__(self) -> str:
        return (
            f"global batch {self.global_batch} = micro-batch {self.micro_batch} × accumulation "
            f"{self.grad_accum} × world size {self.world_size}"
        )


def batch_layout(cfg: RunConfig, world_size: int) -> BatchLayout:
    t = cfg.train
    if t.global_batch_size % (t.micro_batch_size * world_size):
        raise ConfigError(
            f"train.global_batch_size={t.global_batch_size} is not divisible by micro_batch_size × world_size = "
            f"{t.micro_batch_size} × {world_size}"
        )
    return BatchLayout(
        t.global_batch_size, t.micro_batch_size, t.global_batch_size // (t.micro_batch_size * world_size), world_size
    )


def _fill_optimizer(fill: DsFill, o: OptimConfig, device: str) -> None:
    """The optimizer section from `optim` (`o`): type, hyper-parameters, and which kernel runs the update."""
    params = fill.optimizer(
        OPTIMIZER_TYPES.get(o.name, o.name),
        {
            "lr": (float(o.lr), "optim.lr"),
            "betas": ([float(b) for b in o.betas], "optim.betas"),
            "eps": (float(o.eps), "optim.eps"),
            "weight_decay": (float(o.weight_decay), "optim.weight_decay"),
        },
        "optim.name",
    )
    backend = o.kernel_backend()
    if o.name == "adamw":
        # torch_adam: DeepSpeed builds torch.optim.AdamW from these params (no op to JIT-build); fused=True on GPUs
        # runs it as one multi-tensor CUDA kernel, the role FusedAdam plays (same update: tests/pretrain/test_optimizer)
        fill.fill(params, "optimizer.params", "torch_adam", backend == "torch", "optim.backend")
        if backend == "torch" and device == "cuda":
            fill.fill(params, "optimizer.params", "fused", True, "optim.backend")
    else:
        params.pop("torch_adam", None)
        if backend == "torch":
            fill.problems.append("optim.name=lamb has no torch implementation: set optim.backend=deepspeed (FusedLamb)")


def fill_ds_config(
    raw: dict[str, Any], cfg: RunConfig, world_size: int, caps: DeviceCaps | None = None
) -> tuple[dict[str, Any], BatchLayout]:
    """Return a concrete DeepSpeed config (no "auto" left) and the batch layout it implies, for the device `caps`
    (default: a CPU)."""
    caps = caps or DeviceCaps.cpu()
    device = caps.kind
    layout = batch_layout(cfg, world_size)
    fill = DsFill(raw)
    ds, problems = fill.ds, fill.problems
    o = cfg.optim
    keys = ("train.global_batch_size", "train.micro_batch_size", "train.global_batch_size / (micro × world size)")
    fill.batch(layout.global_batch, layout.micro_batch, layout.grad_accum, keys)
    fill.fill(ds, "", "gradient_clipping", float(o.grad_clip), "optim.grad_clip")
    fill.refuse_scheduler()
    _fill_optimizer(fill, o, device)

    zero = ds.setdefault("zero_optimization", {"stage": 0})
    if cfg.train.zero_stage is not None:
        zero["stage"] = cfg.train.zero_stage
    if zero.get("stage") == AUTO:
        zero["stage"] = 1
    choice = choose_precision(cfg.train.precision, ds, caps)
    apply_precision(ds, choice.precision)
    problems += precision_problems(choice, caps)
    if o.name == "lamb" and zero.get("stage", 0) != 0:
        problems.append("optim.name=lamb needs zero_optimization.stage 0 (ZeRO does not support LAMB)")
    if cfg.train.compile and zero.get("stage", 0) == 3:
        problems.append(
            "train.compile=true needs ZeRO stage 0-2: ZeRO-3 gathers parameters in hooks that torch.compile cannot "
            "trace (DeepSpeed compiles stage 3 only through DeepCompile); set train.zero_stage=2"
        )
    if o.name == "lamb" and device != "cuda":
        problems.append("optim.name=lamb uses DeepSpeed's FusedLamb, which needs CUDA; use adamw on CPU")
    ds.setdefault("steps_per_print", 10**9)
    # DeepSpeed's throughput timer synchronizes the device at the start and end of every micro-batch (two host syncs
    # each); its figure is never read (metrics.jsonl times the step), so it is off unless the JSON asks for it
    ds.setdefault("timers", {"throughput": {"enabled": False}})
    if cfg.logging.comm_timing:  # DeepSpeed's comms profiler, read per step by pretrain.rank_report.CommTimer
        ds["comms_logger"] = {"enabled": True, "prof_all": True, "verbose": False, "debug": False}
    return fill.done(), layout
