"""Building the classifier for a run and partitioning its parameters into backbone and exits.

Fine-tuned runs save to `RUN_DIR/best` with `save_pretrained`; load them back with
`elasticbert.load_pretrained(ElasticBertForSequenceClassification, RUN_DIR / "best")`, `load_finetuned(dir)` (which
also checks the exits are there) or `AutoModelForSequenceClassification` after `import elasticbert`.
The saved config carries `exit_layers`, `exit_type`, `id2label` and `finetuning_task`.
"""

from __future__ import annotations

from pathlib import Path

from safetensors import safe_open
from torch import nn

from elasticbert import CheckpointError, ElasticBertForSequenceClassification, LoadReport, load_pretrained
from elasticbert.loading import read_config

from .config import TrainConfig
from .tasks import TaskSpec


def checkpoint_exit_labels(directory: Path) -> int | None:
    """The number of labels of a fine-tuned classifier checkpoint (None when it has no trained exits)."""
    raw = read_config(directory)
    if raw.get("model_type") != "elasticbert":
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


def build_model(cfg: TrainConfig, task: TaskSpec) -> tuple[ElasticBertForSequenceClassification, LoadReport]:
    """Load `cfg.model` (our export, a fine-tuned run, a plain BERT dir or the fnlp layout) with the run's exits."""
    directory = Path(cfg.model)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: model directory does not exist")
    raw = read_config(directory)
    depth = int(raw.get("num_hidden_layers", 0))
    trained = checkpoint_exit_labels(directory)
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
        exit_type=cfg.exit_type,
        exit_mha_dim=cfg.mha_dim,
        exit_mha_heads=cfg.mha_heads,
        hidden_dropout_prob=cfg.dropout,
        attention_probs_dropout_prob=cfg.dropout,
        classifier_dropout=cfg.dropout,
    )
    if not task.is_regression:
        overrides["id2label"] = dict(enumerate(task.label_names))
        overrides["label2id"] = {name: i for i, name in enumerate(task.label_names)}
    model, report = load_pretrained(ElasticBertForSequenceClassification, directory, **overrides)
    model.config.finetuning_task = task.name
    return model, report


def load_finetuned(path: str | Path) -> ElasticBertForSequenceClassification:
    """A fine-tuned classifier as saved by `finetune train` (RUN_DIR/best)."""
    directory = Path(path)
    if checkpoint_exit_labels(directory) is None:
        raise CheckpointError(f"{directory}: not a fine-tuned classifier (no exit classifiers in the weights)")
    model, report = load_pretrained(ElasticBertForSequenceClassification, directory)
    missing = [k for k in report.initialised if k.startswith("exits.")]
    if missing:
        raise CheckpointError(f"{directory}: exit weights missing from the checkpoint: {missing[:4]}")
    return model


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
