"""HashEE's token -> layer maps (Sun et al., 2022): which layer each vocabulary id stops being computed after.

A map is an int array over the model's vocabulary: `depth[id]` = the number of layers a token of that id runs
(1..L; its state after layer `depth` is carried, frozen, through the layers above). The builders follow the official
HashEE code's `utils.py` (txsun1997/HashEE), not the paper's looser prose:

- buckets: `num_buckets` buckets, bucket b (0-based) runs 1 + b·s layers with s = L // num_buckets (the official
  `interval = (max_layer - 1) // num_buckets` with its `max_layer` = L + 1, bucket ids from 2 = one layer);
- `frequency` (the default): the ids of the counted sequences, special tokens left out, sorted by count (most frequent
  first; ties in order of first occurrence, as Python's stable sort leaves them), cut into buckets of
  `distinct ids // num_buckets` ids each, shallowest first; the official loop's last step can overshoot the top
  (bucket 14 of 13 at its defaults): such ids run every layer;
- `mi`: the same, sorted by mutual information with the label, estimated on the training set as the official code
  does (p(x, y) skips each id's first occurrence there; kept, so that our maps equal theirs);
- `random-consistent`: one seeded draw per vocabulary id (`numpy.random.RandomState(seed)`, in id order, special ids
  skipped), so every occurrence of an id exits at the same layer;
- `random-inconsistent`: one draw per occurrence: `official_inconsistent_depths` reproduces the official draw over a
  dataset (one `randint` per sequence, in order, special tokens included); the model draws from a hash of the
  occurrence instead (`occurrence_depths`, see there) and keeps special tokens at the top; its map holds
  `DRAWN` (-1) for every other id;
- `cluster`: k-means (k = num_buckets, k-means++, 40 starts, 300 iterations) over the word embeddings, the clusters
  ordered by the sum of their members' norms (smallest sum shallowest).

Special tokens ([CLS], [SEP], [PAD], [UNK], [MASK]) go to the top layer in every map, and so does every id the map's
counts never saw (the official code's rule for its test set). Where we depart from the official code, the caller
decides: `frequency` counts the training set only by default (the official code also counts the dev set; the
fine-tuning option `method.hash_count_dev` reproduces that).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

HASH_KINDS = ("frequency", "random-consistent", "random-inconsistent", "mi", "cluster")
MAP_DTYPE = np.int16  # depths are small; the map is saved as a buffer of this type
DRAWN = -1  # a map entry of the random-inconsistent map: the depth is drawn per occurrence (`occurrence_depths`)
# The official cluster hash's k-means settings (sklearn.cluster.KMeans).
KMEANS_STARTS, KMEANS_ITERATIONS = 40, 300


@dataclass(frozen=True)
class Buckets:
    """The layers a map can assign: bucket b runs `depth(b)` = 1 + b·step layers of `num_layers` (capped there)."""

    num_layers: int
    num_buckets: int

    def __post_init__(self) -> None:
        if self.num_layers < 1:
            raise ValueError(f"a token map needs at least one layer, got {self.num_layers}")
        if not 1 <= self.num_buckets <= self.num_layers:
            raise ValueError(
                f"num_buckets={self.num_buckets} must be within 1..{self.num_layers} (the layers): the official "
                "step (max_layer - 1) // num_buckets would be 0 and put every token at layer 1"
            )

    @property
    def step(self) -> int:
        return self.num_layers // self.num_buckets

    @property
    def last_step(self) -> int:
        """How often the official loop moves to the next bucket: while its bucket id (2 + k·step) is below
        max_layer = L + 1, so k stops at ceil((L - 1) / step)."""
        return math.ceil((self.num_layers - 1) / self.step)

    def depth(self, bucket: np.ndarray | int) -> np.ndarray:
        return np.minimum(1 + np.asarray(bucket) * self.step, self.num_layers)

    @property
    def depths(self) -> list[int]:
        """The distinct depths a random or cluster map assigns."""
        return sorted({int(self.depth(b)) for b in range(self.num_buckets)})


def top_map(vocab_size: int, num_layers: int) -> np.ndarray:
    """Every id to the top layer: the full model."""
    return np.full(vocab_size, num_layers, dtype=MAP_DTYPE)


def _with_specials(depth: np.ndarray, special_ids: Iterable[int], num_layers: int) -> np.ndarray:
    ids = [i for i in special_ids if 0 <= i < len(depth)]
    depth[ids] = num_layers
    return depth


def ranked_map(order: Sequence[int], vocab_size: int, buckets: Buckets, special_ids: Iterable[int]) -> np.ndarray:
    """Ids in `order` (best first) cut into buckets of len(order) // num_buckets ids, shallowest first, exactly as the
    official loop fills them (see the module docstring); ids not in `order` and special ids run every layer."""
    depth = top_map(vocab_size, buckets.num_layers)
    ranked = np.asarray(order, dtype=np.int64)
    if len(ranked):
        size = max(len(ranked) // buckets.num_buckets, 1)  # size 0: the official loop steps after every id
        bucket = np.minimum(np.arange(len(ranked)) // size, buckets.last_step)
        depth[ranked] = buckets.depth(bucket)
    return _with_specials(depth, special_ids, buckets.num_layers)


def _counted_ids(sequences: Iterable[Sequence[int]], special_ids: Iterable[int]) -> np.ndarray:
    """Every non-special id of the sequences, in order."""
    parts = [np.asarray(s, dtype=np.int64) for s in sequences]
    ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return ids[~np.isin(ids, np.asarray(list(special_ids), dtype=np.int64))]


def first_occurrence_order(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct ids in order of first occurrence, their counts): the iteration order of the official dicts."""
    unique, first, counts = np.unique(ids, return_index=True, return_counts=True)
    order = np.argsort(first, kind="stable")
    return unique[order], counts[order]


