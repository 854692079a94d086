"""Tokenising and batching `Example`s.

Every call passes explicit `max_length` / `truncation` / `padding`: the MiniLM package's tokenizer.json carries
truncation and padding to 128 built in, which would otherwise apply silently.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from transformers import BertTokenizer, PreTrainedTokenizerBase

from .tasks import DataError, Example


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer saved with a model (our exports, BERT checkpoints, the MiniLM package)."""
    directory = Path(path)
    if not (directory / "vocab.txt").is_file() and not (directory / "tokenizer.json").is_file():
        raise DataError(f"{directory}: no tokenizer files (vocab.txt or tokenizer.json)")
    return BertTokenizer.from_pretrained(str(directory))


def encode_examples(
    tokenizer: PreTrainedTokenizerBase, examples: Sequence[Example], max_length: int
) -> dict[str, torch.Tensor]:
    """Tokenise a batch (pairs as `[CLS] a [SEP] b [SEP]`), truncate to `max_length`, pad to the batch's longest.

    Returns input_ids, attention_mask, token_type_ids, index and, when every example has one, labels (long for
    classification, float for regression).
    """
    if not examples:
        raise ValueError("encode_examples: no examples")
    text_a = [e.text_a for e in examples]
    pairs = examples[0].text_b is not None
    text_b = [e.text_b or "" for e in examples] if pairs else None
    enc = tokenizer(
        text_a,
        text_b,
        max_length=max_length,
        truncation="longest_first",
        padding="longest",
        return_token_type_ids=True,
        return_attention_mask=True,
        return_tensors="pt",
    )
    out = {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    out["index"] = torch.tensor([e.index for e in examples], dtype=torch.long)
    labels = [e.label for e in examples]
    if all(label is not None for label in labels):
        dtype = torch.float32 if isinstance(labels[0], float) else torch.long
        out["labels"] = torch.tensor(labels, dtype=dtype)
    return out


def iterate_batches(
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[Example],
    batch_size: int,
    max_length: int,
    shuffle: bool = False,
    seed: int = 0,
    drop_last: bool = False,
    shard: tuple[int, int] = (0, 1),
) -> Iterator[dict[str, torch.Tensor]]:
    """Encoded batches in file order (evaluation) or a seeded shuffle (training); tokenised lazily, batch by batch.

    `shard=(r, R)` yields only batches r, r + R, ... (data parallelism: the same shuffle on every rank).
    """
    order = list(range(len(examples)))
    if shuffle:
        random.Random(seed).shuffle(order)
    stop = len(order) - (len(order) % batch_size if drop_last else 0)
    rank, world = shard
    for start in range(rank * batch_size, stop, batch_size * world):
        chunk = [examples[i] for i in order[start : start + batch_size]]
        if chunk:
            yield encode_examples(tokenizer, chunk, max_length)


def subsample(examples: Sequence[Example], limit: int | None, seed: int = 0) -> list[Example]:
    """A seeded random subset of `limit` rows (all rows when `limit` is None or large enough): small CPU runs."""
    if limit is None or limit >= len(examples):
        return list(examples)
    rng = random.Random(seed)
    picked = sorted(rng.sample(range(len(examples)), limit))
    return [examples[i] for i in picked]
