"""The typed configuration of one fine-tuning run, validated before anything loads, saved into the run directory.

Defaults are chosen to learn on small real data (see `DEFAULT_EXIT_LR`); the papers' recipes are YAML presets under
finetune/presets/ (`finetune train --recipe NAME`, see `recipes.py`), one flag away.
"""

from __future__ import annotations

import json
import math
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
Device = Literal["auto", "cpu", "cuda"]  # auto: CUDA when available, else the CPU (`finetune.model.resolve_device`)


# Departure from the papers (measured, see finetune/README.md "Defaults that learn"): the exit heads train with their
# own learning rate. ElasticBERT and ACL use one learning rate (2e-5) for backbone and exits; at that rate freshly
# initialised MHA exits (four chained random layers) keep their logits near zero for the few hundred steps of a small
# run, and 2ST's stage 2 (backbone frozen) cannot learn at all. The recipes set `exit_lr: null` (= --lr), the papers'.
DEFAULT_EXIT_LR = 1e-3


def flag(name: str) -> str:
    """The command-line spelling of a TrainConfig field (`lam` is `--lambda`)."""
    return "--lambda" if name == "lam" else f"--{name.replace('_', '-')}"


# Ranges every numeric option must lie in, checked up front: (fields, test, what the range is).
RANGES: tuple[tuple[tuple[str, ...], object, str], ...] = (
    (("lr", "exit_lr", "tau", "kd_temperature", "epochs", "stage2_epochs"), lambda v: v > 0, "> 0"),
    (
        ("batch_size", "eval_batch_size", "max_length", "mha_dim", "mha_heads", "max_steps", "eval_every"),
        lambda v: v >= 1,
        ">= 1",
    ),
    (("max_train_examples", "max_dev_examples", "early_stopping_patience"), lambda v: v >= 1, ">= 1"),
    (("weight_decay", "grad_clip", "seed", "dev_subset_seed"), lambda v: v >= 0, ">= 0"),
    (("dropout",), lambda v: 0 <= v < 1, "within [0, 1)"),
    (("lam", "kd_weight"), lambda v: 0 <= v <= 1, "within [0, 1]"),
    (("warmup",), lambda v: 0 <= v < 1, "a fraction of the steps within [0, 1)"),
    (("acl_grad_threshold",), lambda v: 0 < v <= 180, "an angle in degrees within (0, 180]"),
)


@dataclass
class TrainConfig:
    """One run. Defaults: AdamW lr 2e-5, weight decay 0.01, dropout 0.1, 10 % warmup, λ 0.02, τ 0.5, gradient
    equilibrium on (ElasticBERT's official code), exit heads at `DEFAULT_EXIT_LR` (a departure, see above)."""

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
    gradient_equilibrium: bool = True  # only acts where several exits train the shared layers (JT, ALT)
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
    exit_lr: float | None = DEFAULT_EXIT_LR  # learning rate of the exit heads; None: the same as `lr`
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
    # Stop a phase after this many evaluations in a row without a better selection score (None: never). The best
    # weights seen are kept either way.
    early_stopping_patience: int | None = None
    deepspeed: str | None = None
    device: Device = "auto"
    progress: bool = True
    overwrite: bool = False  # replace a finished run in `output` (a running one is never touched)
    recipe: str | None = None  # the preset these values started from (finetune/presets/NAME.yaml), if any
    # Where the values came from (recipe file, flags that overrode it, resolved paths): saved, not a setting.
    provenance: dict = field(default_factory=dict, compare=False)

    def validate(
        self, num_labels: int | None = None, model_layers: int | None = None, max_positions: int | None = None
    ) -> TrainConfig:
        """Check option values and combinations; `num_labels`, `model_layers` and `max_positions` (tokens the model
        can embed) enable the task- and model-aware checks."""
        problems = literal_problems(self, key=flag) + self.range_problems()
        if problems:
            raise ConfigError(problems)
        if self.mha_dim % self.mha_heads:
            raise ConfigError(f"--mha-dim {self.mha_dim} is not a multiple of --mha-heads {self.mha_heads}")
        if max_positions is not None and self.max_length > max_positions:
            raise ConfigError(
                f"--max-length {self.max_length}: the model {self.model} embeds at most {max_positions} positions "
                f"(its max_position_embeddings); pass --max-length {max_positions} or less"
            )
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

    def range_problems(self) -> list[str]:
        """Every numeric option outside its range (None means "not set" and is always allowed)."""
        problems = []
        for names, test, text in RANGES:
            for name in names:
                value = getattr(self, name)
                if value is None:
                    continue
                if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                    problems.append(f"{flag(name)} must be a number {text}, got {value!r}")
                elif not test(value):
                    problems.append(f"{flag(name)} must be {text}, got {value}")
        return problems

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
        """A run's run_config.json (unknown keys of other versions are ignored)."""
        try:
            raw = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ConfigError(f"{path}: cannot read the run's configuration ({err})") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a JSON object")
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
