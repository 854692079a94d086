"""The tiny ElasticBERT config the unit tests build models from (seconds on a CPU)."""

from elasticbert import ElasticBertConfig


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
