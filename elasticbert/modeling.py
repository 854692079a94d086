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

Where the code is: `backbone` (embeddings, layers, poolers, `ElasticBertPreTrainedModel`, `ElasticBertModel`), this
module (the pre-training heads, `ElasticBertForPreTraining`), `modeling_classification` (the exits,
`ElasticBertForSequenceClassification`). Every class is importable from here, the module saved configs (`auto_map`
through the remote-code files) and users name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN
from transformers.utils import ModelOutput

from .backbone import (
    ElasticBertAttention,
    ElasticBertEmbeddings,
    ElasticBertEncoder,
    ElasticBertIntermediate,
    ElasticBertLayer,
    ElasticBertModel,
    ElasticBertModelOutput,
    ElasticBertOutput,
    ElasticBertPooler,
    ElasticBertPreTrainedModel,
    ElasticBertSelfAttention,
    ElasticBertSelfOutput,
    upcast,
)
from .configuration import ElasticBertConfig
from .masked_lm import exits_masked_lm_loss
from .modeling_classification import (
    EXIT_CLASSES,
    ElasticBertForSequenceClassification,
    LinearExit,
    MHAExit,
    MultiExitClassifierOutput,
    exit_groups,
)

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

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, ElasticBertPreTrainingHeads):
            nn.init.zeros_(module.predictions.bias)

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

    def sop_logits(self, layer: int, state: torch.Tensor, cls_positions: torch.Tensor | None = None) -> torch.Tensor:
        """SOP logits of exit `layer` from each text's [CLS] state: each row's first token, or of packed rows the
        flattened token `cls_positions` (one per text, in the texts' order)."""
        if cls_positions is not None:
            state = state.reshape(-1, state.shape[-1])[cls_positions].unsqueeze(1)  # [S, 1, H]: the pooler reads [:, 0]
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
        sample_ids: torch.Tensor | None = None,
        cls_positions: torch.Tensor | None = None,
        mlm_positions: torch.Tensor | None = None,
    ) -> ElasticBertPreTrainingOutput | tuple:
        """Packed rows (several texts per row, `pretrain.collation.pack`): `sample_ids` [R, T] (1, 2, ... per text, 0 =
        padding; `ElasticBertModel`) and `cls_positions` [S] (each text's [CLS] as a flattened token index, in the
        order of `sop_labels`). MLM reads the masked tokens wherever they are; SOP reads each text's own [CLS].

        `mlm_positions` [M]: the masked tokens as flattened indices in ascending order, what
        `(mlm_labels != -100).nonzero()` gives, when the caller already knows them (the pre-training collator
        computes them on the host). Without it the model finds them with `nonzero`, whose output size the host must
        read from the device: one host sync per forward on a GPU."""
        mlm_labels, sop_labels = _pretraining_labels(mlm_labels, labels, sop_labels, sentence_order_label)
        if (sample_ids is None) != (cls_positions is None):
            raise ValueError(
                "ElasticBertForPreTraining: packed rows need both sample_ids and cls_positions (each text's [CLS]); "
                "pass neither for one text per row"
            )
        encoded = self.elasticbert(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            sample_ids=sample_ids,
            exit_layers=active_exits,
            gradient_equilibrium=gradient_equilibrium,
            output_hidden_states=self._wants_hidden_states(output_hidden_states, output_attentions),
            return_dict=True,
        )
        exits, states = encoded.exit_layers, encoded.exit_hidden_states
        if mlm_labels is None:
            output = ElasticBertPreTrainingOutput(
                prediction_logits=self.cls.predictions.logits(exits[-1], states[-1]),
                sop_logits=self.sop_logits(exits[-1], states[-1], cls_positions),
                hidden_states=encoded.hidden_states,
                exit_layers=exits,
            )
        else:
            output = self._losses(exits, states, mlm_labels, sop_labels, cls_positions, mlm_positions)
            output.hidden_states = encoded.hidden_states
        return self._tuple_unless_dict(output, return_dict)

    def _losses(
        self,
        exits: tuple[int, ...],
        states: tuple[torch.Tensor, ...],
        mlm_labels: torch.Tensor,
        sop_labels: torch.Tensor,
        cls_positions: torch.Tensor | None = None,
        mlm_positions: torch.Tensor | None = None,
    ) -> ElasticBertPreTrainingOutput:
        flat_labels = mlm_labels.reshape(-1)
        masked = mlm_positions if mlm_positions is not None else (flat_labels != -100).nonzero(as_tuple=True)[0]
        targets = flat_labels[masked]
        rows = self.masked_lm_rows(exits, states, masked)
        if masked.numel():
            heads = self.cls.predictions
            mlm_loss, mlm_accuracy = exits_masked_lm_loss(rows, heads.decoder.weight, heads.bias, targets, len(exits))
        else:  # keeps the graph connected so every rank's backward touches the same parameters
            logits = F.linear(rows, self.cls.predictions.decoder.weight, self.cls.predictions.bias)
            mlm_loss = logits.sum() * 0.0 + torch.zeros(len(exits), device=logits.device)
            mlm_accuracy = torch.zeros(len(exits), device=logits.device)

        sop_logits = torch.stack(  # [k, B, 2]: B texts
            [self.sop_logits(layer, state, cls_positions) for layer, state in zip(exits, states)]
        )
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
            # read here, not carried as an int across the graph break at the MLM loss (`torch.compiler.disable`):
            # compiled, that int would be a constant of the graph after the break, recompiled for each new count
            num_masked=int(masked.numel()),
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


__all__ = [  # every class of the model, here as before the encoder and the exits moved to their own modules
    "EXIT_CLASSES",
    "ElasticBertAttention",
    "ElasticBertEmbeddings",
    "ElasticBertEncoder",
    "ElasticBertForPreTraining",
    "ElasticBertForSequenceClassification",
    "ElasticBertIntermediate",
    "ElasticBertLMPredictions",
    "ElasticBertLayer",
    "ElasticBertModel",
    "ElasticBertModelOutput",
    "ElasticBertOutput",
    "ElasticBertPooler",
    "ElasticBertPreTrainedModel",
    "ElasticBertPreTrainingHeads",
    "ElasticBertPreTrainingOutput",
    "ElasticBertPredictionHeadTransform",
    "ElasticBertSelfAttention",
    "ElasticBertSelfOutput",
    "LinearExit",
    "MHAExit",
    "MultiExitClassifierOutput",
    "exit_groups",
    "upcast",
]
