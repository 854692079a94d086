"""The typed configuration of one fine-tuning run: nested sections read by `common.config.ConfigLayers` (the loader
pretrain uses too), validated before anything loads, saved into the run directory with the source of every value.

Values resolve as the defaults below < a config file (`--config FILE`, or `--recipe NAME`: a preset of
finetune/presets/, the papers' recipes) < the command-line shortcuts (`--lr`, `--exits`, ... one per key, `SHORTCUTS`)
< `--set section.key=value`. Defaults are chosen to learn on small real data (see `DEFAULT_EXIT_LR`).

A config file is the sections below, plus optional `name`, `description` and `by_method` (values that depend on the
resolved `method.name`, e.g. `by_method: {2st: {train: {epochs: 3}}}`):

    description: one line
    optim: {lr: 2.0e-5, exit_lr: null}
    train: {epochs: 5}
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from common.config import (
    RENAMED_KEYS,
    ConfigLayers,
    Findings,
    build,
    config_root,
    leaf_keys,
    literal_choices,
    literal_problems,
    read_yaml_mapping,
    rename_keys,
    stored_tree,
    warmup_problems,
)
from common.errors import ConfigError
from common.io import atomic_write_json, read_object
from common.vocab import DEFAULT_MAX_UNK_FRACTION

# Fixed choices: the allowed values live in the type (`--help`, validation and `common.config` read them from here).
Method = Literal["jt", "2st", "alt"]
Objective = Literal["ce", "ce+scl", "acl", "acl-cl"]
ExitType = Literal["linear", "mha"]
AngleScope = Literal["exit", "all", "representation"]
JTWeights = Literal["uniform", "layer"]
Reduction = Literal["sum", "mean"]
Granularity = Literal["batch", "exit"]
Device = Literal["auto", "cpu", "cuda"]  # auto: CUDA when available, else the CPU (`finetune.model.resolve_device`)


# Departure from the papers (measured, see docs/finetuning.md "Defaults that learn"): the exit heads train with their
# own learning rate. ElasticBERT and ACL use one learning rate (2e-5) for backbone and exits; at that rate freshly
# initialised MHA exits (four chained random layers) keep their logits near zero for the few hundred steps of a small
# run, and 2ST's stage 2 (backbone frozen) cannot learn at all. The recipes set `exit_lr: null` (= optim.lr), the
# papers'.
DEFAULT_EXIT_LR = 1e-3


def parse_exits(value: Any) -> list[int] | str | None:
    """`model.exits`: null, "all", a list of layers, or "1,3,6" / "1-6" as written on a command line."""
    if not isinstance(value, str) or value == "all":
        return value
    layers: list[int] = []
    for part in value.split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                layers.extend(range(lo, hi + 1))
            elif part:
                layers.append(int(part))
        except ValueError:
            raise ValueError(f"{value!r}: expected 'all' or layers such as 1,3,6 or 1-6") from None
    if not layers:
        raise ValueError(f"{value!r}: no layers given")
    return layers


def parse_exit_lr(value: Any) -> Any:
    """`optim.exit_lr`: a number, or "same" (= null: the backbone's optim.lr, the papers' single learning rate)."""
    return None if isinstance(value, str) and value.strip().lower() == "same" else value


@dataclass
class ModelConfig:
    path: str = ""  # model dir or hub name (required)
    tokenizer: str | None = None  # None: the model's
    layers: int | None = None  # static truncation: keep l layers
    # None: one exit at the top; "all"; or explicit layers
    exits: list[int] | Literal["all"] | None = field(default=None, metadata={"parse": parse_exits})
    exit_type: ExitType = "linear"
    mha_dim: int = 64
    mha_heads: int = 4
    dropout: float = 0.1


@dataclass
class DataConfig:
    task: str = ""  # GLUE task or elue/NAME (required)
    dir: str | None = None  # None: $GLUE_DIR (`finetune.data`)
    max_length: int = 128
    max_train_examples: int | None = None
    max_dev_examples: int | None = None
    # The dev subset does not follow `train.seed`: every seed and arm is scored on the same rows, the ones
    # `finetune early-exit --max-examples` picks too.
    dev_subset_seed: int = 0
    # Refuse a tokenizer that turns more than this share of the training text into [UNK] (data_prep's guard and
    # threshold, `common.vocab`); 1.0: never.
    max_unk_fraction: float = DEFAULT_MAX_UNK_FRACTION
    # Training batches of examples of similar length (within pools of 50 batches, `finetune.data.LENGTH_POOL`), each
    # padded to its longest: 2-5 % padding instead of 34-67 % on GLUE at batch 32 (docs/finetuning.md).
    # Off by default: it changes which examples share a batch (the papers' runs draw random batches); the same
    # examples, padded less, give the same per-exit losses (tests/finetune/test_length_grouping.py).
    group_by_length: bool = False


@dataclass
class MethodConfig:
    name: Method = "jt"
    jt_weights: JTWeights = "uniform"
    gradient_equilibrium: bool = True  # only acts where several exits train the shared layers (JT, ALT)
    stage2_epochs: float | None = None  # 2ST stage 2; None: train.epochs


@dataclass
class ObjectiveConfig:
    name: Objective = "ce"
    lam: float = 0.02  # λ, the contrastive weight (--lambda)
    tau: float = 0.5
    # Mean over the anchors, not the formula's Σ_i (Gunel et al.; "sum" is one flag away): CE is a batch mean, and
    # summed over 32 anchors λ = 0.02 weighs like 0.64 of a mean. Measured (docs/results/acl_lambda, SST-2, 2ST, MHA
    # exits, 3 seeds): the full ACL recipe at sum λ 0.02 ends 5-8 points below plain 2ST-MHA on every seed; at mean
    # λ 0.005-0.02 it lands -0.1 to +0.4 from it per seed. The paper's λ grid (up to 1.0) only makes sense as a mean.
    contrastive_reduction: Reduction = "mean"
    kd_weight: float | None = None  # None: 0.5 in 2ST stage 2, 0 elsewhere
    kd_temperature: float = 2.0
    acl_grad: bool = False
    acl_grad_scope: AngleScope = "exit"
    acl_grad_threshold: float = 90.0
    acl_grad_granularity: Granularity = "batch"
    log_angles: bool = True


@dataclass
class OptimConfig:
    lr: float = 2e-5
    exit_lr: float | None = field(default=DEFAULT_EXIT_LR, metadata={"parse": parse_exit_lr})  # None: optim.lr
    weight_decay: float = 0.01
    # Linear warm-up, then linear decay to 0, per phase: `warmup_steps` steps, or `warmup_fraction` of the phase's
    # steps (exclusive, as in pre-training). The default 10 % gives way when warmup_steps is set and no layer sets a
    # fraction. (`optim.warmup` before; the old key is read as warmup_fraction until the next release.)
    warmup_steps: int = 0
    warmup_fraction: float | None = 0.1
    grad_clip: float = 1.0


@dataclass
class TrainConfig:
    seed: int = 42
    epochs: float = 3.0
    # steps per phase; overrides epochs (None: train.epochs). `train.max_steps` before (read until the next release).
    train_steps: int | None = None
    batch_size: int = 32
    eval_batch_size: int = 64
    eval_every: int | None = None  # steps; None: at the end of every epoch
    # Stop a phase after this many evaluations in a row without a better selection score (None: never). The best
    # weights seen are kept either way.
    early_stopping_patience: int | None = None
    device: Device = "auto"
    ds_config: str | None = None  # a DeepSpeed JSON (optional)
    progress: bool = True


class FinetuneConfig(
    config_root("finetune", ModelConfig, DataConfig, MethodConfig, ObjectiveConfig, OptimConfig, TrainConfig)
):
    """One run: a section per component (model, data, method, objective, optim, train: the classes above,
    `common.config.config_root`), `to_dict`, `value("optim.lr")`; its renamed keys are in
    `common.config.RENAMED_KEYS["finetune"]`. Defaults: AdamW lr 2e-5, weight decay 0.01, dropout 0.1, 10 % warmup,
    λ 0.02, τ 0.5, gradient equilibrium on (ElasticBERT's official code), exit heads at `DEFAULT_EXIT_LR` (a
    departure, see above)."""

    def validate(
        self, num_labels: int | None = None, model_layers: int | None = None, max_positions: int | None = None
    ) -> FinetuneConfig:
        """Check values and combinations; `num_labels`, `model_layers` and `max_positions` (tokens the model can
        embed) enable the task- and model-aware checks."""
        problems = [p for section in dataclasses.fields(self) for p in _choice_problems(self, section.name)]
        problems += config_problems(self)
        if problems:
            raise ConfigError(problems)
        m = self.model
        if max_positions is not None and self.data.max_length > max_positions:
            raise ConfigError(
                f"{spell('data.max_length')} {self.data.max_length}: the model {m.path} embeds at most "
                f"{max_positions} positions (its max_position_embeddings); pass --max-length {max_positions} or less"
            )
        if num_labels == 1 and self.objective.name != "ce":
            raise ConfigError(
                f"--objective {self.objective.name} needs class labels (contrastive positives are same-class items); "
                f"task {self.data.task} is regression: use --objective ce"
            )
        if model_layers is not None:
            layers = self.resolved_exits(model_layers)
            if self.method.name in ("2st", "alt") and len(layers) < 2:
                raise ConfigError(f"--method {self.method.name} needs at least two exits (got {layers}); pass --exits")
        return self

    def num_layers(self, model_layers: int) -> int:
        """Layers the fine-tuned model keeps: model.layers, else the deepest exit (deeper layers would never run)."""
        m = self.model
        if m.layers is not None:
            if not 1 <= m.layers <= model_layers:
                raise ConfigError(f"{spell('model.layers')} {m.layers}: the checkpoint has {model_layers} layers")
            return m.layers
        if isinstance(m.exits, list) and m.exits:
            bad = [e for e in m.exits if not 1 <= e <= model_layers]
            if bad:
                raise ConfigError(
                    f"{spell('model.exits')} {m.exits}: layers {bad} outside 1..{model_layers} (the checkpoint's)"
                )
            return max(m.exits)
        return model_layers

    def resolved_exits(self, model_layers: int) -> list[int]:
        """Sorted exit layers: explicit model.exits, "all", or the single top layer (static truncation / plain)."""
        top = self.num_layers(model_layers)
        exits = self.model.exits
        if exits is None:
            return [top]
        if exits == "all":
            return list(range(1, top + 1))
        bad = [e for e in exits if not 1 <= e <= top]
        if bad:
            raise ConfigError(f"{spell('model.exits')} {exits}: layers {bad} outside 1..{top}")
        return sorted(set(exits))


# ------------------------------------------------------------------------------------------ command-line shortcuts

# Every key has a flag of its own (`finetune train --lr 3e-5` = `--set optim.lr=3e-5`): `--` + the key's last part
# with '-' for '_', except where FLAG_NAMES says otherwise.
SHORTCUTS: tuple[str, ...] = tuple(leaf_keys(FinetuneConfig()))
FLAG_NAMES = {
    "model.path": "model",
    "data.task": "task",
    "data.dir": "data-dir",
    "method.name": "method",
    "objective.name": "objective",
    "objective.lam": "lambda",
}


def flag(key: str) -> str:
    """The command-line spelling of a shortcut key (`optim.lr` is `--lr`, `objective.lam` is `--lambda`)."""
    return "--" + FLAG_NAMES.get(key, key.rsplit(".", 1)[-1].replace("_", "-"))


# Flags of renamed keys, accepted (with one deprecation line) until the next release: old key -> its help.
DEPRECATED_FLAGS = {old: f"deprecated: use {flag(new)}" for old, new in RENAMED_KEYS["finetune"].items()}


def spell(key: str) -> str:
    """A key as the user may have written it: `--lr (optim.lr)`, or the key alone where it has no flag."""
    return f"{flag(key)} ({key})" if key in SHORTCUTS or key in DEPRECATED_FLAGS else key


def layers_of_config() -> ConfigLayers:
    """An empty set of layers of `FinetuneConfig` (a deprecated or conflicting key named with its flag)."""
    return ConfigLayers(FinetuneConfig, spell=spell)


def flat_names() -> dict[str, str]:
    """Shortcut keys by their flat name: the flag's (`lr`, `data_dir`, `lambda`), also the field names of the flat
    run configs of earlier versions (`lam`, `deepspeed`)."""
    names = {flag(key)[2:].replace("-", "_"): key for key in (*SHORTCUTS, *DEPRECATED_FLAGS)}  # old: renamed on load
    return names | {"lam": "objective.lam", "deepspeed": "train.ds_config"}


def shortcut_key(name: str) -> str:
    """The key of a shortcut given by its flat name (`lr` -> optim.lr)."""
    names = flat_names()
    if name in names:
        return names[name]
    close = difflib.get_close_matches(name, names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ConfigError(f"{name!r} is not a fine-tuning setting{hint}")


def nest(values: Mapping[str, Any]) -> dict[str, Any]:
    """{"optim.lr": 1e-4} -> {"optim": {"lr": 1e-4}}."""
    tree: dict[str, Any] = {}
    for key, value in values.items():
        section, name = key.split(".", 1)
        tree.setdefault(section, {})[name] = value
    return tree


def from_shortcuts(**values: Any) -> FinetuneConfig:
    """A config from flat shortcut names (`from_shortcuts(model=..., task=..., lr=1e-4, exits=[1, 2])`), read and
    checked as the command line's are; for tests and notebooks."""
    layers = layers_of_config()
    layers.add(nest({shortcut_key(name): value for name, value in values.items()}), "arguments")
    return finish(layers, "arguments")


