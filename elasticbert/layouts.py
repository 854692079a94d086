"""Checkpoint layouts, as key names: the one place that knows how foreign weights map onto ours (and, for the
official ElasticBERT layout, back).

Used by both entry points, so they agree: `load_pretrained` applies these renames itself, and
`ElasticBertPreTrainedModel.from_pretrained` hands the official ElasticBERT ones to transformers' `key_mapping` hook.
`fnlp_export` writes the official layout with the inverse names (`official_head_names`, `official_pooler_layers`).

- Released ElasticBERT fine-tuned heads (fastnlp/ElasticBERT, `finetune-static/models/modeling_elasticbert.py` and
  `finetune-dynamic/models/modeling_elasticbert_entropy.py` / `..._patience.py`): a static model has one
  `classifier = nn.Linear(H, K)` on the last layer's pooler; a dynamic model has
  `classifiers = nn.ModuleList([nn.Linear(H, K)] * num_output_layers)`, `classifiers[i]` reading the pooler of layer
  `num_hidden_layers - num_output_layers + i` (0-based). Their poolers are `elasticbert.encoder.pooler.{j}.dense.*`,
  our names already; dropout has no weights. Both map onto our linear exits' `exits.{layer}.classifier.*`.
- BERT-family backbones (`FAMILIES`): the same post-LN layer under another prefix; what differs in maths (RoBERTa's
  position ids, one token type) is carried by the config, not by the weights.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from .configuration import PositionIdsStyle, official_exit_layers

ClassifierLayout = Literal["bert", "roberta", "none"]

OFFICIAL_PREFIX = "elasticbert."  # the official classes' base_model_prefix (their backbone keys are ours)
OFFICIAL_POSITION_IDS = "elasticbert.embeddings.position_ids"  # a persistent buffer there (0..P-1); none of ours
# The architecture fields of a BERT config.json, which the official ElasticBertConfig shares (its own fields added).
BERT_ARCHITECTURE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "initializer_range",
    "layer_norm_eps",
    "pad_token_id",
    "position_embedding_type",
)
BERT_CONFIG_FIELDS = (*BERT_ARCHITECTURE_FIELDS, "classifier_dropout", "problem_type")
# the official ElasticBertConfig's own fields (`configuration_elasticbert.py`)
OFFICIAL_CONFIG_FIELDS = (
    *BERT_ARCHITECTURE_FIELDS,
    "max_output_layers",
    "num_output_layers",
    "gradient_checkpointing",
    "use_cache",
)

BUFFER_SUFFIXES = ("position_ids", "token_type_ids")  # index buffers some checkpoints store; never weights
TIED_SUFFIXES = (
    "predictions.decoder.weight",
    "predictions.decoder.bias",
    "lm_head.decoder.weight",
    "lm_head.decoder.bias",
)


@dataclass(frozen=True)
class Family:
    """A BERT-family backbone whose embeddings and layers are BERT's under `prefix`."""

    prefix: str
    position_ids_style: PositionIdsStyle
    classifier: ClassifierLayout  # its sequence-classification head: BERT's pooler + linear, RoBERTa's, or none of ours


FAMILIES = {
    "bert": Family("bert.", "bert", classifier="bert"),
    "roberta": Family("roberta.", "roberta", classifier="roberta"),
    "xlm-roberta": Family("roberta.", "roberta", classifier="roberta"),
    "camembert": Family("roberta.", "roberta", classifier="roberta"),
    "electra": Family("electra.", "bert", classifier="none"),  # ELECTRA's head (dense, GELU, out_proj) is not ours
}


def official_head_renames(num_layers: int, num_output_layers: int | None) -> dict[str, str]:
    """Regex -> replacement turning the released ElasticBERT fine-tuned heads into our exits' names (the checkpoint's
    own `num_hidden_layers` / `num_output_layers` decide which layer each classifier belongs to)."""
    renames = {r"^classifier\.": f"exits.{num_layers}.classifier."}
    for index, layer in enumerate(official_exit_layers(num_layers, num_output_layers)):
        renames[rf"^classifiers\.{index}\."] = f"exits.{layer}.classifier."
    return renames


