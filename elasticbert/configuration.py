"""`ElasticBertConfig`: BERT's fields plus where the exits are and what they look like."""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PretrainedConfig

EXIT_TYPES = ("linear", "mha")


class ElasticBertConfig(PretrainedConfig):
    """Configuration of an ElasticBERT model.

    Field names follow `BertConfig` (so plain BERT configs convert field for field) and the released
    `fnlp/elasticbert-base` config (`max_output_layers`, `num_output_layers`).

    Exit fields (used by the fine-tuning model):
        exit_layers: 1-based layers that carry a classifier exit; default: the last layer only.
        exit_type: "linear" (per-layer pooler + Linear) or "mha" (Linear(H, d_e) -> tanh -> multi-head attention
            from [CLS] over the sequence -> tanh -> Linear(d_e, K)).
        exit_mha_dim / exit_mha_heads: d_e and the number of heads of the MHA exit.
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
        exit_type: str = "linear",
        exit_mha_dim: int = 64,
        exit_mha_heads: int = 4,
        classifier_dropout: float | None = None,
        tie_word_embeddings: bool = True,
        **kwargs: object,
    ) -> None:
        super().__init__(pad_token_id=pad_token_id, **kwargs)
        self.tie_word_embeddings = tie_word_embeddings  # the MLM decoder shares the word embeddings
        if hidden_size % num_attention_heads:
            raise ValueError(
                f"ElasticBertConfig: hidden_size={hidden_size} is not a multiple of "
                f"num_attention_heads={num_attention_heads}"
            )
        if exit_type not in EXIT_TYPES:
            raise ValueError(f"ElasticBertConfig: exit_type={exit_type!r}; expected one of {EXIT_TYPES}")
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
        self.max_output_layers = max_output_layers if max_output_layers is not None else num_hidden_layers
        self.num_output_layers = num_output_layers if num_output_layers is not None else num_hidden_layers
        self.exit_layers = validate_exit_layers(exit_layers or [num_hidden_layers], num_hidden_layers)
        self.exit_type = exit_type
        self.exit_mha_dim = exit_mha_dim
        self.exit_mha_heads = exit_mha_heads
        self.classifier_dropout = classifier_dropout

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


def validate_exit_layers(exit_layers: Sequence[int], num_layers: int) -> list[int]:
    """Sorted, de-duplicated 1-based exit layers; a clear error for anything outside 1..num_layers."""
    layers = sorted({int(x) for x in exit_layers})
    bad = [x for x in layers if not 1 <= x <= num_layers]
    if bad or not layers:
        raise ValueError(f"exit layers {list(exit_layers)} must be non-empty and within 1..{num_layers}")
    return layers
