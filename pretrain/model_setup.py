"""The model a run trains: from scratch (seeded) or from a BERT / ElasticBERT checkpoint (a directory or a hub name),
checked against the data (vocabulary, sequence length, depth) before DeepSpeed sees it; and its optimizer parameter
groups."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from common.hub import resolve_pretrained
from common.torch_private import raise_recompile_limit
from common.vocab import TokenizerIdentity, check_same_tokenizer, identity_of, model_identity
from elasticbert import ElasticBertConfig, ElasticBertForPreTraining, load_pretrained, minilm_dir
from elasticbert.layouts import BERT_ARCHITECTURE_FIELDS
from elasticbert.verification import checksum_verification

from .config import ConfigError, ModelConfig, RunConfig, resolve_path


def model_from_scratch(m: ModelConfig, vocab_size: int) -> ElasticBertForPreTraining:
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


def data_tokenizer(tokenizer_dir: Path | None) -> TokenizerIdentity | None:
    """The identity of the data's tokenizer (`common.vocab`; checked against its manifest by `open_data`)."""
    return identity_of(tokenizer_dir) if tokenizer_dir is not None and tokenizer_dir.is_dir() else None


def check_same_vocab(init_dir: Path, tokenizer_dir: Path | None) -> dict | None:
    """A checkpoint's tokenizer must be the data's (token ids would otherwise mean other words): the identity its
    config.json records, else that of its tokenizer files, against the data's (`common.vocab`: vocabulary in id order,
    casing, special tokens). Returns the data's identity, recorded in the model's config."""
    data = data_tokenizer(tokenizer_dir)
    expected, where = model_identity(init_dir)
    check_same_tokenizer(
        data,
        f"the data's tokenizer ({tokenizer_dir})",
        expected,
        f"model.init_from={init_dir} was trained with ({where} so)",
        f"The model was trained with another vocabulary or casing than the data: prepare the data with its "
        f"tokenizer (data_prep tokenize --tokenizer {init_dir}), or pick the model.init_from trained with this one",
        error=ConfigError,
    )
    return data.to_dict() if data is not None else None


def _check_fits_data(cfg: RunConfig, model: torch.nn.Module, vocab_size: int) -> None:
    m, mc = cfg.model, model.config
    if mc.vocab_size < vocab_size:
        raise ConfigError(f"model vocabulary ({mc.vocab_size}) is smaller than the data's ({vocab_size})")
    if cfg.data.max_length > mc.max_position_embeddings:
        raise ConfigError(
            f"data.max_length={cfg.data.max_length} exceeds the model's max_position_embeddings="
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
    own graph in training, and evaluation (all exits, no grad) another; the number of masked tokens, which varies,
    is marked dynamic before the first call (`collation.to_device`), so each compiles once. The recompile limit
    leaves room for twice that."""
    raise_recompile_limit(4 * (num_groups + 1))
    model.compile()


def build_model(cfg: RunConfig, vocab_size: int, tokenizer_dir: Path | None) -> tuple[torch.nn.Module, str]:
    """From scratch (seeded) or from a BERT / ElasticBERT checkpoint; returns the model and a one-line origin."""
    m = cfg.model
    torch.manual_seed(cfg.train.seed)
    if m.init_from is None:
        model, origin = model_from_scratch(m, vocab_size), "from scratch"
        identity = data_tokenizer(tokenizer_dir)  # recorded in every checkpoint's export/config.json
        model.config.tokenizer_identity = identity.to_dict() if identity is not None else None
    else:
        src = init_source(m.init_from)
        model, report = load_pretrained(
            ElasticBertForPreTraining,
            src,
            verify_checksums=cfg.checkpoint.verify_checksums and checksum_verification(),
            hidden_dropout_prob=m.hidden_dropout_prob,
            attention_probs_dropout_prob=m.attention_probs_dropout_prob,
        )
        data_identity = check_same_vocab(Path(src), tokenizer_dir)  # after the load verified its files
        model.config.tokenizer_identity = data_identity or model.config.tokenizer_identity
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