def frequency_map(
    sequences: Iterable[Sequence[int]], vocab_size: int, buckets: Buckets, special_ids: Iterable[int]
) -> np.ndarray:
    """The official `hash_tokens`: most frequent ids to the shallowest bucket (module docstring)."""
    special = list(special_ids)
    ids, counts = first_occurrence_order(_counted_ids(sequences, special))
    ranked = ids[np.argsort(-counts, kind="stable")]
    return ranked_map(ranked, vocab_size, buckets, special)


def mutual_information(
    sequences: Sequence[Sequence[int]], labels: Sequence[int], special_ids: Iterable[int]
) -> tuple[np.ndarray, list[float]]:
    """(distinct ids in order of first occurrence, each one's MI with the label) as the official `mi_hash_tokens`
    estimates it: p(x) and p(x, y) over token occurrences, p(y) over sequences, MI(x) = Σ_y p(x,y)·log(p(x,y) /
    (p(x)·p(y)) + 1e-6), where p(x, y) leaves out each id's first occurrence (the official code's counting)."""
    special = np.asarray(list(special_ids), dtype=np.int64)
    classes = sorted({int(y) for y in labels})
    column = {y: k for k, y in enumerate(classes)}
    ids = []
    owner = []
    for sequence, label in zip(sequences, labels):
        values = np.asarray(sequence, dtype=np.int64)
        values = values[~np.isin(values, special)]
        ids.append(values)
        owner.append(np.full(len(values), column[int(label)], dtype=np.int64))
    flat = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
    label_of = np.concatenate(owner) if owner else np.zeros(0, dtype=np.int64)
    distinct, counts = first_occurrence_order(flat)
    position = np.zeros(int(flat.max(initial=0)) + 1, dtype=np.int64)
    position[distinct] = np.arange(len(distinct))
    joint = np.zeros((len(distinct), len(classes)), dtype=np.int64)
    later = np.ones(len(flat), dtype=bool)
    _, first = np.unique(flat, return_index=True)
    later[first] = False  # the official code counts p(x, y) from each id's second occurrence on
    np.add.at(joint, (position[flat[later]], label_of[later]), 1)
    total_tokens = int(counts.sum())
    label_counts = np.bincount([column[int(y)] for y in labels], minlength=len(classes))
    p_y = [int(c) / len(labels) for c in label_counts]
    scores = []
    for k in range(len(distinct)):  # math.log, in the official order of operations: the same floats, the same ranks
        p_x = int(counts[k]) / total_tokens
        score = 0.0
        for y in range(len(classes)):
            p_xy = int(joint[k, y]) / total_tokens
            score += math.log(p_xy / (p_x * p_y[y]) + 1e-6) * p_xy
        scores.append(score)
    return distinct, scores


def mi_map(
    sequences: Sequence[Sequence[int]],
    labels: Sequence[int],
    vocab_size: int,
    buckets: Buckets,
    special_ids: Iterable[int],
) -> np.ndarray:
    """The official `mi_hash_tokens`: highest mutual information with the label to the shallowest bucket."""
    special = list(special_ids)
    distinct, scores = mutual_information(sequences, labels, special)
    ranked = [int(t) for t, _ in sorted(zip(distinct.tolist(), scores), key=lambda pair: pair[1], reverse=True)]
    return ranked_map(ranked, vocab_size, buckets, special)


