"""`ElasticBertConfig`: BERT's fields plus where the exits are and what they look like."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Literal, get_args

from transformers import PretrainedConfig

from common.integrity import SEALED_FIELD

from .exit_setting import EarlyExitSetting
from .verification import verify_pretrained_path

ExitType = Literal["linear", "mha"]
PositionIdsStyle = Literal["bert", "roberta"]
EXIT_TYPES = get_args(ExitType)
POSITION_IDS_STYLES = get_args(PositionIdsStyle)


class ElasticBertConfig(PretrainedConfig):
    """Configuration of an ElasticBERT model.

    Field names follow `BertConfig` (so plain BERT configs convert field for field) and the released
    `fnlp/elasticbert-base` config (`max_output_layers`, `num_output_layers`).

    Backbone family fields (what differs between BERT and RoBERTa-style checkpoints, so an exported model reproduces
    the backbone it came from):
        position_ids_style: "bert" (positions 0..T-1 in every row) or "roberta" (computed from `input_ids` exactly as
            `RobertaEmbeddings` does: pad_token_id + 1 + the running count of non-pad tokens, pads at pad_token_id;
            the longest input is then max_position_embeddings - pad_token_id - 1, see `max_sequence_length`).
        type_vocab_size: 2 for BERT, 1 for RoBERTa (one token type).
        position_embedding_type: only "absolute" (kept because BERT and the released ElasticBERT configs carry it;
            relative position embeddings are refused rather than silently ignored).

    Exit fields (used by the fine-tuning model):
        exit_layers: 1-based layers that carry a classifier exit; default: the last layer only, or, for a config in
            the released ElasticBERT layout (`num_output_layers` given, no `exit_layers`), its last
            `num_output_layers` layers, as the official fine-tuning code places its `classifiers`.
        exit_type: "linear" (per-layer pooler + Linear) or "mha" (Linear(H, d_e) -> tanh -> multi-head attention
            from [CLS] over the sequence -> tanh -> Linear(d_e, K)).
        exit_mha_dim / exit_mha_heads: d_e and the number of heads of the MHA exit.
        early_exit: None (the classifier's forward runs every exit) or an early-exit setting such as
            `{"strategy": "entropy", "threshold": 0.3}` (see `exit_setting`): the classifier's forward in eval mode
            then runs the early-exit engine, so `pipeline("text-classification")` exits early. Written by
            `elasticbert.save_early_exit(directory, ...)`; validated when the config loads.

    Provenance:
        tokenizer_identity: the identity of the tokenizer whose ids the weights were trained on
            (`common.vocab.TokenizerIdentity.to_dict()`: fingerprint, kind, size, casing), recorded by pre-training
            and fine-tuning and compared wherever a tokenizer meets the model again.

    A sealed directory's config.json also says so (`"checksums": "checksums.json"`, `common.integrity.seal`): that
    field describes the directory, not the model, so it is not kept in memory (a model saved elsewhere is not sealed).
    `from_pretrained` verifies a local directory first (`verification`; `verify_checksums=False` skips it).
    """

    model_type = "elasticbert"

    def __init__(
        self,
        vocab_size: int = 30522,
        hidden_size: int = 768,
        num_hidden_layers: int = 12,
        num_attention_heads: int = 12,
        intermediate_size: int = 3072,
        hidden_act: str = "gelu",
        hidden_dropout_prob: float = 0.1,
        attention_probs_dropout_prob: float = 0.1,
        max_position_embeddings: int = 512,
        type_vocab_size: int = 2,
        initializer_range: float = 0.02,
        layer_norm_eps: float = 1e-12,
        pad_token_id: int = 0,
        max_output_layers: int | None = None,
        num_output_layers: int | None = None,
        exit_layers: Sequence[int] | None = None,
        exit_type: ExitType = "linear",
        exit_mha_dim: int = 64,
        exit_mha_heads: int = 4,
        classifier_dropout: float | None = None,
        early_exit: dict | None = None,
        tie_word_embeddings: bool = True,
        position_ids_style: PositionIdsStyle = "bert",
        position_embedding_type: str = "absolute",
        tokenizer_identity: dict | None = None,
        **kwargs: object,
    ) -> None:
        kwargs.pop(SEALED_FIELD, None)
        super().__init__(pad_token_id=pad_token_id, **kwargs)
        self.tie_word_embeddings = tie_word_embeddings  # the MLM decoder shares the word embeddings
        if hidden_size % num_attention_heads:
            raise ValueError(
                f"ElasticBertConfig: hidden_size={hidden_size} is not a multiple of "
                f"num_attention_heads={num_attention_heads}"
            )
        if exit_type not in EXIT_TYPES:
            raise ValueError(f"ElasticBertConfig: exit_type={exit_type!r}; expected one of {EXIT_TYPES}")
        if position_ids_style not in POSITION_IDS_STYLES:
            raise ValueError(
                f"ElasticBertConfig: position_ids_style={position_ids_style!r}; expected one of {POSITION_IDS_STYLES}"
            )
        if position_embedding_type != "absolute":
            raise ValueError(
                f"ElasticBertConfig: position_embedding_type={position_embedding_type!r} is not supported "
                "(only 'absolute' position embeddings)"
            )
        if exit_mha_dim % exit_mha_heads:
            raise ValueError(
                f"ElasticBertConfig: exit_mha_dim={exit_mha_dim} is not a multiple of exit_mha_heads={exit_mha_heads}"
            )
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.max_position_embeddings = max_position_embeddings
        self.type_vocab_size = type_vocab_size
        self.initializer_range = initializer_range
        self.layer_norm_eps = layer_norm_eps
        self.position_ids_style = position_ids_style
        self.position_embedding_type = position_embedding_type
        self.max_output_layers = max_output_layers if max_output_layers is not None else num_hidden_layers
        if not exit_layers:
            exit_layers = official_exit_layers(num_hidden_layers, num_output_layers)
        self.num_output_layers = num_output_layers if num_output_layers is not None else num_hidden_layers
        self.exit_layers = validate_exit_layers(exit_layers, num_hidden_layers)
        self.exit_type = exit_type
        self.exit_mha_dim = exit_mha_dim
        self.exit_mha_heads = exit_mha_heads
        self.classifier_dropout = classifier_dropout
        if early_exit is not None:  # a ValueError naming the key (load_pretrained names the file); another task's
            early_exit = self._checked_setting(early_exit).to_dict()  # threshold too
        self.early_exit = early_exit
        self.tokenizer_identity = tokenizer_identity

    def _checked_setting(self, early_exit: dict) -> EarlyExitSetting:
        """`early_exit` as a setting this model can run: its labels, its exits, its own task's threshold."""
        task = getattr(self, "finetuning_task", None)
        return EarlyExitSetting.from_dict(early_exit, self.num_labels, "early_exit", len(self.exit_layers), task)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs: object) -> PretrainedConfig:
        """transformers' loader, once a local directory passed its checksums (`verification`). `verify_checksums`
        is read, not consumed: `AutoModel*` passes the unused keyword arguments on to the model's `from_pretrained`."""
        verify_pretrained_path(pretrained_model_name_or_path, kwargs.get("subfolder"), kwargs.get("verify_checksums"))
        return super().from_pretrained(pretrained_model_name_or_path, **kwargs)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def position_offset(self) -> int:
        """Index of the first position embedding a real token uses: 0 for BERT, pad_token_id + 1 for RoBERTa."""
        return self.pad_token_id + 1 if self.position_ids_style == "roberta" else 0

    @property
    def max_sequence_length(self) -> int:
        """The longest input (in tokens, special tokens included) the position embeddings cover."""
        return self.max_position_embeddings - self.position_offset


def official_exit_layers(num_layers: int, num_output_layers: int | None) -> list[int]:
    """Where the released ElasticBERT code puts its exits: the last `num_output_layers` layers (1 = static, the
    last layer only; `num_hidden_layers` = an exit at every layer). No count given: the last layer."""
    count = min(max(int(num_output_layers or 1), 1), num_layers)
    return list(range(num_layers - count + 1, num_layers + 1))


def validate_exit_layers(exit_layers: Sequence[int], num_layers: int) -> list[int]:
    """Sorted, de-duplicated 1-based exit layers; a clear error for anything outside 1..num_layers."""
    layers = sorted({int(x) for x in exit_layers})
    bad = [x for x in layers if not 1 <= x <= num_layers]
    if bad or not layers:
        raise ValueError(f"exit layers {list(exit_layers)} must be non-empty and within 1..{num_layers}")
    return layers
