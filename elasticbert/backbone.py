"""ElasticBERT's encoder: embeddings, post-LN layers with a pooler per layer, the shared `ElasticBertPreTrainedModel`
(loading, saving, gradient checkpointing) and `ElasticBertModel`, whose forward returns every requested exit's hidden
state and stops at the deepest. The heads are in `modeling` (pre-training) and `modeling_classification` (the exits);
`elasticbert.modeling` exports every class (see its docstring)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel
from transformers.activations import ACT2FN
from transformers.utils import ModelOutput

from common.integrity import discard_seal

from .configuration import ElasticBertConfig, validate_exit_layers
from .dropout import Dropout, scaled_dot_product_attention
from .gradient_equilibrium import equilibrium_weights, rescale_gradient
from .masks import attention_mask_for_sdpa, packed_attention_mask
from .remote_code import AUTO_MAP, write_remote_code
from .verification import verified_load, verify_pretrained_path

# ----------------------------------------------------------------------------------------------------------- encoder


class ElasticBertEmbeddings(nn.Module):
    """Word + position + token-type embeddings -> LayerNorm -> dropout; positions as BERT or as RoBERTa computes them
    (`config.position_ids_style`)."""

    def __init__(self, config: ElasticBertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        roberta = config.position_ids_style == "roberta"
        self.position_embeddings = nn.Embedding(
            config.max_position_embeddings, config.hidden_size, padding_idx=config.pad_token_id if roberta else None
        )
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)
        self.padding_idx = config.pad_token_id if roberta else None
        self.max_sequence_length = config.max_sequence_length

    def default_position_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """BERT: 0..T-1. RoBERTa (fairseq's make_positions, as `RobertaEmbeddings`): padding_idx + 1 + the running
        count of real tokens, padding_idx at pads, so left or right padding leaves a text's positions unchanged."""
        if self.padding_idx is None:
            return torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        real = input_ids.ne(self.padding_idx).int()
        return (torch.cumsum(real, dim=1).type_as(real) * real).long() + self.padding_idx

    def packed_position_ids(self, sample_ids: torch.Tensor) -> torch.Tensor:
        """Positions of packed rows (`sample_ids`: [R, T], 1, 2, ... per text, 0 = padding): every text counts from
        its own first token, as it would alone in a row (BERT: 0, 1, ...; RoBERTa: padding_idx + 1, ..., with
        padding_idx at pads). Computed on the device from where the sample number changes: no host sync."""
        index = torch.arange(sample_ids.shape[1], device=sample_ids.device).expand_as(sample_ids)
        starts = torch.ones_like(sample_ids, dtype=torch.bool)
        starts[:, 1:] = sample_ids[:, 1:] != sample_ids[:, :-1]
        first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
        if self.padding_idx is None:
            return index - first
        return torch.where(sample_ids > 0, index - first + self.padding_idx + 1, self.padding_idx)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        sample_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        seq_len = input_ids.shape[1]
        if seq_len > self.max_sequence_length:
            raise ValueError(
                f"sequence length {seq_len} exceeds the {self.max_sequence_length} positions this model covers "
                f"(max_position_embeddings={self.position_embeddings.num_embeddings})"
            )
        if position_ids is None:
            position_ids = (
                self.default_position_ids(input_ids) if sample_ids is None else self.packed_position_ids(sample_ids)
            )
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(x))


class ElasticBertSelfAttention(nn.Module):
    def __init__(self, config: ElasticBertConfig) -> None:
        super().__init__()
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = config.head_dim
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_prob = config.attention_probs_dropout_prob

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.num_attention_heads, self.attention_head_size).transpose(1, 2)

    def forward(self, hidden: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        q, k, v = self._heads(self.query(hidden)), self._heads(self.key(hidden)), self._heads(self.value(hidden))
        context = scaled_dot_product_attention(q, k, v, attn_mask, self.dropout_prob if self.training else 0.0)
        b, _, t, _ = context.shape
        return context.transpose(1, 2).reshape(b, t, -1)


class ElasticBertSelfOutput(nn.Module):
    def __init__(self, config: ElasticBertConfig, in_features: int | None = None) -> None:
        super().__init__()
        self.dense = nn.Linear(in_features or config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden)) + residual)


