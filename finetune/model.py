"""Building the classifier for a run and partitioning its parameters into backbone and exits.

Fine-tuned runs save to `RUN_DIR/best` with `save_pretrained`; load them back with
`elasticbert.load_pretrained(ElasticBertForSequenceClassification, RUN_DIR / "best")`, `load_finetuned(dir)` (which
also checks the exits are there) or `AutoModelForSequenceClassification` after `import elasticbert`.
The saved config carries `exit_layers`, `exit_type`, `id2label`, `finetuning_task` and `trained_exits` (the exits
`finetune train` trained). `--model` may be a local directory or a hub name (`common.hub.resolve_pretrained`).

`--method hashee` builds `ElasticBertHashEEForSequenceClassification` (token-level exit, `elasticbert.hashee`) and its
token map from the run's training rows (`finetune.hashee.install_token_map`) before training; a saved HashEE model
loads back as that class through every path here, and sentence-level early exit (`require_trained=True`) refuses it.

Exits that were never trained are found from the load report (exit weights missing from the checkpoint, freshly
initialised) and from the checkpoint's own record (`trained_exits`; a classifier saved with neither it nor a
`finetuning_task` was never fine-tuned): scoring them would score random heads, so callers refuse or warn.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Collection
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from common.errors import ConfigError
from common.hub import resolve_pretrained
from elasticbert import (
    HASHEE_MODEL_TYPE,
    CheckpointError,
    ElasticBertForSequenceClassification,
    ElasticBertHashEEForSequenceClassification,
    LoadReport,
    load_pretrained,
)
from elasticbert.loading import read_config

from .config import FinetuneConfig
from .data import load_tokenizer, paired_tokenizer
from .hashee import install_token_map
from .tasks import TaskSpec


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """`--device`: `cpu`; `cuda` (this process's GPU, `local_rank`) or a ConfigError when there is none; `auto`:
    CUDA when available, else the CPU. Checked before anything loads."""
    if name not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"--device {name!r}: expected auto, cpu or cuda")
    if name == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % max(torch.cuda.device_count(), 1))
    if name == "cuda":
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "no CUDA support (a CPU-only build)"
        raise ConfigError(
            f"--device cuda: no CUDA device is available (torch {torch.__version__}, {build}); "
            "pass --device cpu, or --device auto to use a GPU only where there is one"
        )
    return torch.device("cpu")


CLASSIFIER_TYPES = ("elasticbert", HASHEE_MODEL_TYPE)  # model types whose checkpoints carry our exits


def checkpoint_exit_labels(directory: Path, raw: dict) -> int | None:
    """The number of labels of a fine-tuned classifier checkpoint (None when it has no trained exits); `raw`: its
    config.json (`read_config`)."""
    if raw.get("model_type") not in CLASSIFIER_TYPES:
        return None
    weights = directory / "model.safetensors"
    if not weights.is_file():
        return None
    try:
        with safe_open(str(weights), framework="pt") as handle:
            shapes = {k: handle.get_slice(k).get_shape() for k in handle.keys() if k.endswith("classifier.weight")}
    except Exception as err:  # a corrupt file: the loader reports it with its own message
        raise CheckpointError(f"{weights}: cannot read weights ({err})") from err
    rows = {shape[0] for key, shape in shapes.items() if key.startswith("exits.")}
    return rows.pop() if len(rows) == 1 else None


def build_model(cfg: FinetuneConfig, task: TaskSpec) -> tuple[ElasticBertForSequenceClassification, LoadReport]:
    """Load `cfg.model.path` (our export, a fine-tuned run, a plain BERT dir or the fnlp layout, a local directory or a
    hub name) with the run's exits; refuses a `--max-length` beyond the positions the model can embed."""
    directory = resolve_pretrained(cfg.model.path, what="--model")
    raw = read_config(directory)
    depth = int(raw.get("num_hidden_layers", 0))
    trained = checkpoint_exit_labels(directory, raw)
    if trained is not None and trained != task.num_labels:
        raise CheckpointError(
            f"{directory}: checkpoint's exit classifiers have {trained} outputs, task {task.name} needs "
            f"{task.num_labels} (num_labels mismatch); start from the pre-trained model instead"
        )
    cfg.validate(task.num_labels, depth)
    exits = cfg.resolved_exits(depth)
    overrides = dict(
        num_labels=task.num_labels,
        num_hidden_layers=cfg.num_layers(depth),
        exit_layers=exits,
        exit_type=cfg.model.exit_type,
        exit_mha_dim=cfg.model.mha_dim,
        exit_mha_heads=cfg.model.mha_heads,
        hidden_dropout_prob=cfg.model.dropout,
        attention_probs_dropout_prob=cfg.model.dropout,
        classifier_dropout=cfg.model.dropout,
    )
    if not task.is_regression:
        overrides["id2label"] = dict(enumerate(task.label_names))
        overrides["label2id"] = {name: i for i, name in enumerate(task.label_names)}
    overrides["early_exit"] = None  # an operating point chosen for the old weights says nothing about the new ones
    hashee = cfg.method.name == "hashee"
    if raw.get("model_type") == HASHEE_MODEL_TYPE and not hashee:
        raise ConfigError(
            f"{directory}: a HashEE model (token-level exit, its token map in its weights): continue it with "
            f"--method hashee, not --method {cfg.method.name}"
        )
    model_class = ElasticBertHashEEForSequenceClassification if hashee else ElasticBertForSequenceClassification
    model, report = load_pretrained(model_class, directory, raw_config=raw, **overrides)
    cfg.validate(task.num_labels, depth, max_positions(model))
    model.config.finetuning_task = task.name
    tokenizer_dir = resolve_pretrained(cfg.model.tokenizer, what="--tokenizer") if cfg.model.tokenizer else directory
    identity = paired_tokenizer(Path(tokenizer_dir), Path(directory), model.config.vocab_size)  # or refused
    model.config.tokenizer_identity = identity.to_dict() if identity is not None else None  # saved with best/
    if hashee:  # the token map, from the run's data (finetune.hashee): part of the model from here on
        tokenizer = load_tokenizer(tokenizer_dir, type_vocab_size=model.config.type_vocab_size)
        install_token_map(model, cfg, task, tokenizer)
    return model, report


def max_positions(model: ElasticBertForSequenceClassification) -> int:
    """The longest input (tokens, special ones included) the model's position embeddings cover (RoBERTa-style
    positions start at pad_token_id + 1, so they cover fewer than max_position_embeddings)."""
    config = model.config
    return int(getattr(config, "max_sequence_length", config.max_position_embeddings))


def check_max_length(model: ElasticBertForSequenceClassification, max_length: int, source: str | Path) -> None:
    """Refuse a `--max-length` that is not positive or that the model cannot embed, before any data is read."""
    limit = max_positions(model)
    if not 1 <= max_length <= limit:
        raise ConfigError(
            f"--max-length {max_length}: the model {source} embeds 1..{limit} positions; pass a value in that range"
        )


def freshly_initialised_exits(report: LoadReport) -> list[int]:
    """Exit layers whose weights were not in the checkpoint (initialised at random when it loaded)."""
    return sorted({int(m.group(1)) for key in report.initialised if (m := re.match(r"exits\.(\d+)\.", key))})


def untrained_exits(model: ElasticBertForSequenceClassification, report: LoadReport) -> tuple[list[int], str]:
    """Exit layers with no trained weights, and why (see the module docstring)."""
    exits = list(model.exit_layers)
    fresh = freshly_initialised_exits(report)
    if fresh:
        return fresh, "their weights are not in the checkpoint (initialised at random when it loaded)"
    recorded = getattr(model.config, "trained_exits", None)
    if recorded is not None:
        missing = [layer for layer in exits if layer not in set(recorded)]
        return missing, f"the checkpoint records trained exits {list(recorded)} only"
    if not getattr(model.config, "finetuning_task", None):
        return exits, "the checkpoint records no fine-tuning (no trained_exits or finetuning_task in its config.json)"
    return [], ""


def load_finetuned(
    path: str | Path, require_trained: bool | Collection[int] = False, purpose: str = "scoring them"
) -> ElasticBertForSequenceClassification:
    """A fine-tuned classifier as saved by `finetune train` (RUN_DIR/best), a local directory or a hub name.

    Refuses a checkpoint with no trained exit at all; exits that were never trained are listed in
    `model.untrained_exits` and refused when `require_trained` is True (early exit and submissions need every exit)
    or names them (the exits a caller will use), else named in a warning on stderr."""
    directory = resolve_pretrained(path, what="--model")
    raw = read_config(directory)
    if checkpoint_exit_labels(directory, raw) is None and raw.get("model_type") not in CLASSIFIER_TYPES:
        raise CheckpointError(f"{directory}: not a fine-tuned classifier (no exit classifiers in the weights)")
    if raw.get("model_type") == HASHEE_MODEL_TYPE and require_trained is True:
        raise CheckpointError(
            f"{directory}: a HashEE model exits per token (its token map), not per sentence: {purpose} does not "
            "apply to it; score it with `finetune hashee-score` (accuracy, FLOPs, ELUE points and submission files)"
        )
    model, report = load_pretrained(ElasticBertForSequenceClassification, directory, raw_config=raw)
    untrained, why = untrained_exits(model, report)
    model.untrained_exits = untrained
    if untrained == list(model.exit_layers) and freshly_initialised_exits(report):
        raise CheckpointError(f"{directory}: not a fine-tuned classifier (no exit classifiers in the weights)")
    needed = untrained
    if not isinstance(require_trained, bool):
        needed = [layer for layer in untrained if layer in set(require_trained)]
    if needed:
        message = (
            f"{directory}: exits {needed} were never trained ({why}); {purpose} would use random heads. "
            "Fine-tune them first (finetune train --model ... --exits ...)"
        )
        if require_trained or needed == list(model.exit_layers):
            raise CheckpointError(message)
        print(f"finetune: warning: {message}", file=sys.stderr, flush=True)
    return model


def model_device(model: nn.Module) -> torch.device:
    """Where the model's weights are (batches go there)."""
    return next(model.parameters()).device


def exit_logits(output: object) -> tuple:
    """Every exit's logits of a classifier forward, in `output.exit_layers` order (`exit_logits` where the model
    follows transformers' convention of `logits` = the deepest exit's, else the per-exit `logits` tuple)."""
    per_exit = getattr(output, "exit_logits", None)
    return tuple(per_exit if per_exit is not None else output.logits)


def backbone_modules(model: ElasticBertForSequenceClassification) -> list[nn.Module]:
    """Embeddings and transformer layers (the per-layer poolers belong to the linear exits)."""
    return [model.elasticbert.embeddings, model.elasticbert.encoder.layer]


def exit_modules(model: ElasticBertForSequenceClassification, layer: int) -> list[nn.Module]:
    """Exit `layer`'s head, with that layer's pooler for a linear exit."""
    modules: list[nn.Module] = [model.exits[str(layer)]]
    if model.config.exit_type == "linear":
        modules.append(model.elasticbert.encoder.pooler[layer - 1])
    return modules


def exit_parameters(model: ElasticBertForSequenceClassification, layer: int) -> list[nn.Parameter]:
    return [p for m in exit_modules(model, layer) for p in m.parameters()]


def label_embeddings(model: ElasticBertForSequenceClassification, layer: int) -> nn.Parameter:
    """Exit `layer`'s label embeddings: its classifier's weight rows [K, d]."""
    return model.exits[str(layer)].classifier.weight


def set_frozen(modules: list[nn.Module], frozen: bool) -> None:
    """Frozen = no gradient and eval mode (no dropout): a fixed function, e.g. 2ST's stage-2 backbone and teacher."""
    for module in modules:
        module.requires_grad_(not frozen)
        if frozen:
            module.eval()
