"""ElasticBERT: a post-LN BERT whose every layer can be an exit.

Module and parameter names follow the released `fnlp/elasticbert-base` checkpoints (`elasticbert.embeddings.*`,
`elasticbert.encoder.layer.{i}.*`, per-layer poolers `elasticbert.encoder.pooler.{i}.dense.*`), so those load with no
missing or unexpected keys, and BERT-family layers map one to one (see `elasticbert.layouts` / `elasticbert.loading`).
RoBERTa-style position ids (`config.position_ids_style`) and a single token type are config choices, so a converted
RoBERTa reproduces `RobertaModel`.

Two things differ from `transformers.BertModel` on purpose:
- the forward pass returns the hidden state of every requested exit layer and stops at the deepest one;
- the MLM head runs only at masked positions (gathered first) and the vocabulary projection of all active exits is one
  matrix product: with 12 exits, dense logits at every token would cost several times the encoder.

Hugging Face conventions hold on every class: `output_hidden_states=True` (embeddings + every computed layer),
`return_dict=False` (tuples), `labels` -> `loss`, unknown keyword arguments -> TypeError. The classifier's `logits`
are the deepest exit's [B, K] (what pipelines and `Trainer` read); `exit_logits` are every exit's.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import PretrainedConfig, PreTrainedModel
from transformers.activations import ACT2FN
from transformers.utils import ModelOutput

from common.integrity import discard_seal

from .configuration import ElasticBertConfig, validate_exit_layers
from .dropout import Dropout, scaled_dot_product_attention
from .early_exit import rule_for, run_batch
from .exit_setting import EarlyExitSetting
from .gradient_equilibrium import equilibrium_weights, rescale_gradient
from .layouts import official_head_renames
from .masked_lm import exits_masked_lm_loss
from .masks import attention_mask_for_sdpa
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

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        seq_len = input_ids.shape[1]
        if seq_len > self.max_sequence_length:
            raise ValueError(
                f"sequence length {seq_len} exceeds the {self.max_sequence_length} positions this model covers "
                f"(max_position_embeddings={self.position_embeddings.num_embeddings})"
            )
        if position_ids is None:
            position_ids = self.default_position_ids(input_ids)
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

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, ElasticBertPreTrainingHeads):
            nn.init.zeros_(module.predictions.bias)

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
        if kwargs.get("key_mapping") is None and issubclass(cls, ElasticBertForSequenceClassification):
            kwargs["key_mapping"] = _official_key_mapping(pretrained_model_name_or_path, kwargs)
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


HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "proxies", "token", "revision", "subfolder")


def _official_key_mapping(path: str | os.PathLike, kwargs: dict) -> dict[str, str] | None:
    """The official heads' renames for a classifier read from `path`, or None when they cannot apply (not an
    ElasticBERT checkpoint, MHA exits, or a config transformers will report on itself)."""
    try:
        raw, _ = PretrainedConfig.get_config_dict(path, **{k: kwargs[k] for k in HUB_KWARGS if k in kwargs})
    except (OSError, ValueError):
        return None
    if raw.get("model_type") != "elasticbert":
        return None
    config = kwargs.get("config")
    exit_type = kwargs.get("exit_type") or getattr(config, "exit_type", None) or raw.get("exit_type", "linear")
    if exit_type != "linear":
        return None
    return official_head_renames(int(raw.get("num_hidden_layers", 12)), raw.get("num_output_layers"))


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
        **unused: object,
    ) -> ElasticBertModelOutput | tuple:
        if unused:
            raise TypeError(f"ElasticBertModel.forward got unexpected arguments: {sorted(unused)}")
        all_states = self._wants_hidden_states(output_hidden_states, output_attentions)
        num_layers = self.config.num_hidden_layers
        exits = validate_exit_layers(exit_layers or range(1, num_layers + 1), num_layers)
        weights = equilibrium_weights(exits) if gradient_equilibrium else {}
        attn_mask = attention_mask_for_sdpa(attention_mask)

        hidden = self.embeddings(input_ids, token_type_ids, position_ids)
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


# ------------------------------------------------------------------------------------------------- pre-training


class ElasticBertPredictionHeadTransform(nn.Module):
    def __init__(self, config: ElasticBertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.transform_act_fn = ACT2FN[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.transform_act_fn(self.dense(hidden)))


class ElasticBertLMPredictions(nn.Module):
    """Per-exit transforms feeding one decoder (tied to the word embeddings) with one shared bias."""

    def __init__(self, config: ElasticBertConfig) -> None:
        super().__init__()
        self.transform = nn.ModuleList(
            [ElasticBertPredictionHeadTransform(config) for _ in range(config.num_hidden_layers)]
        )
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def logits(self, layer: int, hidden: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits of exit `layer` (1-based) for any [..., H] hidden states."""
        return F.linear(self.transform[layer - 1](hidden), self.decoder.weight, self.bias)