def official_head_names(num_layers: int, num_output_layers: int) -> dict[str, str]:
    """The inverse of `official_head_renames` (regex -> replacement, for `apply_renames`): our linear exits' names
    -> the official heads'. One output is the static class's `classifier`; more are the dynamic classes'
    `classifiers.{i}`, `i` counting from the first of the last `num_output_layers` layers."""
    layers = official_exit_layers(num_layers, num_output_layers)
    if len(layers) == 1:
        return {rf"^exits\.{layers[0]}\.classifier\.": "classifier."}
    return {rf"^exits\.{layer}\.classifier\.": f"classifiers.{index}." for index, layer in enumerate(layers)}


def official_pooler_layers(num_layers: int, num_output_layers: int) -> list[int]:
    """0-based layers whose pooler the official encoder builds: those of its outputs. Its `pooler` ModuleList holds
    None elsewhere, so a strict load there refuses any other pooler's weights."""
    return [layer - 1 for layer in official_exit_layers(num_layers, num_output_layers)]


def apply_renames(key: str, renames: dict[str, str]) -> str:
    for pattern, replacement in renames.items():
        renamed, count = re.subn(pattern, replacement, key, count=1)
        if count:
            return renamed
    return key


def is_encoder_key(key: str) -> bool:
    """Embeddings and transformer layers (prefix removed): the weights that must never be left random."""
    return key.startswith(("embeddings", "encoder.layer.")) and not key.endswith(BUFFER_SUFFIXES)


def looks_like_encoder_key(key: str) -> bool:
    """An encoder weight, possibly under a prefix this layout does not expect (`roberta.` keys in a "bert" config)."""
    return is_encoder_key(key) or is_encoder_key(key.split(".", 1)[-1])


def layer_index(key: str) -> int | None:
    match = re.match(r"encoder\.layer\.(\d+)\.", key)
    return int(match.group(1)) if match else None


def pooler_index(key: str) -> int | None:
    match = re.match(r"encoder\.pooler\.(\d+)\.", key)
    return int(match.group(1)) if match else None


def family_targets(key: str, family: Family, num_layers: int, checkpoint_layers: int) -> list[str]:
    """Our names for one key of a BERT-family checkpoint: relative to the base model for the backbone and its
    poolers, from the root (`cls.`, `exits.`) for heads. Empty: a buffer, a tied copy, or nothing of ours."""
    key = key.removeprefix(family.prefix)
    if key.endswith(BUFFER_SUFFIXES) or key.endswith(TIED_SUFFIXES):
        return []
    if is_encoder_key(key):
        index = layer_index(key)
        return [] if index is not None and index >= num_layers else [key]
    if key.startswith("pooler."):  # one pooler initialises every exit's pooler
        return [key.replace("pooler.", f"encoder.pooler.{i}.", 1) for i in range(num_layers)]
    if key.startswith("cls.predictions.transform."):
        rest = key.removeprefix("cls.predictions.transform.")
        return [f"cls.predictions.transform.{i}.{rest}" for i in range(num_layers)]
    if key.startswith("lm_head.dense.") or key.startswith("lm_head.layer_norm."):  # RoBERTa: dense -> GELU -> LN
        rest = key.removeprefix("lm_head.").replace("layer_norm.", "LayerNorm.", 1)
        return [f"cls.predictions.transform.{i}.{rest}" for i in range(num_layers)]
    if key in ("cls.predictions.bias", "lm_head.bias"):
        return ["cls.predictions.bias"]
    return _classifier_targets(key, family, checkpoint_layers)


def _classifier_targets(key: str, family: Family, checkpoint_layers: int) -> list[str]:
    """Sequence-classification heads whose maths at inference is our linear exit at the checkpoint's last layer:
    BERT's pooler -> dropout -> classifier; RoBERTa's dense -> tanh -> out_proj (its extra dropout before `dense`
    only acts in training)."""
    last = checkpoint_layers
    if family.classifier == "bert" and key.startswith("classifier."):
        return [key.replace("classifier.", f"exits.{last}.classifier.", 1)]
    if family.classifier == "roberta" and key.startswith("classifier.dense."):
        return [key.replace("classifier.dense.", f"encoder.pooler.{last - 1}.dense.", 1)]
    if family.classifier == "roberta" and key.startswith("classifier.out_proj."):
        return [key.replace("classifier.out_proj.", f"exits.{last}.classifier.", 1)]
    return []  # NSP (a different task from SOP), ELECTRA's discriminator head, anything unknown