class ElasticBertAttention(nn.Module):
    def __init__(self, config: ElasticBertConfig) -> None:
        super().__init__()
        self.self = ElasticBertSelfAttention(config)
        self.output = ElasticBertSelfOutput(config)

    def forward(self, hidden: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        return self.output(self.self(hidden, attn_mask), hidden)


class ElasticBertIntermediate(nn.Module):
    def __init__(self, config: ElasticBertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.intermediate_act_fn = ACT2FN[config.hidden_act]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.intermediate_act_fn(self.dense(hidden))


class ElasticBertOutput(ElasticBertSelfOutput):
    def __init__(self, config: ElasticBertConfig) -> None:
        super().__init__(config, in_features=config.intermediate_size)


class ElasticBertLayer(nn.Module):
    def __init__(self, config: ElasticBertConfig) -> None:
        super().__init__()
        self.attention = ElasticBertAttention(config)
        self.intermediate = ElasticBertIntermediate(config)
        self.output = ElasticBertOutput(config)

    def forward(self, hidden: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        attended = self.attention(hidden, attn_mask)
        return self.output(self.intermediate(attended), attended)


class ElasticBertPooler(nn.Module):
    """dense -> tanh on the [CLS] state; one per layer, shared by the SOP head and the linear classifier exit."""

    def __init__(self, config: ElasticBertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(hidden[:, 0]))


class ElasticBertEncoder(nn.Module):
    def __init__(self, config: ElasticBertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList([ElasticBertLayer(config) for _ in range(config.num_hidden_layers)])
        self.pooler = nn.ModuleList([ElasticBertPooler(config) for _ in range(config.num_hidden_layers)])
        self.gradient_checkpointing = False

    def run_layer(self, index: int, hidden: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        """Layer `index` (0-based), with activation checkpointing when enabled and training."""
        layer = self.layer[index]
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            return checkpoint(layer, hidden, attn_mask, use_reentrant=False)
        return layer(hidden, attn_mask)


# ------------------------------------------------------------------------------------------------------------ models


class ElasticBertPreTrainedModel(PreTrainedModel):
    """Shared by every ElasticBERT class. Hugging Face conventions hold on each: `output_hidden_states` (embeddings
    plus every computed layer, as `BertModel`), `return_dict=False` (tuples, `None`s dropped), `labels` -> `loss`;
    unknown keyword arguments raise TypeError instead of being ignored."""

    config_class = ElasticBertConfig
    base_model_prefix = "elasticbert"
    supports_gradient_checkpointing = True
    _keys_to_ignore_on_load_unexpected = [r"position_ids", r"token_type_ids$", r"cls\.predictions\.decoder\.bias$"]
    reads_official_heads = False  # the classifier maps the released fine-tuned heads onto its exits

    @classmethod
    def _official_key_mapping(cls, path: str | os.PathLike, kwargs: dict) -> dict[str, str] | None:
        """The renames `from_pretrained` reads a checkpoint of the official heads with (classes that do)."""
        return None

    def _set_gradient_checkpointing(self, enable: bool = True, gradient_checkpointing_func: object = None) -> None:
        for module in self.modules():
            if isinstance(module, ElasticBertEncoder):
                module.gradient_checkpointing = enable

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None) -> None:
        """Recompute each layer in the backward pass (saves activation memory at seq 512 / large)."""
        self._set_gradient_checkpointing(True)

    def gradient_checkpointing_disable(self) -> None:
        self._set_gradient_checkpointing(False)

    def save_pretrained(self, save_directory: str | os.PathLike, *args: object, **kwargs: object) -> None:
        """transformers' `save_pretrained`, plus what lets plain transformers load the directory with
        `trust_remote_code=True` and no `import elasticbert` (`remote_code`)."""
        self.config.auto_map = dict(AUTO_MAP)
        discard_seal(save_directory)  # the files change: whoever writes the directory seals it again
        super().save_pretrained(save_directory, *args, **kwargs)
        write_remote_code(save_directory)

    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path: str | os.PathLike, *model_args: object, **kwargs: object
    ) -> PreTrainedModel:
        """transformers' loader, plus the released ElasticBERT fine-tuned heads (`classifiers.{i}`, `classifier`)
        mapped onto our exits through its `key_mapping` hook (the same renames `load_pretrained` applies). The model
        then saves in our own layout, not in the one it was read from. A local directory is verified first
        (`verification`; `verify_checksums=False` loads one that fails)."""
        verify_pretrained_path(
            pretrained_model_name_or_path, kwargs.get("subfolder"), kwargs.pop("verify_checksums", None)
        )
        if kwargs.get("key_mapping") is None and cls.reads_official_heads:
            kwargs["key_mapping"] = cls._official_key_mapping(pretrained_model_name_or_path, kwargs)
        with verified_load():
            loaded = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded  # output_loading_info=True returns a pair
        model._weight_conversions = []  # transformers would otherwise save back under the official names
        return loaded

    def _tuple_unless_dict(self, output: ModelOutput, return_dict: bool | None) -> ModelOutput | tuple:
        wanted = return_dict if return_dict is not None else getattr(self.config, "return_dict", True)
        return output if wanted else output.to_tuple()

    def _wants_hidden_states(self, output_hidden_states: bool | None, output_attentions: bool | None) -> bool:
        if output_attentions:
            raise ValueError(
                f"{type(self).__name__}: output_attentions=True is not available (attention runs through "
                "scaled_dot_product_attention, which does not return its weights)"
            )
        if output_hidden_states is not None:
            return bool(output_hidden_states)
        return bool(getattr(self.config, "output_hidden_states", False))


@dataclass
class ElasticBertModelOutput(ModelOutput):
    """`last_hidden_state` is the deepest requested exit's; `hidden_states` (with `output_hidden_states`) the
    embeddings and every layer computed, as `BertModel` returns them; `exit_hidden_states` / `pooled_outputs` the
    requested exits', in `exit_layers` order."""

    last_hidden_state: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    exit_hidden_states: tuple[torch.Tensor, ...] | None = None
    exit_layers: tuple[int, ...] | None = None
    pooled_outputs: tuple[torch.Tensor, ...] | None = None


def upcast(x: torch.Tensor) -> torch.Tensor:
    """Losses in at least fp32: bf16/fp16 logits are upcast, fp32/fp64 left alone."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


class ElasticBertModel(ElasticBertPreTrainedModel):
    """The encoder with per-layer poolers. `exit_layers` picks which hidden states come back; compute stops at the
    deepest of them. `gradient_equilibrium=True` rescales gradients at the exits (see `gradient_equilibrium`)."""

    def __init__(self, config: ElasticBertConfig) -> None:
        super().__init__(config)
        self.embeddings = ElasticBertEmbeddings(config)
        self.encoder = ElasticBertEncoder(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.word_embeddings = value

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        exit_layers: Sequence[int] | None = None,
        gradient_equilibrium: bool = False,
        output_pooled: bool = False,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        sample_ids: torch.Tensor | None = None,
        **unused: object,
    ) -> ElasticBertModelOutput | tuple:
        """`sample_ids` ([B, T], 1, 2, ... per text, 0 = padding) marks packed rows, several texts per row: each text
        attends only to itself (`packed_attention_mask`), counts its positions from its own first token, and
        `attention_mask` is then not read (the sample numbers say where the padding is). Without it, one text per
        row, as in `BertModel`. A pooled output reads each row's first token: of packed rows, gather the texts'
        [CLS] states from the hidden states instead (`ElasticBertForPreTraining` does)."""
        if unused:
            raise TypeError(f"ElasticBertModel.forward got unexpected arguments: {sorted(unused)}")
        all_states = self._wants_hidden_states(output_hidden_states, output_attentions)
        num_layers = self.config.num_hidden_layers
        exits = validate_exit_layers(exit_layers or range(1, num_layers + 1), num_layers)
        weights = equilibrium_weights(exits) if gradient_equilibrium else {}
        if sample_ids is None:
            attn_mask = attention_mask_for_sdpa(attention_mask)
        elif sample_ids.shape != input_ids.shape:
            raise ValueError(
                f"sample_ids {tuple(sample_ids.shape)} must have the shape of input_ids {tuple(input_ids.shape)}"
            )
        else:
            attn_mask = packed_attention_mask(sample_ids)

        hidden = self.embeddings(input_ids, token_type_ids, position_ids, sample_ids)
        computed = [hidden]
        outputs, pooled = [], []
        for index in range(exits[-1]):
            hidden = self.encoder.run_layer(index, hidden, attn_mask)
            layer = index + 1
            if layer in exits:
                exit_hidden = hidden
                if layer in weights:
                    to_head, to_deeper = weights[layer]
                    exit_hidden = rescale_gradient(hidden, to_head)
                    hidden = rescale_gradient(exit_hidden, to_deeper)
                outputs.append(exit_hidden)
                if output_pooled:
                    pooled.append(self.encoder.pooler[index](exit_hidden))
            computed.append(hidden)
        output = ElasticBertModelOutput(
            last_hidden_state=outputs[-1],
            hidden_states=tuple(computed) if all_states else None,
            exit_hidden_states=tuple(outputs),
            exit_layers=tuple(exits),
            pooled_outputs=tuple(pooled) if output_pooled else None,
        )
        return self._tuple_unless_dict(output, return_dict)
