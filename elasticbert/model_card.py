"""`write_model_card`: the README.md an exported or fine-tuned ElasticBERT directory carries (what it is, how it was
trained, per-exit dev scores when known, how to load it), so a directory copied or pushed to the hub explains itself.

Called by pretrain's export and finetune's save after `save_pretrained`; the architecture facts come from the
directory's own config.json, so the card cannot disagree with the weights beside it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

from common.io import atomic_write_text

from .loading import read_config

ExitScores = Mapping[int, float | Mapping[str, float]]
CLASS_LOADERS = {
    "ElasticBertForSequenceClassification": ("AutoModelForSequenceClassification", "text-classification"),
    "ElasticBertForPreTraining": ("AutoModelForPreTraining", None),
    "ElasticBertModel": ("AutoModel", "feature-extraction"),
}


def write_model_card(
    directory: str | Path,
    *,
    what: str,
    training: str | Mapping[str, object],
    exit_scores: ExitScores | None = None,
) -> Path:
    """Write `directory/README.md` (atomically) and return its path.

    what: one paragraph on what the model is (e.g. "ElasticBERT-base pre-trained on ..."; "SST-2 classifier ...").
    training: how it was trained — text, or facts as a mapping (recipe, data, steps, seed...), listed in order.
    exit_scores: dev scores per exit layer, a number or {metric: number} each (e.g. {6: {"accuracy": 91.2}}).
    """
    directory = Path(directory)
    config = read_config(directory)
    layers = int(config.get("num_hidden_layers", 0))
    scores = _checked_scores(exit_scores or {}, layers)
    architecture = (config.get("architectures") or ["ElasticBertModel"])[0]
    auto_class, pipeline_tag = CLASS_LOADERS.get(architecture, ("AutoModel", None))
    sections = [
        _front_matter(pipeline_tag),
        f"# {directory.name}\n\n{what.strip()}\n",
        _architecture(config, architecture),
        "## Training\n\n" + _training(training),
        _scores_table(scores) if scores else "## Dev scores per exit\n\nNot measured for this directory.\n",
        _how_to_load(directory.name, auto_class, architecture),
    ]
    path = directory / "README.md"
    atomic_write_text(path, "\n".join(sections))
    return path


def _checked_scores(exit_scores: ExitScores, layers: int) -> dict[int, dict[str, float]]:
    """{layer: {metric: value}}, rejecting layers outside the model and values that are not finite numbers."""
    checked: dict[int, dict[str, float]] = {}
    for layer, value in sorted(exit_scores.items()):
        if not isinstance(layer, int) or not 1 <= layer <= layers:
            raise ValueError(f"exit_scores: layer {layer!r} is not within 1..{layers} (the model's layers)")
        metrics = dict(value) if isinstance(value, Mapping) else {"score": value}
        for metric, number in metrics.items():
            if isinstance(number, bool) or not isinstance(number, int | float) or not math.isfinite(number):
                raise ValueError(f"exit_scores: layer {layer} {metric}={number!r} is not a finite number")
        checked[layer] = {str(k): float(v) for k, v in metrics.items()}
    return checked


def _front_matter(pipeline_tag: str | None) -> str:
    lines = ["---", "library_name: transformers", "tags:", "- elasticbert", "- early-exit", "- multi-exit"]
    if pipeline_tag:
        lines.append(f"pipeline_tag: {pipeline_tag}")
    return "\n".join([*lines, "---", ""])


def _architecture(config: dict, architecture: str) -> str:
    facts = [
        f"- class: `{architecture}`",
        f"- layers: {config.get('num_hidden_layers')}, hidden size: {config.get('hidden_size')}, "
        f"attention heads: {config.get('num_attention_heads')}, vocabulary: {config.get('vocab_size')}",
        f"- position ids: {config.get('position_ids_style', 'bert')} style, "
        f"{config.get('max_position_embeddings')} position embeddings",
    ]
    if architecture == "ElasticBertForSequenceClassification":
        labels = config.get("id2label") or {}
        facts.append(f"- exits: layers {config.get('exit_layers')} ({config.get('exit_type', 'linear')} heads)")
        if labels:
            names = [str(name) for _, name in sorted(labels.items(), key=lambda item: int(item[0]))]
            facts.append(f"- labels: {', '.join(names)}")
    return "## Architecture\n\n" + "\n".join(facts) + "\n"


def _training(training: str | Mapping[str, object]) -> str:
    if isinstance(training, str):
        return training.strip() + "\n"
    lines = []
    for key, value in training.items():
        shown = value if isinstance(value, str) else json.dumps(value, default=str)
        lines.append(f"- {key}: {shown}")
    return "\n".join(lines) + "\n"


def _scores_table(scores: dict[int, dict[str, float]]) -> str:
    metrics = list(dict.fromkeys(m for values in scores.values() for m in values))
    header = "| exit layer | " + " | ".join(metrics) + " |"
    rule = "|---:|" + "---:|" * len(metrics)
    rows = [
        f"| {layer} | " + " | ".join(f"{values[m]:.2f}" if m in values else "-" for m in metrics) + " |"
        for layer, values in scores.items()
    ]
    return "## Dev scores per exit\n\n" + "\n".join([header, rule, *rows]) + "\n"


def _how_to_load(name: str, auto_class: str, architecture: str) -> str:
    lines = [
        "## How to load it",
        "",
        "```python",
        "import elasticbert  # registers the ElasticBERT classes with transformers' Auto classes",
        f"from transformers import AutoTokenizer, {auto_class}",
        "",
        f'model = {auto_class}.from_pretrained("path/to/{name}")  # or its hub name',
        f'tokenizer = AutoTokenizer.from_pretrained("path/to/{name}")',
        "",
        "# the same weights through the project's loader, with a report of what was loaded:",
        f'model, report = elasticbert.load_pretrained(elasticbert.{architecture}, "path/to/{name}")',
        "```",
    ]
    if architecture == "ElasticBertForSequenceClassification":
        lines += [
            "",
            "`model(**batch).logits` are the deepest exit's; `.exit_logits` holds every exit's, in `exit_layers`",
            'order. `transformers.pipeline("text-classification", model=...)` works on this directory.',
        ]
    return "\n".join(lines) + "\n"
