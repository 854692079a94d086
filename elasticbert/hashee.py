"""HashEE (Sun et al., 2022): token-level early exit by hashing. Each vocabulary id is assigned a depth before training
(`hash_maps`); a token's state is computed by layers 1..depth only and carried, unchanged, through the layers above,
where the tokens still running keep attending to it. No exit heads, no thresholds: an input's cost is known from its
token ids.

Layer l, for one row with n real tokens of which r still run (depth >= l):
- queries, the attention output, both LayerNorms and the feed-forward block for the r running tokens only - they are
  gathered out of the batch (`index_put` back in), not masked, so the other n - r cost nothing there;
- keys and values from all n tokens, the exited ones at their frozen states (with this layer's projections);
- padding is masked out of the keys. The official code (txsun1997/HashEE, models/modeling_elasticbert_hashee.py)
  passes no padding mask, so its pads are attended to and a padded row's answer depends on its batch; ours equals
  the official code on the row alone (checked from outside, docs/hashee.md).
A layer where every real token runs is the ordinary dense layer; one where none runs is skipped. The classifier reads
the [CLS] state (special tokens run every layer in every map), so the usual exit at the top layer classifies.

Classes (registered with the Auto classes by `import elasticbert`, model_type `elasticbert-hashee`):
`ElasticBertHashEEConfig` (the config plus `token_exit`: how the map was built and its sha256), `ElasticBertHashEEModel`
(the encoder; the map is its `token_layers` buffer, saved with the weights and checked against the config on every
load) and `ElasticBertHashEEForSequenceClassification`, which is also the early-exit engine's `LayerRunner` for itself
(`step`), so `EarlyExitClassifier`, `predict` and `finetune evaluate` run it through their usual paths.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel

from common.integrity import discard_seal

from .backbone import ElasticBertModel, ElasticBertModelOutput, ElasticBertPreTrainedModel
from .configuration import ElasticBertConfig, validate_exit_layers
from .dropout import scaled_dot_product_attention
from .flops import token_exit_flops
from .gradient_equilibrium import equilibrium_weights, rescale_gradient
from .hash_maps import DRAWN, HASH_KINDS, MAP_DTYPE, Buckets, depth_histogram, map_digest, occurrence_depths
from .layer_runner import LayerRunner, StepCost, StepOutput, eager_step_cost
from .masks import attention_mask_for_sdpa
from .modeling_classification import EXIT_CLASSES, ElasticBertForSequenceClassification
from .verification import CheckpointError

HASHEE_MODEL_TYPE = "elasticbert-hashee"
TOKEN_EXIT_KEYS = ("hash", "buckets", "seed", "counted", "examples", "map_sha256", "depths")


def checked_token_exit(token_exit: dict | None, num_layers: int) -> dict | None:
    """`config.token_exit` as saved: how the map was built (`hash`, `buckets`, `seed`, `counted` splits, `examples`)
    and what it is (`map_sha256`, `depths`: ids per depth). A ValueError names the bad key."""
    if token_exit is None:
        return None
    if not isinstance(token_exit, dict):
        raise ValueError(f"token_exit must be a JSON object, got {type(token_exit).__name__}")
    unknown = sorted(set(token_exit) - set(TOKEN_EXIT_KEYS))
    if unknown:
        raise ValueError(f"token_exit: unknown keys {unknown} (expected some of {list(TOKEN_EXIT_KEYS)})")
    if token_exit.get("hash") not in HASH_KINDS:
        raise ValueError(f"token_exit.hash={token_exit.get('hash')!r}; expected one of {list(HASH_KINDS)}")
    Buckets(num_layers, int(token_exit.get("buckets", num_layers)))  # a ValueError when they do not fit the layers
    digest = token_exit.get("map_sha256")
    if not (isinstance(digest, str) and len(digest) == 64):
        raise ValueError("token_exit.map_sha256 must be the 64-hex-digit sha256 of the token map")
    return dict(token_exit)


class ElasticBertHashEEConfig(ElasticBertConfig):
    """`ElasticBertConfig` plus `token_exit` (see `checked_token_exit`; None: no map set yet, every token runs every
    layer). A HashEE model exits per token: a sentence-level `early_exit` setting is refused."""

    model_type = HASHEE_MODEL_TYPE
    token_level_exit = True  # what `elasticbert.flops.sample_flops` refuses (its FLOPs depend on the tokens)

    def __init__(self, token_exit: dict | None = None, **kwargs: Any) -> None:
        if kwargs.get("early_exit") is not None:
            raise ValueError(
                "early_exit: a HashEE model exits per token (its token map); a sentence-level early-exit setting "
                "does not apply to it"
            )
        super().__init__(**kwargs)
        self.token_exit = checked_token_exit(token_exit, self.num_hidden_layers)

    @classmethod
    def of(cls, config: ElasticBertConfig) -> ElasticBertHashEEConfig:
        """`config` as a HashEE config (a plain ElasticBERT or BERT-family config from `load_pretrained`)."""
        if isinstance(config, cls):
            return config
        fields = {k: v for k, v in config.to_dict().items() if k not in ("model_type", "transformers_version")}
        return cls(**fields)


class ElasticBertHashEEModel(ElasticBertModel):
    """The encoder with token-level exit (module docstring); `token_layers` [V] holds each id's depth."""

    config_class = ElasticBertHashEEConfig

    def __init__(self, config: ElasticBertConfig) -> None:
        config = ElasticBertHashEEConfig.of(config)
        super().__init__(config)
        top = torch.full((config.vocab_size,), config.num_hidden_layers, dtype=torch.int16)
        self.register_buffer("token_layers", top, persistent=True)

    # ------------------------------------------------------------------------------------------------ the map
    def set_token_map(self, depth: np.ndarray | torch.Tensor, **how: Any) -> None:
        """Install a map (`hash_maps`: one depth per vocabulary id, 1..L, or DRAWN) and record in the config how it
        was built (`how`: hash, buckets, seed, counted, examples) with its digest."""
        values = torch.as_tensor(np.asarray(depth, dtype=MAP_DTYPE))
        layers = self.config.num_hidden_layers
        if values.shape != self.token_layers.shape:
            raise ValueError(
                f"token map of shape {tuple(values.shape)}; the model's vocabulary is {self.config.vocab_size}"
            )
        if bool(((values < 1) & (values != DRAWN)).any() | (values > layers).any()):
            raise ValueError(f"token map values must be depths 1..{layers} (or {DRAWN}: drawn per occurrence)")
        self.token_layers.copy_(values.to(self.token_layers.device))
        info = {"buckets": layers, **how, "map_sha256": map_digest(values), "depths": depth_histogram(values)}
        self.config.token_exit = checked_token_exit(info, layers)

    def check_token_map(self, source: object) -> None:
        """Refuse (CheckpointError) a loaded map that is not the one its config records (missing from the weights,
        or changed): the model would exit other tokens than it was trained to."""
        info = self.config.token_exit
        if info is not None and map_digest(self.token_layers) != info["map_sha256"]:
            raise CheckpointError(
                f"{source}: the token map in the weights (elasticbert.token_layers) is not the one config.json's "
                "token_exit.map_sha256 records (missing or changed): this HashEE model cannot be used as saved"
            )

    def token_depths(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, token_layers: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[B, T] layers each token runs (0 at padding): the map's, or `token_layers` given per token (0..L)."""
        real = torch.ones_like(input_ids) if attention_mask is None else attention_mask.long()
        layers = self.config.num_hidden_layers
        if token_layers is not None:
            if token_layers.shape != input_ids.shape or bool((token_layers < 0).any() | (token_layers > layers).any()):
                raise ValueError(f"token_layers must be [B, T] like input_ids, each within 0..{layers}")
            return token_layers.long() * real
        depth = self.token_layers[input_ids].long()
        if bool((depth == DRAWN).any()):
            info = self.config.token_exit or {}
            buckets = Buckets(layers, int(info.get("buckets", layers)))
            drawn = occurrence_depths(input_ids, real, buckets, int(info.get("seed") or 0))
            depth = torch.where(depth == DRAWN, drawn, depth)
        return depth * real

    # --------------------------------------------------------------------------------------------- the layers
    def token_layer(
        self,
        index: int,
        hidden: torch.Tensor,
        depth: torch.Tensor,
        counts: Sequence[tuple[int, int]],
        key_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """Layer `index` (0-based) on the tokens of `hidden` [B, T, H] whose `depth` [B, T] exceeds it; the others
        are copied forward. `counts`: per row (tokens running at this layer, real tokens), known on the host, so the
        layer is skipped, dense or gathered without asking the device; `key_mask`: the SDPA padding mask or None."""
        width = max(running for running, _ in counts)
        if width == 0:
            return hidden
        if all(running == real for running, real in counts):  # every real token runs: the dense layer
            return self.encoder.run_layer(index, hidden, key_mask)
        layer = self.encoder.layer[index]
        running = depth > index
        if hidden.shape[0] == 1:  # one row: its running tokens by one index, no per-row bookkeeping
            cols = running[0].nonzero().squeeze(1)
            states = hidden.index_select(1, cols)
            query = layer.attention.self.query(states)
            attended = layer.attention.output(self._attend(layer, query, hidden, key_mask), states)
            return hidden.index_copy(1, cols, layer.output(layer.intermediate(attended), attended))
        rows, cols = running.nonzero(as_tuple=True)
        slot = running.long().cumsum(1)[rows, cols] - 1  # each running token's place among its row's running ones
        states = hidden[rows, cols]  # [N, H]: the running tokens, gathered (packed: no padding between rows)
        query = layer.attention.self.query(states)  # projected packed, then laid out by row for the attention
        queries = query.new_zeros(hidden.shape[0], width, query.shape[1]).index_put((rows, slot), query)
        context = self._attend(layer, queries, hidden, key_mask)[rows, slot]
        attended = layer.attention.output(context, states)
        return hidden.index_put((rows, cols), layer.output(layer.intermediate(attended), attended))

    def _attend(
        self, layer: torch.nn.Module, queries: torch.Tensor, hidden: torch.Tensor, key_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """The attention context [B, R, H] of `queries` [B, R, H] (the running tokens' projected queries) over every
        token of `hidden` [B, T, H] - the exited ones at their frozen states, through this layer's key and value
        projections."""
        attention = layer.attention.self
        batch, heads, head_dim = hidden.shape[0], attention.num_attention_heads, attention.attention_head_size

        def split(x: torch.Tensor) -> torch.Tensor:
            return x.view(batch, -1, heads, head_dim).transpose(1, 2)

        q, k, v = split(queries), split(attention.key(hidden)), split(attention.value(hidden))
        dropout = attention.dropout_prob if self.training else 0.0
        context = scaled_dot_product_attention(q, k, v, key_mask, dropout)
        return context.transpose(1, 2).reshape(batch, -1, hidden.shape[2])

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
        token_layers: torch.Tensor | None = None,
    ) -> ElasticBertModelOutput | tuple:
        """`ElasticBertModel.forward` with token-level exit: each exit's hidden states are those after its layer,
        with every token at its own latest state. `token_layers` [B, T] overrides the map per token (0..L).
        Packed rows (`sample_ids`) are not supported."""
        if sample_ids is not None:
            raise ValueError("ElasticBertHashEEModel: packed rows (sample_ids) are not supported")
        all_states = self._wants_hidden_states(output_hidden_states, output_attentions)
        num_layers = self.config.num_hidden_layers
        exits = validate_exit_layers(exit_layers or range(1, num_layers + 1), num_layers)
        weights = equilibrium_weights(exits) if gradient_equilibrium else {}
        depth = self.token_depths(input_ids, attention_mask, token_layers)
        plan = layer_counts(depth, attention_mask, num_layers)
        key_mask = attention_mask_for_sdpa(attention_mask)
        hidden = self.embeddings(input_ids, token_type_ids, position_ids)
        computed, outputs, pooled = [hidden], [], []
        for index in range(exits[-1]):
            hidden = self.token_layer(index, hidden, depth, plan[index], key_mask)
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

    def save_pretrained(self, save_directory: str | os.PathLike, *args: Any, **kwargs: Any) -> None:
        save_with_remote_code(self, save_directory, *args, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, *args: Any, **kwargs: Any) -> Any:
        loaded = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded
        model.check_token_map(pretrained_model_name_or_path)
        return loaded


class ElasticBertHashEEForSequenceClassification(ElasticBertForSequenceClassification, LayerRunner):
    """The classifier (its exit at the top layer reads [CLS]) over `ElasticBertHashEEModel`. It is its own
    `LayerRunner`: the early-exit engine (`predict`, `EarlyExitClassifier`, static rule) calls `step`, which runs the
    token-level layer and carries each token's depth as one extra channel of the hidden states between steps."""

    config_class = ElasticBertHashEEConfig
    reads_official_heads = False

    def __init__(self, config: ElasticBertConfig) -> None:
        config = ElasticBertHashEEConfig.of(config)
        ElasticBertPreTrainedModel.__init__(self, config)
        self.elasticbert = ElasticBertHashEEModel(config)
        exit_class = EXIT_CLASSES[config.exit_type]
        self.exits = torch.nn.ModuleDict({str(layer): exit_class(config) for layer in config.exit_layers})
        self.post_init()

    @property
    def step_cost(self) -> StepCost | None:
        return eager_step_cost(self.device)

    def step(self, index: int, inputs: Any, mask: torch.Tensor, padded: bool, with_exit: bool) -> StepOutput:
        """Layer `index` on the rows (`LayerRunner.step`); at index 0 the inputs are the token ids, after it the
        hidden states with the depth channel this method appends."""
        if index == 0:
            input_ids, token_type_ids, position_ids = inputs
            depth = self.elasticbert.token_depths(input_ids, mask)
            hidden = self.elasticbert.embeddings(input_ids, token_type_ids, position_ids)
        else:
            hidden, depth = inputs[..., :-1], inputs[..., -1].long()
        key_mask = mask[:, None, None, :].bool() if padded else None
        counts = zip((depth > index).sum(1).tolist(), mask.sum(1).tolist())
        hidden = self.elasticbert.token_layer(index, hidden, depth, list(counts), key_mask)
        carried = torch.cat([hidden, depth.unsqueeze(-1).to(hidden.dtype)], dim=-1)
        if not with_exit:
            return StepOutput(carried)
        representation, logits = self.classify(index + 1, hidden, mask if padded else None)
        return StepOutput(carried, representation, logits)

    def input_flops(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[float]:
        """FLOPs of each row (ELUE conventions, `flops.token_exit_flops`): known from its token ids alone."""
        depth = self.elasticbert.token_depths(input_ids, attention_mask)
        return sample_token_flops(self.config, depth, attention_mask)

    def save_pretrained(self, save_directory: str | os.PathLike, *args: Any, **kwargs: Any) -> None:
        save_with_remote_code(self, save_directory, *args, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, *args: Any, **kwargs: Any) -> Any:
        loaded = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded
        model.elasticbert.check_token_map(pretrained_model_name_or_path)
        return loaded


def layer_counts(
    depth: torch.Tensor, attention_mask: torch.Tensor | None, num_layers: int
) -> list[list[tuple[int, int]]]:
    """Per layer, per row: (tokens running, real tokens), read from the device once for the whole forward."""
    real = depth.shape[1] if attention_mask is None else None
    lengths = [real] * depth.shape[0] if real is not None else attention_mask.sum(1).tolist()
    running = running_per_layer(depth, num_layers).T.tolist()
    return [list(zip(layer, lengths)) for layer in running]


def running_per_layer(depth: torch.Tensor, num_layers: int) -> torch.Tensor:
    """[B, L] tokens computed at each layer, from [B, T] depths (0 at padding)."""
    layers = torch.arange(1, num_layers + 1, device=depth.device)
    return (depth.unsqueeze(-1) >= layers).sum(1)


def sample_token_flops(config: ElasticBertConfig, depth: torch.Tensor, attention_mask: torch.Tensor) -> list[float]:
    """Per-row FLOPs of token-level exit for [B, T] depths."""
    counts = running_per_layer(depth, config.num_hidden_layers).tolist()
    lengths = attention_mask.long().sum(1).tolist()
    return [token_exit_flops(config, n, running).total for n, running in zip(lengths, counts)]


def class_for(model_class: type[PreTrainedModel], model_type: str | None) -> type[PreTrainedModel]:
    """The class `load_pretrained` builds when asked for `model_class` on a checkpoint of `model_type`: a HashEE
    checkpoint loads as the HashEE classifier or encoder, anything else as asked."""
    if model_type != HASHEE_MODEL_TYPE:
        return model_class
    if issubclass(model_class, ElasticBertForSequenceClassification):
        return ElasticBertHashEEForSequenceClassification
    if issubclass(model_class, ElasticBertModel):
        return ElasticBertHashEEModel
    raise CheckpointError(f"a HashEE checkpoint loads as a classifier or an encoder, not as {model_class.__name__}")


def check_token_map(model: torch.nn.Module, source: object) -> None:
    """After loading: a HashEE model's map must be the one its config records (`check_token_map` of the encoder);
    other models pass."""
    encoder = getattr(model, "elasticbert", model)
    if isinstance(encoder, ElasticBertHashEEModel):
        encoder.check_token_map(source)


# ---------------------------------------------------------------------------------- plain transformers loading

AUTO_MAP = {
    "AutoConfig": "configuration_hashee.ElasticBertHashEEConfig",
    "AutoModel": "modeling_hashee.ElasticBertHashEEModel",
    "AutoModelForSequenceClassification": "modeling_hashee.ElasticBertHashEEForSequenceClassification",
}
REMOTE_FILES = {
    "configuration_hashee.py": '''"""HashEE's config for `trust_remote_code=True` loading: the class of the elasticbert
package."""

from elasticbert.hashee import ElasticBertHashEEConfig

__all__ = ["ElasticBertHashEEConfig"]
''',
    "modeling_hashee.py": '''"""HashEE's model classes for `trust_remote_code=True` loading: those of the elasticbert
package, whose `from_pretrained` verifies this directory's checksums.json and its token map first."""

from elasticbert.hashee import ElasticBertHashEEForSequenceClassification, ElasticBertHashEEModel

__all__ = ["ElasticBertHashEEForSequenceClassification", "ElasticBertHashEEModel"]
''',
}


def save_with_remote_code(model: PreTrainedModel, directory: str | os.PathLike, *args: Any, **kwargs: Any) -> None:
    """transformers' `save_pretrained`, with the HashEE classes in `auto_map` and their two files beside config.json
    (as `elasticbert.remote_code` does for the ElasticBERT classes)."""
    model.config.auto_map = dict(AUTO_MAP)
    discard_seal(directory)  # the files change: whoever writes the directory seals it again
    PreTrainedModel.save_pretrained(model, directory, *args, **kwargs)
    for name, text in REMOTE_FILES.items():
        (Path(directory) / name).write_text(text, encoding="utf-8")
