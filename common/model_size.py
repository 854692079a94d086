"""ElasticBERT's parameter counts from its sizes alone, without building the model or importing transformers:
`elasticbert.flops` reports them, and the pre-flight check (`pretrain.preflight`, run on every node of a job before
the ranks start) sizes two checkpoints from them without paying transformers' import (2.4 s of CPU per node here,
two thirds of the whole check). tests/elasticbert/test_flops.py and tests/pretrain/test_preflight.py hold them equal
to the built models' `parameters()`."""

from __future__ import annotations


def encoder_parameters(
    hidden: int, intermediate: int, layers: int, vocab: int, positions: int, type_vocab: int = 2
) -> int:
    """`ElasticBertModel`: embeddings (+ LayerNorm), `layers` x (attention, feed-forward, two LayerNorms, and the
    layer's own pooler)."""
    embeddings = (vocab + positions + type_vocab) * hidden + 2 * hidden
    layer = 4 * (hidden * hidden + hidden) + 2 * hidden + (hidden * intermediate + intermediate)
    layer += (intermediate * hidden + hidden) + 2 * hidden
    pooler = hidden * hidden + hidden
    return embeddings + layers * (layer + pooler)


def pretraining_parameters(
    hidden: int, intermediate: int, layers: int, vocab: int, positions: int, type_vocab: int = 2
) -> int:
    """`ElasticBertForPreTraining`: the encoder, the MLM head (one transform + LayerNorm per exit, one shared output
    bias; its decoder is the word embeddings, tied) and one SOP classifier per exit."""
    mlm = layers * ((hidden * hidden + hidden) + 2 * hidden) + vocab
    sop = layers * (2 * hidden + 2)
    return encoder_parameters(hidden, intermediate, layers, vocab, positions, type_vocab) + mlm + sop
