"""The tiny ElasticBERT config the unit tests build models from (seconds on a CPU), and the small saved
classifiers and GLUE copies the fault tests run commands on."""

import shutil
from pathlib import Path

from common.integrity import seal
from elasticbert import ElasticBertConfig, ElasticBertForSequenceClassification, load_pretrained, minilm_dir

LABELS = {"SST-2": ("0", "1"), "MRPC": ("0", "1"), "MNLI": ("contradiction", "entailment", "neutral")}
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def tiny_config(**overrides) -> ElasticBertConfig:
    """4 layers of width 32 over a 100-word vocabulary, dropout off; `overrides` change any field."""
    fields = dict(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    fields.update(overrides)
    return ElasticBertConfig(**fields)


def saved_classifier(directory: Path, task: str, layers: int = 2) -> Path:
    """MiniLM cut to `layers` layers with an exit on each, saved and sealed as `finetune train` saves RUN/best for
    `task` (random heads recorded as trained: the fault tests judge inputs and outputs, not accuracy)."""
    labels = LABELS[task]
    model, _ = load_pretrained(
        ElasticBertForSequenceClassification,
        minilm_dir(),
        num_hidden_layers=layers,
        exit_layers=list(range(1, layers + 1)),
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={name: i for i, name in enumerate(labels)},
    )
    model.config.finetuning_task = task
    model.config.trained_exits = list(range(1, layers + 1))
    model.save_pretrained(directory)
    for name in TOKENIZER_FILES:
        shutil.copy(minilm_dir() / name, directory / name)
    seal(directory)
    return directory


def small_glue(source: Path, root: Path, rows: dict[str, int]) -> Path:
    """The first `rows[task]` lines (header included) of each split of each task of the GLUE root `source`."""
    for task, n in rows.items():
        (root / task).mkdir(parents=True)
        for split in ("train", "dev", "test"):
            lines = (source / task / f"{split}.tsv").read_text(encoding="utf-8").splitlines()[:n]
            (root / task / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root
