"""The model a run trains: from scratch (seeded) or from a BERT / ElasticBERT checkpoint (a directory or a hub name),
checked against the data (vocabulary, sequence length, depth) before DeepSpeed sees it; and its optimizer parameter
groups."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from common.hub import resolve_pretrained
from elasticbert import ElasticBertConfig, ElasticBertForPreTraining, load_pretrained, minilm_dir
from elasticbert.layouts import BERT_ARCHITECTURE_FIELDS

from .config import ConfigError, ModelConfig, RunConfig, resolve_path


def _from_scratch(m: ModelConfig, vocab_size: int) -> ElasticBertForPreTraining:
    """The model section's architecture fields carry BERT's names, so they go to the config as they are."""
    architecture = {k: v for k, v in dataclasses.asdict(m).items() if k in BERT_ARCHITECTURE_FIELDS}
    architecture["vocab_size"] = m.vocab_size or vocab_size
    return ElasticBertForPreTraining(ElasticBertConfig(**architecture))


def init_source(init_from: str) -> Path:
    """The directory of `model.init_from`: "minilm" (the MiniLM package), a local directory (also relative to the
    repository), or a hub name such as bert-base-uncased, resolved through the Hugging Face cache only now, when
    the run starts (`check-config` never needs the weights)."""
    if init_from == "minilm":
        return Path(minilm_dir())
    local = resolve_path(init_from)
    if local.is_dir():
        return local
    return resolve_pretrained(init_from, what="model.init_from")


def check_same_vocab(init_dir: Path, tokenizer_dir: Path | None) -> None:
    """A checkpoint's vocabulary must be the data's (token ids would otherwise mean other words)."""
    a = init_dir / "vocab.txt"
    b = tokenizer_dir / "vocab.txt" if tokenizer_dir else None
    if a.is_file() and b is not None and b.is_file() and a.read_bytes() != b.read_bytes():
        raise ConfigError(
            f"model.init_from={init_dir} was trained with another vocabulary than the data "
            f"({b}); prepare the data with --vocab {a}"
        )


def _check_fits_data(cfg: RunConfig, model: torch.nn.Module, vocab_size: int) -> None:
    m, mc = cfg.model, model.config
    if mc.vocab_size < vocab_size:
        raise ConfigError(f"model vocabulary ({mc.vocab_size}) is smaller than the data's ({vocab_size})")
    if cfg.data.max_seq_len > mc.max_position_embeddings:
        raise ConfigError(
            f"data.max_seq_len={cfg.data.max_seq_len} exceeds the model's max_position_embeddings="
            f"{mc.max_position_embeddings}"
        )
    if m.init_from is not None and mc.num_hidden_layers != m.num_hidden_layers:
        raise ConfigError(
            f"model.num_hidden_layers={m.num_hidden_layers} but {m.init_from} has "
            f"{mc.num_hidden_layers} layers; set model.num_hidden_layers={mc.num_hidden_layers}"
        )


def compile_model(model: torch.nn.Module, num_groups: int) -> None:
    """torch.compile (inductor) in place, before DeepSpeed wraps the model (as DeepSpeed's `engine.compile` does:
    `module.compile()`), so state-dict keys, ZeRO's hooks and checkpoints stay as they are. Each exit group is its
    own graph, in training and in evaluation, and the number of masked tokens varies, so each compiles twice (then
    dynamic in that size): the recompile limit covers them."""
    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 4 * (num_groups + 1))
    model.compile()


def build_model(cfg: RunConfig, vocab_size: int, tokenizer_dir: Path | None) -> tuple[torch.nn.Module, str]:
    """From scratch (seeded) or from a BERT / ElasticBERT checkpoint; returns the model and a one-line origin."""
    m = cfg.model
    torch.manual_seed(cfg.train.seed)
    if m.init_from is None:
        model, origin = _from_scratch(m, vocab_size), "from scratch"
    else:
        src = init_source(m.init_from)
        check_same_vocab(Path(src), tokenizer_dir)
        model, report = load_pretrained(
            ElasticBertForPreTraining,
            src,
            hidden_dropout_prob=m.hidden_dropout_prob,
            attention_probs_dropout_prob=m.attention_probs_dropout_prob,
        )
        origin = str(report)
    _check_fits_data(cfg, model, vocab_size)
    if m.activation_checkpointing:
        model.gradient_checkpointing_enable()
    if cfg.train.compile:
        compile_model(model, len(cfg.exit_groups()))
    return model, origin


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """No weight decay on biases and LayerNorm weights (as BERT); tied weights appear once."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or "LayerNorm" in name or name.endswith(".bias") else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
