"""HashEE in fine-tuning: the token map built from the run's data, and a model's scores and FLOPs per sample.

`install_token_map` is the map's data stage (`build_model` calls it for `--method hashee`, before training): the
builders are `elasticbert.hash_maps`'; this module gives them the run's own examples, tokenised as training tokenises
them (the same training subset, `--max-length`), the tokenizer's special ids, and the model's word embeddings.
What the map counted and how it was made go into the model's config (`token_exit`), the map into its weights.

`score_split` runs a HashEE classifier over a split: its predictions (the model's forward, as `evaluate` runs it),
and per sample the tokens each layer computed and the FLOPs (`elasticbert.flops.token_exit_flops`), against the
same model computing every token at every layer. `elue_points` is the file `finetune elue-score --points` reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from common.errors import ConfigError
from elasticbert import ElasticBertHashEEForSequenceClassification
from elasticbert.flops import token_exit_flops
from elasticbert.hash_maps import (
    Buckets,
    cluster_map,
    frequency_map,
    mi_map,
    random_consistent_map,
    random_inconsistent_map,
)
from elasticbert.hashee import running_per_layer

from .config import FinetuneConfig
from .data import EncodedSplit, forward_in_order, subsample
from .tasks import Example, TaskSpec, load_split

DEFAULT_BUCKETS = 6  # the official train_token.py's --num_buckets


def buckets_for(cfg: FinetuneConfig, num_layers: int) -> Buckets:
    """The run's buckets: `method.hash_buckets`, else min(6, layers)."""
    return Buckets(num_layers, cfg.method.hash_buckets or min(DEFAULT_BUCKETS, num_layers))


def token_sequences(tokenizer: object, examples: Sequence[Example], max_length: int) -> list[np.ndarray]:
    """Each example's real token ids as training encodes them (special tokens included, cut at `max_length`)."""
    if not examples:
        return []
    split = EncodedSplit.from_examples(tokenizer, examples, max_length)
    ids, lengths = split.input_ids.numpy(), split.lengths.tolist()
    return [ids[row, :length] for row, length in enumerate(lengths)]


def counted_examples(cfg: FinetuneConfig, task: TaskSpec) -> tuple[list[Example], list[str]]:
    """The examples a counted map (frequency, mi) reads, and which splits they are: the run's training subset (the
    trainer's own: same data, limit and seed), plus its dev subset with `hash_count_dev`."""
    train = subsample(load_split(task, cfg.data.dir, "train"), cfg.data.max_train_examples, cfg.train.seed)
    if not cfg.method.hash_count_dev:
        return train, ["train"]
    dev = subsample(load_split(task, cfg.data.dir, "dev"), cfg.data.max_dev_examples, cfg.data.dev_subset_seed)
    return train + dev, ["train", "dev"]


def install_token_map(
    model: ElasticBertHashEEForSequenceClassification, cfg: FinetuneConfig, task: TaskSpec, tokenizer: object
) -> dict:
    """Build the run's map (`method.hash`) and install it in `model`; returns what its config now records."""
    encoder, config = model.elasticbert, model.config
    buckets = buckets_for(cfg, config.num_hidden_layers)
    kind, seed = cfg.method.hash, cfg.train.seed
    special = list(tokenizer.all_special_ids)
    how: dict = {"hash": kind, "buckets": buckets.num_buckets, "seed": None, "counted": [], "examples": 0}
    if kind in ("frequency", "mi"):
        examples, splits = counted_examples(cfg, task)
        sequences = token_sequences(tokenizer, examples, cfg.data.max_length)
        how.update(counted=splits, examples=len(examples))
        if kind == "frequency":
            depth = frequency_map(sequences, config.vocab_size, buckets, special)
        else:
            if task.is_regression:
                raise ConfigError(f"--hash mi needs class labels; task {task.name} is regression")
            depth = mi_map(sequences, [e.label for e in examples], config.vocab_size, buckets, special)
    elif kind == "random-consistent":
        depth = random_consistent_map(config.vocab_size, tokenizer.vocab_size, buckets, special, seed)
        how["seed"] = seed
    elif kind == "random-inconsistent":
        depth = random_inconsistent_map(config.vocab_size, config.num_hidden_layers, special)
        how["seed"] = seed
    else:
        weights = encoder.embeddings.word_embeddings.weight.detach().float().cpu().numpy()
        depth = cluster_map(weights, buckets, special, seed)
        how["seed"] = seed
    encoder.set_token_map(depth, **how)
    return dict(config.token_exit)


# ------------------------------------------------------------------------------------------------ scoring


@dataclass
class SplitScore:
    """A HashEE model over a split: logits [N, K], per sample its length, the tokens computed at each layer [N, L]
    and FLOPs, and the FLOPs of the same model computing every token at every layer."""

    logits: np.ndarray
    lengths: np.ndarray
    running: np.ndarray
    flops: np.ndarray
    full_flops: np.ndarray

    @property
    def token_layers_mean(self) -> float:
        """Mean number of layers a real token runs."""
        return float(self.running.sum() / self.lengths.sum())


@torch.inference_mode()
def score_split(
    model: ElasticBertHashEEForSequenceClassification,
    tokenizer: object,
    examples: Sequence[Example],
    batch_size: int = 64,
    max_length: int = 128,
) -> SplitScore:
    """Logits, tokens per layer and FLOPs of each example, in dataset order (length-sorted batches)."""
    model.eval()
    split = EncodedSplit.from_examples(tokenizer, examples, max_length)
    layers = model.config.num_hidden_layers

    def forward(ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = model(ids, mask, types).logits.float()
        depth = model.elasticbert.token_depths(ids, mask)
        return {"logits": logits, "running": running_per_layer(depth, layers)}

    out, _ = forward_in_order(forward, split.batches(batch_size, device=model.device))
    lengths = split.lengths.numpy()
    running = out["running"].numpy()
    flops = np.array([token_exit_flops(model.config, int(n), r).total for n, r in zip(lengths, running)])
    full = np.array([token_exit_flops(model.config, int(n), [int(n)] * layers).total for n in lengths])
    return SplitScore(out["logits"].numpy(), lengths, running, flops, full)


def elue_points(name: str, source: str, task: TaskSpec, flops: float, score: float) -> dict:
    """One operating point in the form `finetune elue-score --points` reads (`finetune.score.elue`)."""
    return {"name": name, "source": source, "tasks": {task.name: [{"flops": float(flops), "score": float(score)}]}}
