"""ElasticBERT's classification exits and `ElasticBertForSequenceClassification` (every exit's logits, or early exit
per sample: `config.early_exit`, `elasticbert.early_exit`). Importable from `elasticbert.modeling` as well, the name
saved configs (`auto_map`) and the remote-code files use."""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig
from transformers.utils import ModelOutput

from .backbone import ElasticBertModel, ElasticBertPooler, ElasticBertPreTrainedModel, upcast
from .configuration import ElasticBertConfig
from .dropout import Dropout, scaled_dot_product_attention
from .early_exit import rule_for, run_batch
from .exit_setting import EarlyExitSetting
from .layouts import official_head_renames

HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "proxies", "token", "revision", "subfolder")


def official_key_mapping(path: str | os.PathLike, kwargs: dict) -> dict[str, str] | None:
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

    reads_official_heads = True

    def __init__(self, config: ElasticBertConfig) -> None:
        super().__init__(config)
        self.elasticbert = ElasticBertModel(config)
        exit_class = EXIT_CLASSES[config.exit_type]
        self.exits = nn.ModuleDict({str(layer): exit_class(config) for layer in config.exit_layers})
        self.post_init()

    @classmethod
    def _official_key_mapping(cls, path: str | os.PathLike, kwargs: dict) -> dict[str, str] | None:
        return official_key_mapping(path, kwargs)

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
        task = getattr(self.config, "finetuning_task", None)
        exits = len(self.config.exit_layers)
        return EarlyExitSetting.from_dict(configured, self.config.num_labels, "config.early_exit", exits, task)

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

    def _early_exit_forward(
        self,
        setting: EarlyExitSetting,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
        exit_layers: Sequence[int] | None,
        position_ids: torch.Tensor | None,
    ) -> MultiExitClassifierOutput:
        """Each sample up to the exit the rule of `setting` picks (`run_batch`)."""
        self._note_precision(setting)
        result = run_batch(
            self,
            input_ids,
            attention_mask,
            token_type_ids,
            rule_for(setting, self.config.num_labels, len(self.config.exit_layers)),
            exit_layers,
            position_ids,
        )
        return MultiExitClassifierOutput(  # batch-shaped fields only: pipelines split outputs into samples
            logits=result.logits.to(input_ids.device), sample_exit_layers=result.exit_layers.to(input_ids.device)
        )

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
            output = self._early_exit_forward(
                setting, input_ids, attention_mask, token_type_ids, exit_layers, position_ids
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