class ElasticBertPreTrainingHeads(nn.Module):
    def __init__(self, config: ElasticBertConfig) -> None:
        super().__init__()
        self.predictions = ElasticBertLMPredictions(config)
        self.seq_relationship = nn.ModuleList(
            [nn.Linear(config.hidden_size, 2) for _ in range(config.num_hidden_layers)]
        )


@dataclass
class ElasticBertPreTrainingOutput(ModelOutput):
    """With labels: `loss` = Σ over active exits of (MLM + SOP); the per-exit tensors are detached, in `exit_layers`
    order. Without labels (inference, as `AlbertForPreTraining`): the deepest exit's `prediction_logits` [B, T, V]
    and `sop_logits` [B, 2]."""

    loss: torch.Tensor | None = None
    prediction_logits: torch.Tensor | None = None
    sop_logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    exit_layers: tuple[int, ...] | None = None
    mlm_loss: torch.Tensor | None = None
    sop_loss: torch.Tensor | None = None
    mlm_accuracy: torch.Tensor | None = None
    sop_accuracy: torch.Tensor | None = None
    num_masked: int | None = None


class ElasticBertForPreTraining(ElasticBertPreTrainedModel):
    """Per-exit MLM + SOP heads. Labels go in as `mlm_labels` / `sop_labels`, or under transformers' names
    (`labels`, ALBERT's `sentence_order_label`); both or neither."""

    _tied_weights_keys = {"cls.predictions.decoder.weight": "elasticbert.embeddings.word_embeddings.weight"}

    def __init__(self, config: ElasticBertConfig) -> None:
        super().__init__(config)
        self.elasticbert = ElasticBertModel(config)
        self.cls = ElasticBertPreTrainingHeads(config)
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.cls.predictions.decoder

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.cls.predictions.decoder = new_embeddings

    def masked_lm_rows(
        self, exits: Sequence[int], states: Sequence[torch.Tensor], positions: torch.Tensor
    ) -> torch.Tensor:
        """Each exit's MLM transform at the flattened token `positions`, stacked exit-major: [k * M, H].

        Gathering the masked positions first (sparse MLM prediction) is what makes 12 MLM heads affordable.
        """
        transform = self.cls.predictions.transform
        return torch.cat(
            [transform[layer - 1](state.reshape(-1, state.shape[-1])[positions]) for layer, state in zip(exits, states)]
        )

    def masked_lm_logits(
        self, exits: Sequence[int], states: Sequence[torch.Tensor], positions: torch.Tensor
    ) -> torch.Tensor:
        """Vocabulary logits at the flattened token `positions` for each exit, stacked exit-major: [k * M, V]."""
        heads = self.cls.predictions
        return F.linear(self.masked_lm_rows(exits, states, positions), heads.decoder.weight, heads.bias)

    def sop_logits(self, layer: int, state: torch.Tensor) -> torch.Tensor:
        return self.cls.seq_relationship[layer - 1](self.elasticbert.encoder.pooler[layer - 1](state))

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        mlm_labels: torch.Tensor | None = None,
        sop_labels: torch.Tensor | None = None,
        active_exits: Sequence[int] | None = None,
        gradient_equilibrium: bool = False,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        sentence_order_label: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
    ) -> ElasticBertPreTrainingOutput | tuple:
        mlm_labels, sop_labels = _pretraining_labels(mlm_labels, labels, sop_labels, sentence_order_label)
        encoded = self.elasticbert(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            exit_layers=active_exits,
            gradient_equilibrium=gradient_equilibrium,
            output_hidden_states=self._wants_hidden_states(output_hidden_states, output_attentions),
            return_dict=True,
        )
        exits, states = encoded.exit_layers, encoded.exit_hidden_states
        if mlm_labels is None:
            output = ElasticBertPreTrainingOutput(
                prediction_logits=self.cls.predictions.logits(exits[-1], states[-1]),
                sop_logits=self.sop_logits(exits[-1], states[-1]),
                hidden_states=encoded.hidden_states,
                exit_layers=exits,
            )
        else:
            output = self._losses(exits, states, mlm_labels, sop_labels)
            output.hidden_states = encoded.hidden_states
        return self._tuple_unless_dict(output, return_dict)

    def _losses(
        self,
        exits: tuple[int, ...],
        states: tuple[torch.Tensor, ...],
        mlm_labels: torch.Tensor,
        sop_labels: torch.Tensor,
    ) -> ElasticBertPreTrainingOutput:
        flat_labels = mlm_labels.reshape(-1)
        masked = (flat_labels != -100).nonzero(as_tuple=True)[0]
        num_masked = int(masked.numel())
        targets = flat_labels[masked]
        rows = self.masked_lm_rows(exits, states, masked)
        if num_masked:
            heads = self.cls.predictions
            mlm_loss, mlm_accuracy = exits_masked_lm_loss(rows, heads.decoder.weight, heads.bias, targets, len(exits))
        else:  # keeps the graph connected so every rank's backward touches the same parameters
            logits = F.linear(rows, self.cls.predictions.decoder.weight, self.cls.predictions.bias)
            mlm_loss = logits.sum() * 0.0 + torch.zeros(len(exits), device=logits.device)
            mlm_accuracy = torch.zeros(len(exits), device=logits.device)

        sop_logits = torch.stack([self.sop_logits(layer, state) for layer, state in zip(exits, states)])  # [k, B, 2]
        sop_loss = (
            F.cross_entropy(upcast(sop_logits).flatten(0, 1), sop_labels.repeat(len(exits)), reduction="none")
            .view(len(exits), -1)
            .mean(dim=1)
        )
        sop_accuracy = (sop_logits.argmax(-1) == sop_labels).float().mean(dim=1)
        return ElasticBertPreTrainingOutput(
            loss=(mlm_loss + sop_loss).sum(),
            exit_layers=exits,
            mlm_loss=mlm_loss.detach(),
            sop_loss=sop_loss.detach(),
            mlm_accuracy=mlm_accuracy.detach(),
            sop_accuracy=sop_accuracy.detach(),
            num_masked=num_masked,
        )


