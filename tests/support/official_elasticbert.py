"""A minimal re-creation of the official ElasticBERT classes (github fastnlp/ElasticBERT), to test what we write in
their layout: their module tree (so their state-dict keys, loaded with strict=True), their config handling (the
path `num_output_layers` selects, which poolers exist) and their eval forward.

Written by hand from the public code, not imported from it (it needs transformers 4.x), and independent of
`elasticbert.layouts`, so a naming slip on our side fails the tests:

- `OfficialStaticClassifier`: `finetune-static/models/modeling_elasticbert.py`, ElasticBertForSequenceClassification
  (`classifier` on the pooled output; with num_output_layers > 1 that output is a tuple and its forward fails);
- `OfficialEntropyClassifier`: `finetune-dynamic/models/modeling_elasticbert_entropy.py`, its
  ElasticBertForSequenceClassification (`classifiers[i]` for the i-th output; the patience variant has the same
  modules): the eval forward without early exit (`forward`, the encoder's `pooler[i - start]`) and its entropy early
  exit for one example (`highway_forward`, `adaptive_forward`'s `pooler[i]`).

Not re-created: training (gradient rescaling, losses), relative position embeddings, gradient checkpointing.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

OFFICIAL_DEFAULTS = dict(  # configuration_elasticbert.py's ElasticBertConfig
    vocab_size=30522,
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    max_output_layers=12,
    num_output_layers=12,
    intermediate_size=3072,
    hidden_act="gelu",
    hidden_dropout_prob=0.1,
    attention_probs_dropout_prob=0.1,
    max_position_embeddings=512,
    type_vocab_size=2,
    initializer_range=0.02,
    layer_norm_eps=1e-12,
    pad_token_id=0,
    gradient_checkpointing=False,
    position_embedding_type="absolute",
    use_cache=True,
)


def official_config(fields: dict) -> SimpleNamespace:
    """The official config from a config.json dict: its defaults, then the file's fields; `num_labels` as
    transformers' PretrainedConfig derives it (from id2label, else 2)."""
    config = SimpleNamespace(**{**OFFICIAL_DEFAULTS, **fields})
    config.num_labels = len(fields["id2label"]) if fields.get("id2label") else 2
    return config


def extended_attention_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """transformers 4.x `get_extended_attention_mask` for an encoder: 0 where attended, -10000 at padding."""
    return (1.0 - attention_mask[:, None, None, :].float()) * -10000.0


def entropy(x: torch.Tensor) -> torch.Tensor:
    """The official entropy of pre-softmax logits."""
    exp_x = torch.exp(x)
    a = torch.sum(exp_x, dim=1)
    b = torch.sum(x * exp_x, dim=1)
    return torch.log(a) - b / a


class Embeddings(nn.Module):
    def __init__(self, config: SimpleNamespace) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.register_buffer("position_ids", torch.arange(config.max_position_embeddings).expand((1, -1)))

    def forward(self, input_ids, token_type_ids):
        position_ids = self.position_ids[:, : input_ids.shape[1]]
        embeddings = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        embeddings += self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(embeddings))


class SelfAttention(nn.Module):
    def __init__(self, config: SimpleNamespace) -> None:
        super().__init__()
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = config.hidden_size // config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    def transpose_for_scores(self, x):
        return x.view(*x.shape[:-1], self.num_attention_heads, self.attention_head_size).permute(0, 2, 1, 3)

    def forward(self, hidden_states, attention_mask):
        query = self.transpose_for_scores(self.query(hidden_states))
        key = self.transpose_for_scores(self.key(hidden_states))
        value = self.transpose_for_scores(self.value(hidden_states))
        scores = torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(self.attention_head_size)
        probs = self.dropout(nn.Softmax(dim=-1)(scores + attention_mask))
        context = torch.matmul(probs, value).permute(0, 2, 1, 3).contiguous()
        return context.view(*context.shape[:-2], -1)


class SelfOutput(nn.Module):
    def __init__(self, config: SimpleNamespace, in_features: int | None = None) -> None:
        super().__init__()
        self.dense = nn.Linear(in_features or config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states, input_tensor):
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + input_tensor)


class Attention(nn.Module):
    def __init__(self, config: SimpleNamespace) -> None:
        super().__init__()
        self.self = SelfAttention(config)
        self.output = SelfOutput(config)

    def forward(self, hidden_states, attention_mask):
        return self.output(self.self(hidden_states, attention_mask), hidden_states)


class Intermediate(nn.Module):
    def __init__(self, config: SimpleNamespace) -> None:
        super().__init__()
        assert config.hidden_act == "gelu", "only transformers 4.x ACT2FN['gelu'] (exact, erf) is re-created"
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)

    def forward(self, hidden_states):
        return F.gelu(self.dense(hidden_states))