# ------------------------------------------------------------------------------------------ files and resolution

ENVIRONMENT = {"data.dir": "GLUE_DIR"}  # keys an environment variable sets when no file or flag does
RECIPE_DIR = Path(__file__).resolve().parent / "presets"
FILE_META = ("name", "description", "by_method")


@dataclass(frozen=True)
class ConfigFile:
    """A config file (a shipped preset or the user's): its sections and the method-dependent ones."""

    name: str
    path: Path
    description: str = ""
    values: dict[str, Any] = field(default_factory=dict)
    by_method: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def source(self) -> str:
        """How run_config.json names it: `recipe NAME` for a shipped preset, else `config PATH`."""
        return f"recipe {self.name}" if self.path.parent == RECIPE_DIR else f"config {self.path}"

    def values_for(self, method: str) -> dict[str, Any]:
        """The file's values for a run of `method` (its by_method entry merged over the rest)."""
        layers = ConfigLayers(FinetuneConfig)
        layers.add(self.values, "file")
        layers.add(self.by_method.get(method, {}), "file")
        return layers.tree


def recipe_names() -> list[str]:
    """The presets shipped in finetune/presets/."""
    return sorted(p.stem for p in RECIPE_DIR.glob("*.yaml")) if RECIPE_DIR.is_dir() else []