def _pretraining_labels(
    mlm_labels: torch.Tensor | None,
    labels: torch.Tensor | None,
    sop_labels: torch.Tensor | None,
    sentence_order_label: torch.Tensor | None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Our label names or transformers' (never both); MLM and SOP labels come together or not at all."""
    if mlm_labels is not None and labels is not None:
        raise ValueError("ElasticBertForPreTraining: pass mlm_labels or labels (the same thing), not both")
    if sop_labels is not None and sentence_order_label is not None:
        raise ValueError("ElasticBertForPreTraining: pass sop_labels or sentence_order_label, not both")
    mlm = mlm_labels if mlm_labels is not None else labels
    sop = sop_labels if sop_labels is not None else sentence_order_label
    if (mlm is None) != (sop is None):
        raise ValueError(
            "ElasticBertForPreTraining: the loss needs both MLM labels (-100 = not masked) and SOP labels; "
            "pass neither for logits"
        )
    return mlm, sop


def exit_groups(num_layers: int, num_groups: int) -> list[tuple[int, ...]]:
    """Grouped exits: layer l < L goes to group (l - 1) mod G; the top layer L is in every group.

    exit_groups(12, 2) == [(1, 3, 5, 7, 9, 11, 12), (2, 4, 6, 8, 10, 12)]; optimizer step t trains group t mod G.
    """
    if not 1 <= num_groups <= max(num_layers - 1, 1):
        raise ValueError(f"num_groups={num_groups} must be within 1..{max(num_layers - 1, 1)} for {num_layers} layers")
    return [
        tuple(layer for layer in range(1, num_layers) if (layer - 1) % num_groups == g) + (num_layers,)
        for g in range(num_groups)
    ]


# ---------------------------------------------------------------------------------------------- classification exits


class LinearExit(nn.Module):
    """Per-layer pooler (owned by the encoder, from pre-training) -> dropout -> Linear(H, K)."""

    def __init__(self, config: ElasticBertConfig) -> None:
        super().__init__()
        p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = Dropout(p)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def forward(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor | None, pooler: ElasticBertPooler
    ) -> tuple[torch.Tensor, torch.Tensor]:
        representation = pooler(hidden)
        return representation, self.classifier(self.dropout(representation))


class MHAExit(nn.Module):
    """Linear(H, d_e) -> tanh -> multi-head attention over the sequence read at [CLS] -> tanh -> Linear(d_e, K).

    Only the [CLS] output is used, so only the [CLS] query is computed: same result as full self-attention read at
    [CLS], at a fraction of the cost.
    """

    def __init__(self, config: ElasticBertConfig) -> None:
        super().__init__()
        d = config.exit_mha_dim
        self.projection = nn.Linear(config.hidden_size, d)
        self.attention = nn.MultiheadAttention(
            d, config.exit_mha_heads, dropout=config.attention_probs_dropout_prob, batch_first=True
        )
        p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = Dropout(p)
        self.classifier = nn.Linear(d, config.num_labels)

    def forward(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor | None, pooler: ElasticBertPooler | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # nn.MultiheadAttention's maths with its own parameters (state dicts stay interchangeable), but one SDPA call
        # and the packed in-projection split into the [CLS] query and the keys/values: at batch 1 the module's
        # generic path costs more than the exit's arithmetic, and early exit lives on that overhead.
        attention = self.attention
        batch, length, _ = hidden.shape
        d, heads = attention.embed_dim, attention.num_heads
        x = torch.tanh(self.projection(hidden))
        weight, bias = attention.in_proj_weight, attention.in_proj_bias
        query = F.linear(x[:, :1], weight[:d], bias[:d]).view(batch, 1, heads, d // heads).transpose(1, 2)
        key_value = F.linear(x, weight[d:], bias[d:]).view(batch, length, 2, heads, d // heads)
        key, value = key_value.permute(2, 0, 3, 1, 4).unbind(0)
        mask = None if attention_mask is None else attention_mask[:, None, None, :].bool()
        dropout = attention.dropout if self.training else 0.0
        context = scaled_dot_product_attention(query, key, value, mask, dropout)
        representation = torch.tanh(attention.out_proj(context.reshape(batch, d)))
        return representation, self.classifier(self.dropout(representation))


EXIT_CLASSES = {"linear": LinearExit, "mha": MHAExit}


@dataclass
class MultiExitClassifierOutput(ModelOutput):
    """`logits` [B, K] are the deepest exit's that ran (what transformers' pipelines and `Trainer` read);
    `exit_logits`, `representations` h^e and `exit_losses` are every exit's, in `exit_layers` order. `loss` is the
    mean of `exit_losses`: each exit's CE / MSE / BCE (transformers' `problem_type` rule), averaged over the exits
    this forward ran.

    In early-exit mode (`config.early_exit`, see `ElasticBertForSequenceClassification.forward`) each sample's
    `logits` are those of the exit it left at, `sample_exit_layers` [B] says which (1-based layer), and every other
    field is None: samples leave at different exits, and a `pipeline` with `batch_size` > 1 splits each field of the
    output into samples (a per-exit tuple would be split by exit; `model.exit_layers` lists the exits)."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    exit_logits: tuple[torch.Tensor, ...] | None = None
    exit_losses: torch.Tensor | None = None
    representations: tuple[torch.Tensor, ...] | None = None
    exit_layers: tuple[int, ...] | None = None
    sample_exit_layers: torch.Tensor | None = None


class ElasticBertForSequenceClassification(ElasticBertPreTrainedModel):
    """Classifier exits at `config.exit_layers` (a single exit at layer l = static truncation to l layers).

    `num_labels == 1` is regression (MSE). The exit classifier's weight rows are the label embeddings used by ACL.
    """

    def __init__(self, config: ElasticBertConfig) -> None:
        super().__init__(config)
        self.elasticbert = ElasticBertModel(config)
        exit_class = EXIT_CLASSES[config.exit_type]
        self.exits = nn.ModuleDict({str(layer): exit_class(config) for layer in config.exit_layers})
        self.post_init()

    @property
    def exit_layers(self) -> tuple[int, ...]:
        return tuple(self.config.exit_layers)

    def classify(
        self, layer: int, hidden: torch.Tensor, attention_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(representation, logits) of exit `layer` (1-based) from that layer's hidden states."""
        return self.exits[str(layer)](hidden, attention_mask, self.elasticbert.encoder.pooler[layer - 1])

    def _early_exit_setting(
        self,
        early_exit: bool | None,
        exit_layers: Sequence[int] | None,
        labels: torch.Tensor | None,
        wants_hidden: bool,
    ) -> EarlyExitSetting | None:
        """The setting this forward exits early with, or None for the every-exit forward (see `forward`)."""
        configured = getattr(self.config, "early_exit", None)
        if early_exit is False or (early_exit is None and configured is None):
            return None
        blockers = [
            why
            for why, present in (
                ("the config has no early-exit setting (elasticbert.save_early_exit)", configured is None),
                ("the model is in training mode (model.eval() first)", self.training),
                ("labels were given (a loss needs every exit)", labels is not None),
                ("output_hidden_states needs every layer", wants_hidden),
            )
            if present
        ]
        if early_exit is None:
            return None if blockers or exit_layers is not None else EarlyExitSetting.from_dict(configured)
        if blockers:
            raise ValueError(f"{type(self).__name__}: early_exit=True, but " + "; ".join(blockers))
        return EarlyExitSetting.from_dict(configured, self.config.num_labels, "config.early_exit")

    def _note_precision(self, setting: EarlyExitSetting) -> None:
        """Say once when the saved threshold was chosen at another precision than this model runs at (e.g. an int8
        operating point on the fp32 model a pipeline loads): the exits taken then differ from the measured ones."""
        running = getattr(self, "inference_precision", "fp32")
        if setting.precision != running and not getattr(self, "_precision_noted", False):
            self._precision_noted = True
            warnings.warn(
                f"config.early_exit's threshold was chosen at {setting.precision}; this model runs at {running} "
                f"(elasticbert.for_inference(model, {setting.precision!r}) serves at the measured precision)",
                stacklevel=3,
            )

    def problem_type(self, labels: torch.Tensor) -> str:
        """transformers' rule: the config's `problem_type`, else regression for one label, single-label
        classification for integer labels, multi-label for float labels."""
        if self.config.problem_type is not None:
            return self.config.problem_type
        if self.config.num_labels == 1:
            return "regression"
        if labels.dtype in (torch.long, torch.int):
            return "single_label_classification"
        return "multi_label_classification"

    def exit_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits, problem = upcast(logits), self.problem_type(labels)
        if problem == "regression":
            if self.config.num_labels == 1:
                return F.mse_loss(logits.view(-1), labels.view(-1).to(logits.dtype))
            return F.mse_loss(logits, labels.to(logits.dtype))
        if problem == "single_label_classification":
            return F.cross_entropy(logits.view(-1, self.config.num_labels), labels.view(-1))
        return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        exit_layers: Sequence[int] | None = None,
        gradient_equilibrium: bool = False,
        position_ids: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        early_exit: bool | None = None,
    ) -> MultiExitClassifierOutput | tuple:
        """Every exit in `exit_layers` (default: all), or, in early-exit mode, each sample up to the exit its rule
        picks. `early_exit=None` (default): early exit when the config carries a setting (`config.early_exit`), the
        model is in eval mode and nothing asks for every exit (`exit_layers`, `labels`, `output_hidden_states`);
        `True`: early exit or an error saying why not; `False`: never."""
        wants_hidden = self._wants_hidden_states(output_hidden_states, output_attentions)
        setting = self._early_exit_setting(early_exit, exit_layers, labels, wants_hidden)
        if setting is not None:
            self._note_precision(setting)
            result = run_batch(
                self,
                input_ids,
                attention_mask,
                token_type_ids,
                rule_for(setting, self.config.num_labels),
                exit_layers,
                position_ids,
            )
            output = MultiExitClassifierOutput(  # batch-shaped fields only: pipelines split outputs into samples
                logits=result.logits.to(input_ids.device), sample_exit_layers=result.exit_layers.to(input_ids.device)
            )
            return self._tuple_unless_dict(output, return_dict)
        exits = tuple(exit_layers) if exit_layers is not None else self.exit_layers
        unknown = sorted(set(exits) - set(self.exit_layers))
        if unknown:
            raise ValueError(f"layers {unknown} have no exit; this model's exits are {list(self.exit_layers)}")
        encoded = self.elasticbert(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            exit_layers=exits,
            gradient_equilibrium=gradient_equilibrium,
            output_hidden_states=wants_hidden,
            return_dict=True,
        )
        reps, logits = zip(
            *(
                self.classify(layer, state, attention_mask)
                for layer, state in zip(encoded.exit_layers, encoded.exit_hidden_states)
            )
        )
        exit_losses = loss = None
        if labels is not None:
            exit_losses = torch.stack([self.exit_loss(lg, labels) for lg in logits])
            loss = exit_losses.mean()
        output = MultiExitClassifierOutput(
            loss=loss,
            logits=logits[-1],
            hidden_states=encoded.hidden_states,
            exit_logits=logits,
            exit_losses=exit_losses,
            representations=reps,
            exit_layers=encoded.exit_layers,
        )
        return self._tuple_unless_dict(output, return_dict)
