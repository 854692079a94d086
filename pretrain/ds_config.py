"""DeepSpeed JSON from ds_configs/ with its "auto" fields filled from the run config.

The run config is the single source of truth for batch sizes, optimiser and clipping; the JSON holds what is
specific to the hardware (ZeRO stage and buckets, fp16 loss-scaling settings). The precision sections are generated
from `train.precision` and the device (`pretrain.precision`). A JSON value that is not "auto" and disagrees with
the run config is an error rather than a silent winner.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.io import read_object

from .config import REPO_ROOT, ConfigError, RunConfig, resolve_path
from .precision import DeviceCaps, apply_precision, choose_precision, precision_problems

AUTO = "auto"
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


def load_ds_json(path: str | Path) -> dict[str, Any]:
    p = resolve_path(str(path), REPO_ROOT)
    if not p.is_file():
        raise ConfigError(
            f"DeepSpeed config {p} does not exist (a relative path is read from the current directory, else from "
            f"{REPO_ROOT}; the shipped ones are in the repository's ds_configs/)"
        )
    return read_object(p, ConfigError, "a JSON object", hint="the DeepSpeed config (--ds-config, train.ds_config)")


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


def _fill(section: dict[str, Any], key: str, value: Any, where: str, problems: list[str]) -> None:
    current = section.get(key, AUTO)
    if current == AUTO:
        section[key] = value
    elif current != value and not (isinstance(current, list) and list(current) == list(value)):
        problems.append(
            f"{where}.{key}={current!r} in the DeepSpeed JSON disagrees with the run config ({value!r}); "
            f'set it to "auto" or change the run config'
        )


def fill_ds_config(
    raw: dict[str, Any], cfg: RunConfig, world_size: int, caps: DeviceCaps | None = None
) -> tuple[dict[str, Any], BatchLayout]:
    """Return a concrete DeepSpeed config (no "auto" left) and the batch layout it implies, for the device `caps`
    (default: a CPU)."""
    caps = caps or DeviceCaps.cpu()
    device = caps.kind
    ds = copy.deepcopy(raw)
    problems: list[str] = []
    layout = batch_layout(cfg, world_size)
    o = cfg.optim
    _fill(ds, "train_batch_size", layout.global_batch, "", problems)
    _fill(ds, "train_micro_batch_size_per_gpu", layout.micro_batch, "", problems)
    _fill(ds, "gradient_accumulation_steps", layout.grad_accum, "", problems)
    _fill(ds, "gradient_clipping", float(o.grad_clip), "", problems)
    if "scheduler" in ds:
        problems.append(
            "the DeepSpeed JSON has a 'scheduler': the lr schedule lives in the run config (optim.*), "
            "computed from the step so resume needs no scheduler state"
        )
    opt = ds.setdefault("optimizer", {"type": AUTO, "params": {}})
    _fill(opt, "type", OPTIMIZER_TYPES.get(o.name, o.name), "optimizer", problems)
    params = opt.setdefault("params", {})
    _fill(params, "lr", float(o.lr), "optimizer.params", problems)
    _fill(params, "betas", [float(b) for b in o.betas], "optimizer.params", problems)
    _fill(params, "eps", float(o.eps), "optimizer.params", problems)
    _fill(params, "weight_decay", float(o.weight_decay), "optimizer.params", problems)
    backend = o.kernel_backend()
    if o.name == "adamw":
        # torch_adam: DeepSpeed builds torch.optim.AdamW from these params (no op to JIT-build); fused=True on GPUs
        # runs it as one multi-tensor CUDA kernel, the role FusedAdam plays (same update: tests/pretrain/test_optimizer)
        _fill(params, "torch_adam", backend == "torch", "optimizer.params", problems)
        if backend == "torch" and device == "cuda":
            _fill(params, "fused", True, "optimizer.params", problems)
    else:
        params.pop("torch_adam", None)
        if backend == "torch":
            problems.append("optim.name=lamb has no torch implementation: set optim.backend=deepspeed (FusedLamb)")

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
    leftovers = [k for k, v in _walk(ds) if v == AUTO]
    if leftovers:
        problems.append(f'DeepSpeed JSON fields left as "auto" that the run config cannot fill: {leftovers}')
    ds.setdefault("steps_per_print", 10**9)
    if cfg.logging.comm_timing:  # DeepSpeed's comms profiler, read per step by pretrain.rank_report.CommTimer
        ds["comms_logger"] = {"enabled": True, "prof_all": True, "verbose": False, "debug": False}
    if problems:
        raise ConfigError(problems, source="DeepSpeed config")
    return ds, layout


def _walk(d: Any, prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    if isinstance(d, dict):
        for k, v in d.items():
            out.extend(_walk(v, f"{prefix}.{k}" if prefix else k))
    else:
        out.append((prefix, d))
    return out
