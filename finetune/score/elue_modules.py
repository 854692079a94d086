"""ElasticBERT's modules under the names of an ELUE activation trace (`emb`, `layer_i`, `exit_i`).

This file is written, with CONFIG filled in, as the `model.py` of every ELUE submission (`finetune.score.submission`):
ELUE computes each test sample's FLOPs by running the modules its trace names on inputs of the traced shapes. It
depends on torch only, so that it runs outside this project. The arithmetic is the one `elasticbert.modeling` runs
(post-LN layers; a linear exit = the layer's pooler on [CLS] + a classifier; an MHA exit = a projection to d_e, one
[CLS] query attending over the sequence, a classifier), not its code: weights are not needed to count FLOPs.

Inputs carry a leading batch dimension: `emb` takes token ids [B, L]; `layer_i` and an MHA `exit_i` take hidden
states [B, L, H]; a linear `exit_i` takes the [CLS] vector [B, H].
"""

from __future__ import annotations

import math

import torch
from torch import nn

# Filled in from the model's config.json when written into a submission.
CONFIG: dict = {
    "vocab_size": 30522,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
    "num_labels": 2,
    "exit_layers": list(range(1, 13)),
    "exit_type": "linear",
    "exit_mha_dim": 64,
    "exit_mha_heads": 4,
}


class Embeddings(nn.Module):
    def __init__(self, c: dict) -> None:
        super().__init__()
        self.word = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.position = nn.Embedding(c["max_position_embeddings"], c["hidden_size"])
        self.token_type = nn.Embedding(c["type_vocab_size"], c["hidden_size"])
        self.norm = nn.LayerNorm(c["hidden_size"], eps=c["layer_norm_eps"])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        x = self.word(input_ids) + self.position(positions) + self.token_type(torch.zeros_like(input_ids))
        return self.norm(x)


class Layer(nn.Module):
    """Self-attention (H -> H, `num_attention_heads` heads) + residual + LayerNorm, FFN (H -> I -> H, GELU) + residual +
    LayerNorm."""

    def __init__(self, c: dict) -> None:
        super().__init__()
        h = c["hidden_size"]
        self.heads = c["num_attention_heads"]
        self.query, self.key, self.value, self.out = (nn.Linear(h, h) for _ in range(4))
        self.norm1 = nn.LayerNorm(h, eps=c["layer_norm_eps"])
        self.up = nn.Linear(h, c["intermediate_size"])
        self.down = nn.Linear(c["intermediate_size"], h)
        self.norm2 = nn.LayerNorm(h, eps=c["layer_norm_eps"])

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        b, length, h = hidden.shape
        d = h // self.heads

        def split(x: torch.Tensor) -> torch.Tensor:
            return x.view(b, length, self.heads, d).transpose(1, 2)

        q, k, v = split(self.query(hidden)), split(self.key(hidden)), split(self.value(hidden))
        weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), dim=-1)
        context = (weights @ v).transpose(1, 2).reshape(b, length, h)
        x = self.norm1(hidden + self.out(context))
        return self.norm2(x + self.down(nn.functional.gelu(self.up(x))))


class LinearExit(nn.Module):
    """The layer's pooler (Linear(H, H) + tanh) on the [CLS] vector, then Linear(H, K)."""

    def __init__(self, c: dict) -> None:
        super().__init__()
        self.pooler = nn.Linear(c["hidden_size"], c["hidden_size"])
        self.classifier = nn.Linear(c["hidden_size"], c["num_labels"])

    def forward(self, cls_vector: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.tanh(self.pooler(cls_vector)))


class MHAExit(nn.Module):
    """Linear(H, d_e) + tanh, one [CLS] query attending over the sequence (heads of d_e / h), Linear(d_e, d_e) + tanh,
    Linear(d_e, K)."""

    def __init__(self, c: dict) -> None:
        super().__init__()
        d = c["exit_mha_dim"]
        self.heads = c["exit_mha_heads"]
        self.projection = nn.Linear(c["hidden_size"], d)
        self.query, self.key, self.value, self.out = (nn.Linear(d, d) for _ in range(4))
        self.classifier = nn.Linear(d, c["num_labels"])

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        b, length, _ = hidden.shape
        x = torch.tanh(self.projection(hidden))
        d = x.shape[-1] // self.heads
        q = self.query(x[:, :1]).view(b, 1, self.heads, d).transpose(1, 2)
        k = self.key(x).view(b, length, self.heads, d).transpose(1, 2)
        v = self.value(x).view(b, length, self.heads, d).transpose(1, 2)
        weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), dim=-1)
        context = (weights @ v).reshape(b, -1)
        return self.classifier(torch.tanh(self.out(context)))


def build(config: dict | None = None) -> nn.ModuleDict:
    """Every module an activation trace can name: emb, layer_1..layer_N, exit_l for each exit layer l."""
    c = dict(CONFIG if config is None else config)
    modules: dict[str, nn.Module] = {"emb": Embeddings(c)}
    for i in range(1, c["num_hidden_layers"] + 1):
        modules[f"layer_{i}"] = Layer(c)
    exit_class = MHAExit if c["exit_type"] == "mha" else LinearExit
    for i in c["exit_layers"]:
        modules[f"exit_{i}"] = exit_class(c)
    return nn.ModuleDict(modules)
