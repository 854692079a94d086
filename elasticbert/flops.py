"""Analytic FLOPs per sample (ELUE conventions), training FLOPs per token (for MFU) and parameter counts.

ELUE's official counter (ptflops-based, `fastnlp/ElasticBERT/FLOPs`) counts multiply-accumulates and reports
FLOPs = 2 × MACs. Its conventions, which this module follows for one sample of real (unpadded) length n:
- linear layers: n · in · out MACs, bias not counted;
- self-attention: Q/K/V projections, the Q·Kᵀ and P·V products (n² · d per head each), plus n² for the scaling and n²
  for the softmax per head;
- LayerNorm: 2 · numel (normalise + affine);
- embeddings lookups, activations (GELU, tanh), dropout and residual additions: 0.
`FlopBreakdown.matmul` holds the terms a matmul-level counter such as `torch.utils.flop_counter.FlopCounterMode` sees
(linear layers and attention products); `FlopBreakdown.extra` holds what the conventions add (softmax, scaling,
LayerNorm; the MHA exit's input-projection bias).

Token-level exit (HashEE, `elasticbert.hashee`) is counted per layer from the tokens that layer computes
(`token_layer_flops`, `token_exit_flops`): r running tokens of n pay their queries, attention output, LayerNorms and
feed-forward, and their attention over all n keys; the keys and values of all n tokens are projected at every layer
that runs (exited tokens are attended to through each layer's own projections). With r = n at every layer this is
`layer_flops` exactly, and `sample_flops(config, n, L)` is what the same model costs with every token at every layer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from common.model_size import encoder_parameters

from .configuration import ElasticBertConfig


@dataclass(frozen=True)
class FlopBreakdown:
    matmul: float = 0.0
    extra: float = 0.0

    @property
    def total(self) -> float:
        return self.matmul + self.extra

    def __add__(self, other: FlopBreakdown) -> FlopBreakdown:
        return FlopBreakdown(self.matmul + other.matmul, self.extra + other.extra)

    def __mul__(self, factor: float) -> FlopBreakdown:
        return FlopBreakdown(self.matmul * factor, self.extra * factor)


def embedding_flops(config: ElasticBertConfig, n: int) -> FlopBreakdown:
    """Lookups are free; the embedding LayerNorm is 2 · n · H MACs."""
    return FlopBreakdown(extra=2 * (2 * n * config.hidden_size))


def layer_flops(config: ElasticBertConfig, n: int) -> FlopBreakdown:
    """One encoder layer on n tokens."""
    h, inter, heads = config.hidden_size, config.intermediate_size, config.num_attention_heads
    linear_macs = 4 * n * h * h + 2 * n * h * inter  # Q, K, V, attention output; FFN in and out
    product_macs = 2 * n * n * h  # Q·Kᵀ and P·V over all heads
    convention_macs = 2 * heads * n * n + 2 * (2 * n * h)  # scaling + softmax; two LayerNorms
    return FlopBreakdown(matmul=2 * (linear_macs + product_macs), extra=2 * convention_macs)


def exit_flops(config: ElasticBertConfig, n: int, exit_type: str | None = None) -> FlopBreakdown:
    """One classifier exit on a sample of n tokens."""
    exit_type = exit_type or config.exit_type
    h, k = config.hidden_size, config.num_labels
    if exit_type == "linear":  # pooler dense on [CLS] + classifier
        return FlopBreakdown(matmul=2 * (h * h + h * k))
    if exit_type == "mha":
        d, heads = config.exit_mha_dim, config.exit_mha_heads
        head_dim = d // heads
        linear_macs = (
            n * h * d + (1 + 2 * n) * d * d + d * d + d * k
        )  # projection, in-proj (q: [CLS]; k, v: n), out, cls
        product_macs = heads * (2 * n * head_dim)  # one query against n keys, then n values
        convention_macs = heads * (head_dim + n) + (1 + 2 * n) * d + d  # scaling + softmax; in-proj and out-proj bias
        return FlopBreakdown(matmul=2 * (linear_macs + product_macs), extra=2 * convention_macs)
    raise ValueError(f"unknown exit type {exit_type!r}")


def token_layer_flops(config: ElasticBertConfig, running: int, keys: int) -> FlopBreakdown:
    """One encoder layer that computes `running` tokens of a sample of `keys` (its real length); 0 running: the layer
    is skipped."""
    if running == 0:
        return FlopBreakdown()
    h, inter, heads = config.hidden_size, config.intermediate_size, config.num_attention_heads
    r, n = running, keys
    linear_macs = 2 * r * h * h + 2 * n * h * h + 2 * r * h * inter  # Q, attention output (r); K, V (n); FFN (r)
    product_macs = 2 * r * n * h  # r queries against n keys, then n values
    convention_macs = 2 * heads * r * n + 2 * (2 * r * h)  # scaling + softmax of r rows; two LayerNorms on r tokens
    return FlopBreakdown(matmul=2 * (linear_macs + product_macs), extra=2 * convention_macs)


def token_exit_flops(
    config: ElasticBertConfig, seq_len: int, running: Iterable[int], exit_type: str | None = None
) -> FlopBreakdown:
    """FLOPs of one sample of real length `seq_len` under token-level exit: `running[l - 1]` tokens computed at
    layer l (the embeddings for all, one exit head at the top)."""
    total = embedding_flops(config, seq_len)
    for count in running:
        if not 0 <= count <= seq_len:
            raise ValueError(f"{count} running tokens in a sample of {seq_len}")
        total = total + token_layer_flops(config, int(count), seq_len)
    return total + exit_flops(config, seq_len, exit_type)


def sample_flops(
    config: ElasticBertConfig,
    seq_len: int,
    exit_layer: int,
    exits_evaluated: Iterable[int] | None = None,
    exit_type: str | None = None,
) -> FlopBreakdown:
    """FLOPs to classify one sample of real length `seq_len` that leaves at `exit_layer`.

    `exits_evaluated`: the exit heads that actually ran (dynamic early exit evaluates every exit it passes);
    default: only the one at `exit_layer` (static truncation).
    """
    if not 1 <= exit_layer <= config.num_hidden_layers:
        raise ValueError(f"exit_layer={exit_layer} is outside 1..{config.num_hidden_layers}")
    evaluated = list(exits_evaluated) if exits_evaluated is not None else [exit_layer]
    total = embedding_flops(config, seq_len) + layer_flops(config, seq_len) * exit_layer
    return total + exit_flops(config, seq_len, exit_type) * len(evaluated)


def training_flops_per_token(
    config: ElasticBertConfig,
    active_exits: Iterable[int],
    seq_len: float,
    mask_fraction: float = 0.15,
    sequences_per_token: float | None = None,
) -> float:
    """Useful matmul FLOPs per input token of one pre-training step (forward + backward = 3 × forward).

    Counts the encoder up to the deepest active exit, and per active exit the MLM transform + vocabulary projection at
    masked positions only and the pooler + SOP classifier once per sequence. Samples of mixed lengths l_i: pass
    `seq_len` = Σ l² / Σ l (the encoder's cost per token is linear in the length through attention, so this length
    gives the exact sum) and `sequences_per_token` = samples / Σ l (default 1 / seq_len: equal lengths).
    """
    exits = list(active_exits)
    h, vocab = config.hidden_size, config.vocab_size
    encoder = layer_flops(config, seq_len).matmul * max(exits) / seq_len
    mlm = len(exits) * mask_fraction * 2 * (h * h + h * vocab)
    per_token = 1 / seq_len if sequences_per_token is None else sequences_per_token
    sop = len(exits) * 2 * (h * h + 2 * h) * per_token
    return 3 * (encoder + mlm + sop)


def encoder_parameter_count(config: ElasticBertConfig) -> int:
    """Parameters of `ElasticBertModel` (embeddings, layers, one pooler per layer)."""
    return encoder_parameters(
        config.hidden_size,
        config.intermediate_size,
        config.num_hidden_layers,
        config.vocab_size,
        config.max_position_embeddings,
        config.type_vocab_size,
    )
