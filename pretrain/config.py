"""Typed run configuration: YAML + `--set a.b=c` overrides, validated before anything expensive starts.

One dataclass per component (model, data, exits, optim, train, checkpoint, eval, logging) so each part of the
trainer receives only what it needs, and every key a user can write is declared in exactly one place: an unknown key
is a typo, not a silent no-op. Fixed choices are `Literal` types; a value outside them is reported with a "did you
mean" while the YAML is read (`common.config.ConfigLayers`), and `validate` checks what the values mean, one
component at a time.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from common.config import (
    ConfigLayers,
    Findings,
    build,
    config_root,
    read_yaml_mapping,
    stored_tree,
    warmup_for,
    warmup_problems,
)
from common.errors import ConfigError
from common.io import atomic_write_text

__all__ = [
    "REPO_ROOT",
    "CheckpointConfig",
    "ConfigError",
    "CorpusConfig",
    "DataConfig",
    "EvalConfig",
    "ExitsConfig",
    "LoggingConfig",
    "ModelConfig",
    "OptimConfig",
    "RunConfig",
    "TrainConfig",
    "config_from_dict",
    "config_problems",
    "derive_exit_groups",
    "load_config",
    "resolve_path",
    "save_config",
    "validate",
]

REPO_ROOT = Path(__file__).resolve().parent.parent


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
    # None: from scratch; "minilm": the MiniLM package; a directory; or a hub name such as bert-base-uncased
    # (resolved through the Hugging Face cache when the run starts, `common.hub.resolve_pretrained`)
    init_from: str | None = None
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
    max_length: int = 512  # tokens per sample (data.max_seq_len before; the old key is read until the next release)
    short_seq_prob: float = 0.1
    masked_lm_prob: float = 0.15
    max_ngram: int = 3
    num_workers: int = 2
    index_cache_dir: str | None = None  # None: beside the data (falls back to RUN/index_cache if read-only)
    blend_block: int = 1000  # blending is exact within every block of this many samples
    verify: bool = True  # full `data_prep verify` (re-hash) once per corpus version; a stamp records success
    # Refuse a corpus whose manifest records more [UNK] than this fraction of its tokens (a vocabulary that does not
    # fit the text); None: data_prep's threshold (`common.vocab.DEFAULT_MAX_UNK_FRACTION`, 1 %); 1.0: never.
    max_unk_fraction: float | None = None
    # Pack each micro-batch's samples several to a row of <= max_length (docs/pretraining.md, "Packing"): the same
    # samples, the same masks and the same losses as one sample per padded row (the paper's and BERT's way), without the
    # padding (38 % of the tokens of WikiText at 512 here). A departure in how the step is computed, not in what it
    # computes; false pads one sample per row. Not hashed: a resume may switch it.
    packing: bool = True


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
    name: Literal["adamw", "lamb"] = "adamw"  # lamb: DeepSpeed FusedLamb, CUDA and ZeRO-0 only
    # Whose kernels run the update. auto: adamw -> torch (torch.optim.AdamW, fused on GPUs: the decoupled weight decay
    # and bias correction of the paper's FusedAdam, no compiler needed), lamb -> deepspeed. deepspeed: DeepSpeed's
    # FusedAdam / FusedLamb CUDA ops, JIT-built with nvcc; `pretrain preflight` builds them once per node before the
    # launch (slurm/pretrain_base.sh), never 64 ranks at once in the first step.
    backend: Literal["auto", "torch", "deepspeed"] = "auto"
    lr: float = 1e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1e-6
    weight_decay: float = 0.01
    warmup_steps: int = 0
    warmup_fraction: float | None = None  # warm-up over this fraction of train.train_steps instead (paper: 0.04)
    decay: Literal["linear", "cosine", "constant"] = "linear"
    min_lr_ratio: float = 0.0
    grad_clip: float = 1.0

    def kernel_backend(self) -> Literal["torch", "deepspeed"]:
        """`backend` with auto resolved: torch has AdamW but no LAMB."""
        if self.backend != "auto":
            return self.backend
        return "deepspeed" if self.name == "lamb" else "torch"

    def warmup_for(self, train_steps: int) -> int:
        """Warm-up steps: `warmup_fraction` of the schedule when set, else `warmup_steps` (`common.config`, the rule
        fine-tuning follows too)."""
        return warmup_for(self.warmup_steps, self.warmup_fraction, train_steps)


@dataclass
class TrainConfig:
    train_steps: int = 1000
    global_batch_size: int = 256
    micro_batch_size: int = 32
    seed: int = 1234
    ds_config: str = "ds_configs/zero1.json"  # precision from train.precision and the device
    zero_stage: Literal[0, 1, 2, 3] | None = None  # overrides the JSON's stage (same file, another stage)
    # auto: a bf16/fp16 section the DeepSpeed JSON enables, else bf16 on GPUs with native bf16, fp16 with dynamic
    # loss scaling on GPUs without (V100), fp32 on CPU (pretrain.precision)
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    stop_after_steps: int | None = None  # stop (with a checkpoint) before train_steps; the schedule is unchanged
    # torch.compile (inductor) through DeepSpeed's engine.compile: opt-in, since the first steps of each exit group
    # compile for a minute or more; exact resume kept (docs/pretraining.md, "The compiled step")
    compile: bool = False

    def end_step(self) -> int:
        """The step this run stops at: `train_steps`, or `stop_after_steps` when sooner (the lr schedule still
        spans `train_steps`)."""
        return min(self.train_steps, self.stop_after_steps or self.train_steps)


@dataclass
class CheckpointConfig:
    interval: int = 1000
    keep_last: int = 3
    force_resume: bool = False  # resume even when the checkpoint was written under a different config
    # resume on corpora other than the checkpoint's (their fingerprints differ): the sample order starts over on them
    resume_on_new_data: bool = False
    verify_checksums: bool = True  # check checksums.json before resuming (false: only truncated files are refused)
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
    comm_timing: bool = (
        False  # per step, seconds in DeepSpeed's collectives (`comm_s`; makes every collective blocking)
    )


class RunConfig(
    config_root(
        "pretrain", ModelConfig, DataConfig, ExitsConfig, OptimConfig, TrainConfig, CheckpointConfig, EvalConfig,
        LoggingConfig,
    )
):  # fmt: skip
    """One pre-training run: a section per component (model, data, exits, optim, train, checkpoint, eval, logging:
    the classes above, `common.config.config_root`), `to_dict`, `value("optim.lr")`; its renamed keys are in
    `common.config.RENAMED_KEYS["pretrain"]`."""

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
        skip_data = ("num_workers", "index_cache_dir", "verify", "max_unk_fraction", "packing")
        # hashed under the names the hash was introduced with, so that checkpoints of earlier releases resume
        d["data"] = {HASHED_NAMES.get(k, k): v for k, v in d["data"].items()}
        # the schedule, however it is written, and not whose kernels compute the same update
        optim = {k: v for k, v in d["optim"].items() if k not in ("warmup_fraction", "backend")}
        optim["warmup_steps"] = self.optim.warmup_for(self.train.train_steps)
        keep = {
            "model": {k: v for k, v in d["model"].items() if k != "activation_checkpointing"},
            "data": {k: v for k, v in d["data"].items() if k not in skip_data},
            "exits": self.exit_groups(),
            "gradient_equilibrium": self.exits.gradient_equilibrium,
            "optim": optim,
            "train": {k: d["train"][k] for k in ("train_steps", "global_batch_size", "seed")},
        }
        blob = json.dumps(keep, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


# data keys renamed since checkpoints recorded their config hash: the hash keeps the name it had (issue 39)
HASHED_NAMES = {"max_length": "max_seq_len"}


def derive_exit_groups(num_layers: int, num_groups: int) -> list[tuple[int, ...]]:
    """Layer l < L goes to group (l-1) mod G; the top layer L is in every group (same rule as the model package)."""
    return [
        tuple(layer for layer in range(1, num_layers) if (layer - 1) % num_groups == g) + (num_layers,)
        for g in range(num_groups)
    ]


# ------------------------------------------------------------------------------------------------ YAML -> RunConfig


def load_config(path: str | os.PathLike | None, overrides: list[str] | None = None) -> RunConfig:
    """Read YAML, apply `key=value` overrides (values parsed as YAML), build and validate the typed config.

    Every problem is reported at once; the checks of meaning run only when every value has its declared type.
    """
    layers = ConfigLayers(RunConfig)
    if path is not None:
        layers.add(read_yaml_mapping(Path(path)), f"config {path}")
    layers.add_overrides(overrides or [])
    cfg, found = layers.build()
    if found.types_sound:
        found.problems.extend(config_problems(cfg))
    if found.problems:
        raise ConfigError(found.problems, source=str(path or "config"))
    return cfg


def config_from_dict(tree: dict[str, Any]) -> RunConfig:
    """Rebuild a config saved with `to_dict` (e.g. RUN/config.yaml; one of an earlier release is read under today's
    keys, `common.config.stored_tree`)."""
    found = Findings()
    cfg = build(RunConfig, stored_tree(tree, RunConfig), "", found)
    if found.problems:
        raise ConfigError(found.problems, source="config")
    return cfg


# ------------------------------------------------------------------------------------------------------ validation


def _model_problems(m: ModelConfig) -> list[str]:
    p = []
    if m.hidden_size <= 0 or m.num_hidden_layers <= 0 or m.num_attention_heads <= 0:
        p.append("model: hidden_size, num_hidden_layers and num_attention_heads must be positive")
    elif m.hidden_size % m.num_attention_heads:
        p.append(f"model.hidden_size={m.hidden_size} is not a multiple of num_attention_heads={m.num_attention_heads}")
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
        if not 0.0 <= getattr(m, name) < 1.0:
            p.append(f"model.{name} must be in [0, 1)")
    return p


def _corpora_problems(d: DataConfig) -> list[str]:
    if not d.corpora:
        return ["data.corpora: at least one prepared corpus is needed (data.corpora: [{path: DIR, weight: 1}])"]
    p = []
    for i, c in enumerate(d.corpora):
        if not c.path:
            p.append(f"data.corpora[{i}].path is empty")
        if not c.weight > 0:
            p.append(f"data.corpora[{i}].weight must be > 0, got {c.weight}")
    if all(c.weight > 0 for c in d.corpora):
        total = sum(c.weight for c in d.corpora)
        for i, c in enumerate(d.corpora):
            if c.weight / total * d.blend_block < 1:
                p.append(f"data.corpora[{i}].weight={c.weight} is below one sample per blend block of {d.blend_block}")
    return p


def _data_problems(d: DataConfig, m: ModelConfig) -> list[str]:
    p = []
    if d.max_length > m.max_position_embeddings and m.init_from is None:
        p.append(f"data.max_length={d.max_length} exceeds model.max_position_embeddings={m.max_position_embeddings}")
    if d.max_length < 8:
        p.append(f"data.max_length={d.max_length} is too short for [CLS] A [SEP] B [SEP]")
    p += _corpora_problems(d)
    if not 0.0 < d.masked_lm_prob < 1.0:
        p.append("data.masked_lm_prob must be in (0, 1)")
    if not 0.0 <= d.short_seq_prob <= 1.0:
        p.append("data.short_seq_prob must be in [0, 1]")
    if d.max_unk_fraction is not None and not 0.0 <= d.max_unk_fraction <= 1.0:
        p.append(f"data.max_unk_fraction={d.max_unk_fraction} must be in [0, 1] (1 = never refuse)")
    if d.max_ngram < 1:
        p.append("data.max_ngram must be >= 1")
    if d.num_workers < 0:
        p.append("data.num_workers must be >= 0")
    return p


def _explicit_group_problems(groups: list[list[int]], layers: int) -> list[str]:
    p = []
    covered: set[int] = set()
    for gi, g in enumerate(groups):
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
    return p


def _exit_problems(x: ExitsConfig, layers: int) -> list[str]:
    if x.last_layer_only and x.groups is not None:
        return ["exits.last_layer_only=true and exits.groups are exclusive: pick one"]
    if x.last_layer_only:
        return []  # one group, the top layer: valid for any depth
    if x.groups is not None:
        return _explicit_group_problems(x.groups, layers)
    if not 1 <= x.num_groups <= max(layers - 1, 1):
        return [
            f"exits.num_groups={x.num_groups} must be within 1..{max(layers - 1, 1)} for {layers} layers "
            "(a group with only the top layer would leave no intermediate exit)"
        ]
    return []


def _optim_problems(o: OptimConfig, train_steps: int) -> list[str]:
    p = []
    if not o.lr > 0:
        p.append("optim.lr must be > 0")
    if len(o.betas) != 2 or not all(0 <= b < 1 for b in o.betas):
        p.append(f"optim.betas={o.betas} must be two numbers in [0, 1)")
    if o.warmup_steps > train_steps:
        p.append(f"optim.warmup_steps={o.warmup_steps} must be within 0..train.train_steps={train_steps}")
    p += warmup_problems(o.warmup_steps, o.warmup_fraction)
    if not 0.0 <= o.min_lr_ratio <= 1.0:
        p.append("optim.min_lr_ratio must be in [0, 1]")
    if o.grad_clip < 0:
        p.append("optim.grad_clip must be >= 0 (0 = off)")
    return p


def _batch_problems(t: TrainConfig, world_size: int | None) -> list[str]:
    if t.global_batch_size <= 0 or t.micro_batch_size <= 0:
        return ["train.global_batch_size and train.micro_batch_size must be > 0"]
    if t.global_batch_size % t.micro_batch_size:
        return [
            f"train.global_batch_size={t.global_batch_size} is not divisible by "
            f"train.micro_batch_size={t.micro_batch_size}"
        ]
    if world_size is not None and t.global_batch_size % (t.micro_batch_size * world_size):
        hint = t.global_batch_size // world_size if t.global_batch_size % world_size == 0 else "it"
        return [
            f"train.global_batch_size={t.global_batch_size} is not divisible by micro_batch_size × world_size "
            f"= {t.micro_batch_size} × {world_size}; pick a micro-batch that divides {hint}"
        ]
    return []


def _train_problems(t: TrainConfig, o: OptimConfig, world_size: int | None) -> list[str]:
    p = []
    if t.train_steps <= 0:
        p.append("train.train_steps must be > 0")
    p += _batch_problems(t, world_size)
    if t.stop_after_steps is not None and t.stop_after_steps <= 0:
        p.append("train.stop_after_steps must be > 0")
    if o.name == "lamb" and t.zero_stage not in (None, 0):
        p.append(
            "optim.name=lamb needs ZeRO stage 0: ZeRO partitions flattened parameters, so LAMB's per-tensor "
            "trust ratio would be computed over arbitrary shards (DeepSpeed lists FusedLamb as unsupported)"
        )
    return p


def _cadence_problems(cfg: RunConfig) -> list[str]:
    p = []
    if cfg.checkpoint.interval <= 0:
        p.append("checkpoint.interval must be > 0")
    if cfg.checkpoint.keep_last < 1:
        p.append("checkpoint.keep_last must be >= 1")
    if cfg.eval.interval < 0 or cfg.eval.max_samples < 0:
        p.append("eval.interval and eval.max_samples must be >= 0")
    if cfg.logging.tb_interval <= 0:
        p.append("logging.tb_interval must be > 0")
    return p


def _compile_problems(cfg: RunConfig) -> list[str]:
    """Packing varies the number of rows of every micro-batch (1 to micro_batch_size), the compiled step wants one
    static shape: padding the rows back to micro_batch_size would give back all that packing saves, and a dynamic
    row count would recompile each graph again. So the two are exclusive (docs/pretraining.md, "Packing")."""
    if cfg.train.compile and cfg.data.packing:
        return [
            "train.compile=true needs data.packing=false (the compiled step has one static shape; packed micro-batches "
            "vary in rows): set data.packing=false to compile, or train.compile=false to pack"
        ]
    return []


def config_problems(cfg: RunConfig, world_size: int | None = None) -> list[str]:
    """Every problem of meaning that needs no data and no process group (types are assumed sound)."""
    return [
        *_model_problems(cfg.model),
        *_data_problems(cfg.data, cfg.model),
        *_exit_problems(cfg.exits, cfg.model.num_hidden_layers),
        *_optim_problems(cfg.optim, cfg.train.train_steps),
        *_train_problems(cfg.train, cfg.optim, world_size),
        *_cadence_problems(cfg),
        *_compile_problems(cfg),
    ]


def validate(cfg: RunConfig, world_size: int | None = None) -> None:
    """Raise ConfigError listing `config_problems`; `world_size` adds the batch-divisibility check."""
    problems = config_problems(cfg, world_size)
    if problems:
        raise ConfigError(problems)


def save_config(cfg: RunConfig, path: Path) -> None:
    """Write the resolved config atomically, so a run directory says exactly what ran."""
    atomic_write_text(path, yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def write_resolved_configs(run_dir: Path, cfg: RunConfig, ds_config: dict[str, Any]) -> None:
    """RUN/config.yaml (the resolved run config) and RUN/ds_config.json (the filled DeepSpeed config)."""
    save_config(cfg, run_dir / "config.yaml")
    atomic_write_text(run_dir / "ds_config.json", json.dumps(ds_config, indent=2))


def resolve_path(path: str, base: Path | None = None) -> Path:
    """Expand ~ and $VARS; a relative path is taken from the CWD if it exists there, else from the repo root."""
    p = Path(os.path.expandvars(os.path.expanduser(path)))
    if p.is_absolute():
        return p
    if (Path.cwd() / p).exists() or base is None:
        return Path.cwd() / p
    return base / p