def random_consistent_map(
    vocab_size: int, tokenizer_vocab_size: int, buckets: Buckets, special_ids: Iterable[int], seed: int
) -> np.ndarray:
    """The official `random_cons_hash_tokens`: one draw per id of the tokenizer's vocabulary, in id order, special
    ids skipped; ids beyond the tokenizer's vocabulary run every layer."""
    special = set(special_ids)
    drawn = [i for i in range(min(tokenizer_vocab_size, vocab_size)) if i not in special]
    depth = top_map(vocab_size, buckets.num_layers)
    depth[drawn] = buckets.depth(np.random.RandomState(seed).randint(0, buckets.num_buckets, size=len(drawn)))
    return _with_specials(depth, special, buckets.num_layers)


def random_inconsistent_map(vocab_size: int, num_layers: int, special_ids: Iterable[int]) -> np.ndarray:
    """Every id drawn per occurrence (`DRAWN`), special ids at the top."""
    return _with_specials(np.full(vocab_size, DRAWN, dtype=MAP_DTYPE), special_ids, num_layers)


def official_inconsistent_depths(sequences: Iterable[Sequence[int]], buckets: Buckets, seed: int) -> list[np.ndarray]:
    """The official `random_incons_hash_tokens` over a dataset: per sequence, in order, one `randint` of its length
    from `RandomState(seed)` (special tokens included, as it does). What the official training saw; the model's own
    draw is `occurrence_depths`."""
    rng = np.random.RandomState(seed)
    return [buckets.depth(rng.randint(0, buckets.num_buckets, size=len(s))) for s in sequences]


def cluster_map(
    embeddings: np.ndarray, buckets: Buckets, special_ids: Iterable[int], seed: int, starts: int = KMEANS_STARTS
) -> np.ndarray:
    """The official `cluster_hash_tokens`: k-means of the word embeddings (one row per vocabulary id), clusters
    ordered by the sum of their members' norms, the smallest sum shallowest."""
    from sklearn.cluster import KMeans  # only this map needs scikit-learn

    vectors = np.asarray(embeddings, dtype=np.float32)
    kmeans = KMeans(
        n_clusters=buckets.num_buckets,
        max_iter=KMEANS_ITERATIONS,
        n_init=starts,
        init="k-means++",
        random_state=np.random.RandomState(seed),
    )
    cluster = kmeans.fit_predict(vectors)
    norm_sums = np.bincount(cluster, weights=np.linalg.norm(vectors.astype(np.float64), axis=1))
    rank = np.empty(buckets.num_buckets, dtype=np.int64)
    rank[np.argsort(norm_sums, kind="stable")] = np.arange(buckets.num_buckets)
    depth = buckets.depth(rank[cluster]).astype(MAP_DTYPE)
    return _with_specials(depth, special_ids, buckets.num_layers)


def map_digest(depth: np.ndarray | torch.Tensor) -> str:
    """sha256 of a map (its int16 values, little-endian): what the saved config records and loading checks."""
    values = depth.detach().cpu().numpy() if isinstance(depth, torch.Tensor) else np.asarray(depth)
    return hashlib.sha256(values.astype("<i2").tobytes()).hexdigest()


def depth_histogram(depth: np.ndarray | torch.Tensor) -> dict[str, int]:
    """How many vocabulary ids run each number of layers (for the saved config; JSON keys are strings)."""
    values = depth.detach().cpu().numpy() if isinstance(depth, torch.Tensor) else np.asarray(depth)
    layers, counts = np.unique(values, return_counts=True)
    return {str(int(layer)): int(count) for layer, count in zip(layers, counts)}


# ------------------------------------------------------------------------------------- occurrence draws (the model)

_MIX = (0x7FEB352D, 0x68E31DA5, 0x2C1B3C6D)  # odd multipliers of the integer hash below
_MASK31 = 0x7FFFFFFF


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 31-bit integer hash (xor-shift-multiply rounds on int64; every product stays below 2^62)."""
    x = x & _MASK31
    for multiplier in _MIX:
        x = ((x ^ (x >> 15)) * multiplier) & _MASK31
    return x ^ (x >> 13)


def occurrence_depths(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, buckets: Buckets, seed: int
) -> torch.Tensor:
    """The random-inconsistent map as a model can apply it: each occurrence's bucket from a hash of (seed, the row's
    real tokens, the position, the id), so one id gets different layers at different occurrences while an input's
    draw is fixed (the same every epoch, alone or in any batch). [B, T] depths; padding gets 0."""
    real = attention_mask.long()
    ids = input_ids.long() * real
    positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    row = (_mix(ids * 31 + positions) * real).sum(1, keepdim=True)  # the row's fingerprint: its real tokens only
    drawn = _mix(_mix(row + seed) ^ _mix(positions * 7919 + ids)) % buckets.num_buckets
    depth = torch.clamp(1 + drawn * buckets.step, max=buckets.num_layers)
    return depth * real
