"""The typed configuration of one fine-tuning run, validated before anything loads, saved into the run directory."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Literal

from common.config import literal_problems
from common.errors import ConfigError
from common.io import atomic_write_json

# Fixed choices: the allowed values live in the type (`--help`, validation and `common.config` read them from here).
Method = Literal["jt", "2st", "alt"]
Objective = Literal["ce", "ce+scl", "acl", "acl-cl"]
ExitType = Literal["linear", "mha"]
AngleScope = Literal["exit", "all", "representation"]
JTWeights = Literal["uniform", "layer"]
Reduction = Literal["sum", "mean"]
Granularity = Literal["batch", "exit"]


def flag(name: str) -> str:
    """The command-line spelling of a TrainConfig field (`lam` is `--lambda`)."""
    return "--lambda" if name == "lam" else f"--{name.replace('_', '-')}"


@dataclass
class TrainConfig:
    """One run. Defaults are the paper's (lr 2e-5, weight decay 0.01, dropout 0.1, 10 % warmup, λ 0.02, τ 0.5)."""

    model: str
    task: str
    output: str
    data_dir: str | None = None
    tokenizer: str | None = None
    seed: int = 42
    # architecture
    layers: int | None = None  # static truncation: keep l layers
    exits: list[int] | str | None = None  # None: one exit at the top; "all"; or explicit layers
    exit_type: ExitType = "linear"
    mha_dim: int = 64
    mha_heads: int = 4
    dropout: float = 0.1
    # method
    method: Method = "jt"
    jt_weights: JTWeights = "uniform"
    gradient_equilibrium: bool = False
    # objective
    objective: Objective = "ce"
    lam: float = 0.02
    tau: float = 0.5
    contrastive_reduction: Reduction = "sum"
    kd_weight: float | None = None  # None: 0.5 in 2ST stage 2, 0 elsewhere
    kd_temperature: float = 2.0
    acl_grad: bool = False
    acl_grad_scope: AngleScope = "exit"
    acl_grad_threshold: float = 90.0
    acl_grad_granularity: Granularity = "batch"
    log_angles: bool = True
    # optimisation
    lr: float = 2e-5
    exit_lr: float | None = None  # learning rate of the exit heads (default: lr)
    weight_decay: float = 0.01
    warmup: float = 0.1
    epochs: float = 3.0
    stage2_epochs: float | None = None
    max_steps: int | None = None  # per phase; overrides epochs
    batch_size: int = 32
    eval_batch_size: int = 64
    max_length: int = 128
    grad_clip: float = 1.0
    max_train_examples: int | None = None
    max_dev_examples: int | None = None
    # The dev subset does not follow `seed`: every seed and arm is scored on the same rows, the ones
    # `finetune early-exit --max-examples` picks too.
    dev_subset_seed: int = 0
    eval_every: int | None = None  # steps; None: at the end of every epoch
    deepspeed: str | None = None
    progress: bool = True
    extra: dict = field(default_factory=dict)

    def validate(self, num_labels: int | None = None, model_layers: int | None = None) -> TrainConfig:
        """Check option values and combinations; `num_labels`/`model_layers` enable the task- and model-aware checks."""
        problems = literal_problems(self, key=flag)
        if problems:
            raise ConfigError(problems)
        positive = ("lr", "tau", "kd_temperature", "batch_size", "eval_batch_size", "max_length", "mha_dim")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{flag(name)} must be > 0, got {getattr(self, name)}")
        if not 0.0 <= self.lam <= 1.0:
            raise ConfigError(f"--lambda must be within [0, 1], got {self.lam}")
        if self.kd_weight is not None and not 0.0 <= self.kd_weight <= 1.0:
            raise ConfigError(f"--kd-weight must be within [0, 1], got {self.kd_weight}")
        if not 0.0 <= self.warmup < 1.0:
            raise ConfigError(f"--warmup is a fraction of the steps within [0, 1), got {self.warmup}")
        if self.mha_dim % self.mha_heads:
            raise ConfigError(f"--mha-dim {self.mha_dim} is not a multiple of --mha-heads {self.mha_heads}")
        if not 0.0 < self.acl_grad_threshold <= 180.0:
            raise ConfigError(f"--acl-grad-threshold is an angle in degrees (0, 180], got {self.acl_grad_threshold}")
        if self.acl_grad_granularity == "exit" and self.acl_grad_scope == "all":
            raise ConfigError("--acl-grad-granularity exit needs --acl-grad-scope exit or representation")
        if num_labels == 1 and self.objective != "ce":
            raise ConfigError(
                f"--objective {self.objective} needs class labels (contrastive positives are same-class items); "
                f"task {self.task} is regression: use --objective ce"
            )
        if model_layers is not None:
            layers = self.resolved_exits(model_layers)
            if self.method in ("2st", "alt") and len(layers) < 2:
                raise ConfigError(f"--method {self.method} needs at least two exits (got {layers}); pass --exits")
        return self

    def num_layers(self, model_layers: int) -> int:
        """Layers the fine-tuned model keeps: --layers, else the deepest exit (deeper layers would never run)."""
        if self.layers is not None:
            if not 1 <= self.layers <= model_layers:
                raise ConfigError(f"--layers {self.layers}: the checkpoint has {model_layers} layers")
            return self.layers
        if isinstance(self.exits, list) and self.exits:
            bad = [e for e in self.exits if not 1 <= e <= model_layers]
            if bad:
                raise ConfigError(f"--exits {self.exits}: layers {bad} outside 1..{model_layers} (the checkpoint's)")
            return max(self.exits)
        return model_layers

    def resolved_exits(self, model_layers: int) -> list[int]:
        """Sorted exit layers: explicit --exits, "all", or the single top layer (static truncation / plain)."""
        top = self.num_layers(model_layers)
        if self.exits is None:
            return [top]
        if self.exits == "all":
            return list(range(1, top + 1))
        bad = [e for e in self.exits if not 1 <= e <= top]
        if bad:
            raise ConfigError(f"--exits {self.exits}: layers {bad} outside 1..{top}")
        return sorted(set(self.exits))

    def save(self, path: Path) -> None:
        atomic_write_json(path, asdict(self))

    @classmethod
    def load(cls, path: Path) -> TrainConfig:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})


def parse_exits(text: str | None) -> list[int] | str | None:
    """`--exits` value: None, "all", or "1,3,6" (also "1-6")."""
    if text is None or text == "all":
        return text
    layers: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                layers.extend(range(lo, hi + 1))
            elif part:
                layers.append(int(part))
        except ValueError:
            raise ConfigError(f"--exits {text!r}: expected 'all' or layers such as 1,3,6 or 1-6") from None
    if not layers:
        raise ConfigError(f"--exits {text!r}: no layers given")
    return layers