class Layer(nn.Module):
    def __init__(self, config: SimpleNamespace) -> None:
        super().__init__()
        self.attention = Attention(config)
        self.intermediate = Intermediate(config)
        self.output = SelfOutput(config, config.intermediate_size)  # ElasticBertOutput: the same modules

    def forward(self, hidden_states, attention_mask):
        attention_output = self.attention(hidden_states, attention_mask)
        return self.output(self.intermediate(attention_output), attention_output)


class Pooler(nn.Module):
    def __init__(self, config: SimpleNamespace) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden_states):
        return torch.tanh(self.dense(hidden_states[:, 0]))


class Encoder(nn.Module):
    """Poolers only at the output layers (None elsewhere in a `max_output_layers`-long list), as the official
    encoder builds them; `relative_poolers`: the dynamic files' forward reads `pooler[i - start]`, the static file's
    `pooler[i]`."""

    def __init__(self, config: SimpleNamespace, relative_poolers: bool) -> None:
        super().__init__()
        self.num_output_layers = config.num_output_layers
        self.num_hidden_layers = config.num_hidden_layers
        self.relative_poolers = relative_poolers
        self.layer = nn.ModuleList([Layer(config) for _ in range(config.num_hidden_layers)])
        assert self.num_output_layers <= self.num_hidden_layers, "more output layers than layers"
        self.start_output_layer = None
        self.current_pooler_num = None
        if self.num_output_layers > 1:
            self.start_output_layer = self.num_hidden_layers - self.num_output_layers
            first, last = self.start_output_layer, self.num_hidden_layers - 1
            self.pooler = nn.ModuleList(
                [Pooler(config) if first <= i <= last else None for i in range(config.max_output_layers)]
            )
        elif self.num_output_layers == 1:
            self.current_pooler_num = self.num_hidden_layers - 1
            self.pooler = nn.ModuleList(
                [Pooler(config) if i == self.current_pooler_num else None for i in range(config.max_output_layers)]
            )

    def forward(self, hidden_states, attention_mask):
        pooled_outputs, final_pooled_output = (), None
        for i, layer_module in enumerate(self.layer):
            hidden_states = layer_module(hidden_states, attention_mask)
            if self.num_output_layers > 1 and i >= self.start_output_layer:
                index = i - self.start_output_layer if self.relative_poolers else i
                pooled_outputs += (self.pooler[index](hidden_states),)
            elif self.num_output_layers == 1 and i == self.num_hidden_layers - 1:
                final_pooled_output = self.pooler[self.current_pooler_num](hidden_states)
        return pooled_outputs if self.num_output_layers > 1 else final_pooled_output

    def adaptive_forward(self, hidden_states, current_layer, attention_mask):
        hidden_states = self.layer[current_layer](hidden_states, attention_mask)
        return hidden_states, self.pooler[current_layer](hidden_states)


class Model(nn.Module):
    def __init__(self, config: SimpleNamespace, relative_poolers: bool) -> None:
        super().__init__()
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config, relative_poolers)

    def forward(self, input_ids, attention_mask, token_type_ids):
        """The pooled output: one tensor (num_output_layers 1) or a tuple of them."""
        embedding_output = self.embeddings(input_ids, token_type_ids)
        return self.encoder(embedding_output, extended_attention_mask(attention_mask))


class OfficialStaticClassifier(nn.Module):
    def __init__(self, config: SimpleNamespace) -> None:
        super().__init__()
        self.config = config
        self.elasticbert = Model(config, relative_poolers=False)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, input_ids, attention_mask, token_type_ids):
        output = self.elasticbert(input_ids, attention_mask, token_type_ids)
        return self.classifier(self.dropout(output))  # a tuple (num_output_layers > 1) fails here, as there


class OfficialEntropyClassifier(nn.Module):
    def __init__(self, config: SimpleNamespace) -> None:
        super().__init__()
        self.config = config
        self.elasticbert = Model(config, relative_poolers=True)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifiers = nn.ModuleList(
            [nn.Linear(config.hidden_size, config.num_labels) for _ in range(config.num_output_layers)]
        )

    def forward(self, input_ids, attention_mask, token_type_ids):
        """Eval without early exit: every output's logits."""
        pooled_outputs = self.elasticbert(input_ids, attention_mask, token_type_ids)
        assert len(pooled_outputs) == len(self.classifiers)
        return [self.classifiers[i](pooled) for i, pooled in enumerate(pooled_outputs)]

    def highway_forward(self, input_ids, attention_mask, token_type_ids, threshold):
        """Eval with early exit (`eval_highway`, one example): (the logits it leaves with, its 1-based layer)."""
        mask = extended_attention_mask(attention_mask)
        hidden_states = self.elasticbert.embeddings(input_ids, token_type_ids)
        for i in range(self.config.num_hidden_layers):
            hidden_states, pooled = self.elasticbert.encoder.adaptive_forward(hidden_states, i, mask)
            logits = self.classifiers[i](pooled)
            if entropy(logits) < threshold:
                return logits, i + 1
        return logits, self.config.num_hidden_layers
