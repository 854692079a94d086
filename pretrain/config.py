"""Typed run configuration: YAML + `--set a.b=c` overrides, validated before anything expensive starts.

One dataclass per component (model, data, exits, optim, train, checkpoint, eval, logging) so each part of the
trainer receives only what it needs, and every key a user can write is declared in exactly one place: an unknown key
is a typo, not a silent no-op.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent


class ConfigError(ValueError):
    """A run configuration that cannot work; the message lists every problem found, one per line."""

    def __init__(self, problems: list[str] | str, source: str = "config") -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid {source}:\n{lines}")


@dataclass
class ModelConfig:
    """Architecture (ignored except for dropout when `init_from` names a checkpoint, which brings its own)."""

    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    vocab_size: int | None = None  # None: the data's tokenizer vocabulary size
    init_from: str | None = None  # None: from scratch; "minilm": the MiniLM package; else an HF/BERT directory
    activation_checkpointing: bool = False


@dataclass
class CorpusConfig:
    """One prepared corpus (a data_prep output directory) and its sampling weight in the blend."""

    path: str = ""
    weight: float = 1.0
    name: str | None = None


@dataclass
class DataConfig:
    corpora: list[CorpusConfig] = field(default_factory=list)
    max_seq_len: int = 512
    short_seq_prob: float = 0.1
    masked_lm_prob: float = 0.15
    max_ngram: int = 3
    num_workers: int = 2
    index_cache_dir: str | None = None  # None: beside the data (falls back to RUN/index_cache if read-only)
    blend_block: int = 1000  # blending is exact within every block of this many samples
    verify: bool = True  # full `data_prep verify` (re-hash) once per corpus version; a stamp records success


@dataclass
class ExitsConfig:
    """Grouped exits: `groups` explicit (1-based layers), or derived from `num_groups` (layer l<L -> (l-1) mod G)."""

    num_groups: int = 2
    groups: list[list[int]] | None = None
    gradient_equilibrium: bool = True
    # The BERT-style baseline of the ElasticBERT paper: MLM + SOP at the top layer only (the other exits' heads exist,
    # so the export has ElasticBERT's layout, but never train).
    last_layer_only: bool = False


@dataclass
class OptimConfig:
    name: str = "adamw"  # "adamw" (ZeRO 0-3) or "lamb" (DeepSpeed FusedLamb: CUDA and ZeRO-0 only)
    lr: float = 1e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1e-6
    weight_decay: float = 0.01
    warmup_steps: int = 0
    decay: str = "linear"  # "linear" | "cosine" | "constant"
    min_lr_ratio: float = 0.0
    grad_clip: float = 1.0


@dataclass
class TrainConfig:
    train_steps: int = 1000
    global_batch_size: int = 256
    micro_batch_size: int = 32
    seed: int = 1234
    ds_config: str = "ds_configs/zero1_bf16.json"
    zero_stage: int | None = None  # overrides the JSON's stage (same file, another stage)
    precision: str = "auto"  # "auto" (the JSON's bf16/fp16 sections) | "fp32" | "bf16" | "fp16"
    stop_after_steps: int | None = None  # stop (with a checkpoint) before train_steps; the schedule is unchanged


@dataclass
class CheckpointConfig:
    interval: int = 1000
    keep_last: int = 3
    force_resume: bool = False  # resume even when the checkpoint was written under a different config
    dump_final_weights: bool = False  # write the gathered in-memory fp32 weights at the end (verifies export)


@dataclass
class EvalConfig:
    interval: int = 0  # optimizer steps between validations; 0 = never (a final one still runs if > 0)
    max_samples: int = 512
    micro_batch_size: int | None = None  # None: train.micro_batch_size


@dataclass
class LoggingConfig:
    tensorboard: bool = True
    progress: bool = True
    tb_interval: int = 1
    peak_tflops: float | None = None  # per device, for MFU; None: measured matmul peak on CPU, table on GPU
    log_samples: bool = False  # per rank, the sample ids of every micro-batch (RUN/samples_rank{r}.jsonl)


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    exits: ExitsConfig = field(default_factory=ExitsConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def exit_groups(self) -> list[tuple[int, ...]]:
        """The exit groups, trained in turn: optimizer step t trains group t mod G."""
        if self.exits.last_layer_only:
            return [(self.model.num_hidden_layers,)]
        if self.exits.groups is not None:
            return [tuple(sorted(set(g))) for g in self.exits.groups]
        return derive_exit_groups(self.model.num_hidden_layers, self.exits.num_groups)

    def semantic_hash(self) -> str:
        """Hash of everything that changes what a step computes (model, data, exits, optimisation, seed, global
        batch, schedule length). Micro-batch, workers, logging and checkpoint cadence are free to change on
        resume; anything in the hash is refused unless forced."""
        d = self.to_dict()
        keep = {
            "model": {k: v for k, v in d["model"].items() if k != "activation_checkpointing"},
            "data": {k: v for k, v in d["data"].items() if k not in ("num_workers", "index_cache_dir", "verify")},
            "exits": self.exit_groups(),
            "gradient_equilibrium": self.exits.gradient_equilibrium,
            "optim": d["optim"],
            "train": {k: d["train"][k] for k in ("train_steps", "global_batch_size", "seed")},
        }
        blob = json.dumps(keep, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def derive_exit_groups(num_layers: int, num_groups: int) -> list[tuple[int, ...]]:
    """Layer l < L goes to group (l-1) mod G; the top layer L is in every group (same rule as the model package)."""
    return [
        tuple(layer for layer in range(1, num_layers) if (layer - 1) % num_groups == g) + (num_layers,)
        for g in range(num_groups)
    ]


# ------------------------------------------------------------------------------------------------ dict -> dataclass


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _coerce(value: Any, tp: Any, key: str, problems: list[str]) -> Any:
    """Check/convert one YAML value against a field type; record a readable problem instead of raising."""
    tp, optional = _strip_optional(tp)
    if value is None:
        if not optional:
            problems.append(f"{key}: must not be null")
        return None
    if _is_dataclass_type(tp):
        if not isinstance(value, dict):
            problems.append(f"{key}: expected a mapping, got {type(value).__name__}")
            return tp()
        return _build(tp, value, key, problems)
    origin = typing.get_origin(tp)
    if origin is list:
        (inner,) = typing.get_args(tp)
        if not isinstance(value, list | tuple):
            problems.append(f"{key}: expected a list, got {value!r}")
            return []
        return [_coerce(v, inner, f"{key}[{i}]", problems) for i, v in enumerate(value)]
    if tp is bool:
        if not isinstance(value, bool):
            problems.append(f"{key}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            problems.append(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            if isinstance(value, str):
                try:
                    return float(value)  # YAML reads "1e-3" as a string
                except ValueError:
                    pass
            problems.append(f"{key}: expected a number, got {value!r}")
            return value
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            problems.append(f"{key}: expected a string, got {value!r}")
        return value
    return value


def _build(cls: type, data: dict[str, Any], prefix: str, problems: list[str]) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in data.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f" (did you mean '{prefix + '.' if prefix else ''}{close[0]}'?)" if close else ""
            problems.append(f"unknown key '{full}'{hint}; known: {', '.join(fields)}")
            continue
        kwargs[key] = _coerce(value, hints[key], full, problems)
    return cls(**kwargs)


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected key=value, e.g. optim.lr=1e-4")
    key, raw = item.split("=", 1)
    value = yaml.safe_load(raw) if raw.strip() else ""
    return key.strip().split("."), value


def _apply_override(tree: dict[str, Any], path: list[str], value: Any) -> None:
    node: Any = tree
    for i, part in enumerate(path[:-1]):
        if isinstance(node, list):
            idx = int(part)
            while len(node) <= idx:
                node.append({})
            node = node[idx]
            continue
        if part not in node or node[part] is None:
            node[part] = [] if path[i + 1].isdigit() else {}
        node = node[part]
    last = path[-1]
    if isinstance(node, list):
        idx = int(last)
        while len(node) <= idx:
            node.append({})
        node[idx] = value
    else:
        node[last] = value


def load_config(path: str | os.PathLike | None, overrides: list[str] | None = None) -> RunConfig:
    """Read YAML, apply `key=value` overrides (values parsed as YAML), build and validate the typed config."""
    tree: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        try:
            loaded = yaml.safe_load(p.read_text(encoding="utf-8"))
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML: {e}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{p}: top level must be a mapping of sections")
        tree = loaded or {}
    for item in overrides or []:
        keys, value = _parse_override(item)
        _apply_override(tree, keys, value)
    problems: list[str] = []
    cfg = _build(RunConfig, tree, "", problems)
    if not any("expected" in q or "must not be null" in q for q in problems):  # types are sound: check meaning
        try:
            validate(cfg)
        except ConfigError as e:
            problems.extend(e.problems)
    if problems:
        raise ConfigError(problems, source=str(path or "config"))
    return cfg


def config_from_dict(tree: dict[str, Any]) -> RunConfig:
    """Rebuild a config saved with `to_dict` (e.g. RUN/config.yaml)."""
    problems: list[str] = []
    cfg = _build(RunConfig, tree, "", problems)
    if problems:
        raise ConfigError(problems)
    return cfg


# ------------------------------------------------------------------------------------------------------ validation


def validate(cfg: RunConfig, world_size: int | None = None) -> None:
    """Every check that needs no data and no process group; `world_size` adds the batch-divisibility check."""
    p: list[str] = []
    m, d, x, o, t = cfg.model, cfg.data, cfg.exits, cfg.optim, cfg.train
    if m.hidden_size <= 0 or m.num_hidden_layers <= 0 or m.num_attention_heads <= 0:
        p.append("model: hidden_size, num_hidden_layers and num_attention_heads must be positive")
    elif m.hidden_size % m.num_attention_heads:
        p.append(f"model.hidden_size={m.hidden_size} is not a multiple of num_attention_heads={m.num_attention_heads}")
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
        if not 0.0 <= getattr(m, name) < 1.0:
            p.append(f"model.{name} must be in [0, 1)")
    if d.max_seq_len > m.max_position_embeddings and m.init_from is None:
        p.append(f"data.max_seq_len={d.max_seq_len} exceeds model.max_position_embeddings={m.max_position_embeddings}")
    if d.max_seq_len < 8:
        p.append(f"data.max_seq_len={d.max_seq_len} is too short for [CLS] A [SEP] B [SEP]")
    if not d.corpora:
        p.append("data.corpora: at least one prepared corpus is needed (data.corpora: [{path: DIR, weight: 1}])")
    for i, c in enumerate(d.corpora):
        if not c.path:
            p.append(f"data.corpora[{i}].path is empty")
        if not c.weight > 0:
            p.append(f"data.corpora[{i}].weight must be > 0, got {c.weight}")
    if d.corpora and all(c.weight > 0 for c in d.corpora):
        total = sum(c.weight for c in d.corpora)
        for i, c in enumerate(d.corpora):
            if c.weight / total * d.blend_block < 1:
                p.append(f"data.corpora[{i}].weight={c.weight} is below one sample per blend block of {d.blend_block}")
    if not 0.0 < d.masked_lm_prob < 1.0:
        p.append("data.masked_lm_prob must be in (0, 1)")
    if not 0.0 <= d.short_seq_prob <= 1.0:
        p.append("data.short_seq_prob must be in [0, 1]")
    if d.max_ngram < 1:
        p.append("data.max_ngram must be >= 1")
    if d.num_workers < 0:
        p.append("data.num_workers must be >= 0")

    layers = m.num_hidden_layers
    if x.last_layer_only and x.groups is not None:
        p.append("exits.last_layer_only=true and exits.groups are exclusive: pick one")
    elif x.last_layer_only:
        pass  # one group, the top layer: valid for any depth
    elif x.groups is not None:
        covered: set[int] = set()
        for gi, g in enumerate(x.groups):
            if not g:
                p.append(f"exits.groups[{gi}] is empty")
            bad = [layer for layer in g if not 1 <= layer <= layers]
            if bad:
                p.append(f"exits.groups[{gi}] has layers {bad} outside 1..{layers}")
            if layers not in g:
                p.append(f"exits.groups[{gi}] lacks the top layer {layers} (it belongs to every group)")
            covered.update(g)
        missing = sorted(set(range(1, layers + 1)) - covered)
        if missing:
            p.append(f"exits.groups miss layers {missing}: every layer's exit must be trained by some group")
    elif not 1 <= x.num_groups <= max(layers - 1, 1):
        p.append(f"exits.num_groups={x.num_groups} must be within 1..{max(layers - 1, 1)} for {layers} layers "
                 "(a group with only the top layer would leave no intermediate exit)")

    if o.name not in ("adamw", "lamb"):
        p.append(f"optim.name={o.name!r}; expected 'adamw' or 'lamb'")
    if not o.lr > 0:
        p.append("optim.lr must be > 0")
    if len(o.betas) != 2 or not all(0 <= b < 1 for b in o.betas):
        p.append(f"optim.betas={o.betas} must be two numbers in [0, 1)")
    if o.decay not in ("linear", "cosine", "constant"):
        p.append(f"optim.decay={o.decay!r}; expected linear, cosine or constant")
    if o.warmup_steps < 0 or o.warmup_steps > t.train_steps:
        p.append(f"optim.warmup_steps={o.warmup_steps} must be within 0..train.train_steps={t.train_steps}")
    if not 0.0 <= o.min_lr_ratio <= 1.0:
        p.append("optim.min_lr_ratio must be in [0, 1]")
    if o.grad_clip < 0:
        p.append("optim.grad_clip must be >= 0 (0 = off)")

    if t.train_steps <= 0:
        p.append("train.train_steps must be > 0")
    if t.global_batch_size <= 0 or t.micro_batch_size <= 0:
        p.append("train.global_batch_size and train.micro_batch_size must be > 0")
    elif t.global_batch_size % t.micro_batch_size:
        p.append(f"train.global_batch_size={t.global_batch_size} is not divisible by "
                 f"train.micro_batch_size={t.micro_batch_size}")
    elif world_size is not None and t.global_batch_size % (t.micro_batch_size * world_size):
        p.append(f"train.global_batch_size={t.global_batch_size} is not divisible by micro_batch_size × world_size "
                 f"= {t.micro_batch_size} × {world_size}; pick a micro-batch that divides "
                 f"{t.global_batch_size // world_size if t.global_batch_size % world_size == 0 else 'it'}")
    if t.zero_stage is not None and t.zero_stage not in (0, 1, 2, 3):
        p.append(f"train.zero_stage={t.zero_stage}; expected 0, 1, 2 or 3")
    if t.precision not in ("auto", "fp32", "bf16", "fp16"):
        p.append(f"train.precision={t.precision!r}; expected auto, fp32, bf16 or fp16")
    if t.stop_after_steps is not None and t.stop_after_steps <= 0:
        p.append("train.stop_after_steps must be > 0")
    if o.name == "lamb" and t.zero_stage not in (None, 0):
        p.append("optim.name=lamb needs ZeRO stage 0: ZeRO partitions flattened parameters, so LAMB's per-tensor "
                 "trust ratio would be computed over arbitrary shards (DeepSpeed lists FusedLamb as unsupported)")
    if cfg.checkpoint.interval <= 0:
        p.append("checkpoint.interval must be > 0")
    if cfg.checkpoint.keep_last < 1:
        p.append("checkpoint.keep_last must be >= 1")
    if cfg.eval.interval < 0 or cfg.eval.max_samples < 0:
        p.append("eval.interval and eval.max_samples must be >= 0")
    if cfg.logging.tb_interval <= 0:
        p.append("logging.tb_interval must be > 0")
    if p:
        raise ConfigError(p)


def save_config(cfg: RunConfig, path: Path) -> None:
    """Write the resolved config (temp + rename), so a run directory says exactly what ran."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False), encoding="utf-8")
    os.replace(tmp, path)


def resolve_path(path: str, base: Path | None = None) -> Path:
    """Expand ~ and $VARS; a relative path is taken from the CWD if it exists there, else from the repo root."""
    p = Path(os.path.expandvars(os.path.expanduser(path)))
    if p.is_absolute():
        return p
    if (Path.cwd() / p).exists() or base is None:
        return Path.cwd() / p
    return base / p