def config_path(name_or_path: str) -> Path:
    """finetune/presets/NAME.yaml for a shipped name, else the path given (a .yaml/.yml file)."""
    if name_or_path in recipe_names():
        return RECIPE_DIR / f"{name_or_path}.yaml"
    path = Path(name_or_path)
    if path.is_dir():
        raise ConfigError(f"--config {name_or_path}: is a folder, not a file (a .yaml run config, or a recipe name)")
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise ConfigError(f"--config {name_or_path}: no such file")
        return path
    close = difflib.get_close_matches(name_or_path, recipe_names(), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    shipped = ", ".join(recipe_names()) or f"none found in {RECIPE_DIR}"
    raise ConfigError(f"--config {name_or_path!r}: unknown recipe{hint}; expected one of {shipped}, or a .yaml file")


def load_config_file(name_or_path: str) -> ConfigFile:
    """Read and check one config file or preset: every section and every by_method entry is typed now, so a typo
    in an entry for another method is found too."""
    path = config_path(name_or_path)
    raw = read_yaml_mapping(path)
    values = rename_keys({k: v for k, v in raw.items() if k not in FILE_META}, FinetuneConfig, str(path))
    problems = _tree_problems(values, path)
    by_method_raw = raw.get("by_method") or {}
    if not isinstance(by_method_raw, Mapping):
        raise ConfigError(f"{path}: by_method must map a method name to sections")
    methods = literal_choices(Method) or ()
    by_method: dict[str, dict[str, Any]] = {}
    for method, entry in by_method_raw.items():
        if method not in methods:
            problems.append(f"{path}: by_method.{method}: not a method (expected one of {', '.join(methods)})")
        elif not isinstance(entry, Mapping):
            problems.append(f"{path}: by_method.{method}: expected sections such as train: {{epochs: 3}}")
        else:
            by_method[method] = rename_keys(entry, FinetuneConfig, f"{path} by_method.{method}")
            problems += _tree_problems(by_method[method], path, f"by_method.{method}")
    if problems:
        raise ConfigError(problems)
    name = str(raw.get("name") or path.stem)
    return ConfigFile(name, path, str(raw.get("description") or ""), values, by_method)


def _tree_problems(tree: Mapping[str, Any], path: Path, prefix: str = "") -> list[str]:
    found = Findings()
    build(FinetuneConfig, tree, prefix, found)
    return [f"{path}: {p}" for p in found.problems]


def resolve_config(
    file: ConfigFile | None, shortcuts: Mapping[str, Any], overrides: list[str]
) -> tuple[FinetuneConfig, dict[str, str]]:
    """The run's config (defaults < environment < file < shortcut flags < --set) and the source of every value."""
    method = _method_after(file, shortcuts, overrides)
    layers = layers_of_config()
    for key, variable in ENVIRONMENT.items():
        if os.environ.get(variable):
            layers.add(nest({key: os.environ[variable]}), f"${variable}")
    if file is not None:
        layers.add(file.values_for(method), file.source)
    layers.add_each(shortcuts, flag)
    layers.add_overrides(overrides)
    cfg = finish(layers, "command line")
    return cfg, layers.source_of_every_key(cfg)


def _method_after(file: ConfigFile | None, shortcuts: Mapping[str, Any], overrides: list[str]) -> str:
    """method.name as every layer but by_method resolves it (by_method is chosen by it)."""
    layers = layers_of_config()
    if file is not None:
        layers.add(file.values, "file")
    layers.add_each(shortcuts, flag)
    layers.add_overrides(overrides)
    return str(layers.value("method.name", MethodConfig.name))


def finish(layers: ConfigLayers, source: str) -> FinetuneConfig:
    """Build, then check meaning once every value has its type; every problem at once. A warm-up given in steps
    where no layer gives a fraction replaces the default fraction (they are exclusive)."""
    if layers.value("optim.warmup_steps") and not layers.written("optim.warmup_fraction"):
        layers.add({"optim": {"warmup_fraction": None}}, f"{flag('optim.warmup_steps')} (the default fraction off)")
    cfg, found = layers.build()
    if found.types_sound:
        found.problems.extend(config_problems(cfg))
    if found.problems:
        raise ConfigError(found.problems, source=source)
    return cfg


# ------------------------------------------------------------------------------------------------------ validation

# Ranges every numeric value must lie in, checked up front: (keys, test, what the range is).
RANGES: tuple[tuple[tuple[str, ...], Any, str], ...] = (
    (
        ("optim.lr", "optim.exit_lr", "objective.tau", "objective.kd_temperature", "train.epochs"),
        lambda v: v > 0,
        "> 0",
    ),
    (("method.stage2_epochs",), lambda v: v > 0, "> 0"),
    (
        ("train.batch_size", "train.eval_batch_size", "data.max_length", "model.mha_dim", "model.mha_heads"),
        lambda v: v >= 1,
        ">= 1",
    ),
    (("train.train_steps", "train.eval_every", "train.early_stopping_patience"), lambda v: v >= 1, ">= 1"),
    (("data.max_train_examples", "data.max_dev_examples"), lambda v: v >= 1, ">= 1"),
    (("optim.weight_decay", "optim.grad_clip", "train.seed", "data.dev_subset_seed"), lambda v: v >= 0, ">= 0"),
    (("model.dropout",), lambda v: 0 <= v < 1, "within [0, 1)"),
    (("objective.lam", "objective.kd_weight", "data.max_unk_fraction"), lambda v: 0 <= v <= 1, "within [0, 1]"),
    (("objective.acl_grad_threshold",), lambda v: 0 < v <= 180, "an angle in degrees within (0, 180]"),
)


def _choice_problems(cfg: FinetuneConfig, section: str) -> list[str]:
    """Values outside their `Literal` choices (the loader reports them while reading; a config built in code is
    checked here)."""
    return literal_problems(getattr(cfg, section), key=lambda name: spell(f"{section}.{name}"))


def config_problems(cfg: FinetuneConfig) -> list[str]:
    """Every problem of meaning that needs neither the model nor the data (types and choices are assumed sound)."""
    problems = []
    for keys, test, text in RANGES:
        for key in keys:
            value = cfg.value(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                problems.append(f"{spell(key)} must be a number {text}, got {value!r}")
            elif not test(value):
                problems.append(f"{spell(key)} must be {text}, got {value}")
    for key in ("model.path", "data.task"):
        if not cfg.value(key):
            problems.append(f"{key} is not set: pass {flag(key)} (or set it in --config)")
    if cfg.model.mha_dim % max(cfg.model.mha_heads, 1):
        problems.append(f"--mha-dim {cfg.model.mha_dim} is not a multiple of --mha-heads {cfg.model.mha_heads}")
    if cfg.objective.acl_grad_granularity == "exit" and cfg.objective.acl_grad_scope == "all":
        problems.append("--acl-grad-granularity exit needs --acl-grad-scope exit or representation")
    o, t = cfg.optim, cfg.train
    if isinstance(o.warmup_steps, int) and (o.warmup_fraction is None or isinstance(o.warmup_fraction, int | float)):
        problems += warmup_problems(o.warmup_steps, o.warmup_fraction, spell)
        if t.train_steps is not None and o.warmup_steps > t.train_steps:
            problems.append(
                f"{spell('optim.warmup_steps')} {o.warmup_steps} exceeds {spell('train.train_steps')} {t.train_steps}"
            )
    return problems


# ------------------------------------------------------------------------------------------------ run_config.json


def save_run_config(path: Path, cfg: FinetuneConfig, sources: Mapping[str, str], **resolved: str) -> None:
    """RUN/run_config.json: the resolved config, where each value came from, and resolved paths (model, tokenizer)."""
    atomic_write_json(path, {"config": cfg.to_dict(), "sources": dict(sources), "resolved": resolved})


def load_run_config(path: Path) -> FinetuneConfig:
    """A run's run_config.json; a flat one of earlier versions is read through the shortcut names (keys they do not
    know are ignored)."""
    raw = read_object(path, ConfigError, "the run's configuration")
    names = flat_names()
    tree = raw["config"] if "config" in raw else nest({names[k]: v for k, v in raw.items() if k in names})
    found = Findings()
    cfg = build(FinetuneConfig, stored_tree(tree, FinetuneConfig), "", found)
    if found.problems:
        raise ConfigError(found.problems, source=str(path))
    return cfg
