"""Where the data comes from (`--data-dir`), tokenising `Example`s, and batching them for training and inference.

Every tokenizer call passes explicit `max_length` / `truncation` / `padding`: the MiniLM package's tokenizer.json
carries truncation and padding to 128 built in, which would otherwise apply silently.

Tokenizers: the one saved with the model, whatever its kind (`load_tokenizer`): WordPiece (BERT, our exports, the
MiniLM package) through `BertTokenizer` - `AutoTokenizer` fails on a folder with only vocab.txt -, anything else
(RoBERTa's byte-level BPE: vocab.json + merges.txt, or a tokenizer.json with a BPE model) through `AutoTokenizer`.
A tokenizer meets a model only when it is the one the model was trained with (`paired_tokenizer`: identities from
`common.vocab`, recorded in the model's config.json).
Segment ids (token_type_ids) go to the model only when it has embeddings for a second segment (BERT: 2 types);
for a one-type model (RoBERTa) every position gets type 0.

Inference (evaluation, early exit, LTE features, embeddings) goes through one path: an `EncodedSplit` cut into
length-sorted batches (little padding), a forward mapped over them, and the outputs put back in dataset order
(`forward_in_order`).
"""

from __future__ import annotations

import dataclasses
import random
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, BertTokenizer, PreTrainedTokenizerBase

from common.hub import TOKENIZER_FILES, tokenizer_files_in
from common.io import read_object
from common.vocab import (
    TokenizerIdentity,
    TokenizerIdentityError,
    check_same_tokenizer,
    describe_unk,
    identity_of,
    model_identity,
    unk_fraction,
)

from .tasks import DataError, Example


def _read_json(path: Path) -> dict:
    """A small JSON file of a tokenizer/model directory ({} when absent); a broken one names the file."""
    return read_object(path, DataError, missing_ok=True)


def tokenizer_kind(directory: Path) -> str:
    """'wordpiece' (BertTokenizer) or 'auto' (AutoTokenizer), from what the directory's files say."""
    declared = str(_read_json(directory / "tokenizer_config.json").get("tokenizer_class") or "")
    if declared:
        return "wordpiece" if declared.removesuffix("Fast") in ("BertTokenizer", "ElasticBertTokenizer") else "auto"
    if (directory / "vocab.txt").is_file():
        return "wordpiece"
    if (directory / "merges.txt").is_file():
        return "auto"
    model = _read_json(directory / "tokenizer.json").get("model") or {}
    return "wordpiece" if model.get("type") == "WordPiece" else "auto"


def load_tokenizer(path: str | Path, type_vocab_size: int | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer saved with a model, whatever its kind (see the module docstring).

    `type_vocab_size` is the model's number of segment types (default: read from `path/config.json`); with one type,
    encoding passes no segment ids (`encode_examples` gives every position type 0).
    """
    directory = Path(path)
    if not directory.is_dir():
        raise DataError(f"{directory}: tokenizer directory does not exist")
    if not tokenizer_files_in(directory):
        raise DataError(f"{directory}: no tokenizer files ({', '.join(TOKENIZER_FILES)})")
    paired_tokenizer(directory)  # a model directory's own tokenizer files must be what its config.json records
    kind = tokenizer_kind(directory)
    try:
        loader = BertTokenizer if kind == "wordpiece" else AutoTokenizer
        tokenizer = loader.from_pretrained(str(directory))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DataError(f"{directory}: cannot load its tokenizer ({kind}: {err})") from None
    if type_vocab_size is None:
        type_vocab_size = _read_json(directory / "config.json").get("type_vocab_size")
    if type_vocab_size is not None and int(type_vocab_size) < 2:
        tokenizer.model_input_names = [n for n in tokenizer.model_input_names if n != "token_type_ids"]
    return tokenizer


def paired_tokenizer(
    tokenizer_dir: Path, model_dir: Path | None = None, vocab_size: int | None = None
) -> TokenizerIdentity | None:
    """The identity (`common.vocab`: vocabulary in id order, casing, special tokens) of the tokenizer in
    `tokenizer_dir`, once it is known to be the one the model was trained with: the identity the model's config.json
    records (pre-training and fine-tuning write it), else that of the tokenizer files beside its weights (a hub BERT,
    the MiniLM package). `model_dir` None: `tokenizer_dir` is the model's own directory. A same-size vocabulary with
    other ids, or a cased tokenizer on an uncased model, is refused (DataError naming both): its ids mean other words
    to the model, and neither its size nor the [UNK] rate tells. `vocab_size`: the model's embeddings (a larger
    tokenizer is refused as `check_vocabulary_fits` does)."""
    own = model_dir is None or Path(model_dir).resolve() == Path(tokenizer_dir).resolve()
    try:
        found = identity_of(tokenizer_dir)
        expected, where = model_identity(tokenizer_dir if model_dir is None else model_dir)
    except TokenizerIdentityError as err:
        raise DataError(str(err)) from None
    fix = (
        "Restore the tokenizer files saved with the model (its checksums.json names each changed file)"
        if own
        else "Use the model's own tokenizer (drop --tokenizer) or one with its vocabulary, casing and special tokens"
    )
    if found is not None and vocab_size is not None:
        check_vocabulary_size(found.vocab_size, vocab_size, tokenizer_dir)
    model = tokenizer_dir if model_dir is None else model_dir
    found_where = f"the tokenizer saved in {tokenizer_dir}" if own else f"the tokenizer {tokenizer_dir}"
    check_same_tokenizer(
        found, found_where, expected, f"the model {model} was trained with ({where} so)", fix, DataError
    )
    return found or expected


# `predict` judges a stream's [UNK] rate once this many tokens are in: one rare symbol in a short input is not a
# vocabulary that does not fit; training judges the first UNK_SAMPLE examples of its training set.
UNK_MIN_TOKENS = 2_000
UNK_SAMPLE = 2_000


def check_vocabulary_fits(tokenizer: PreTrainedTokenizerBase, vocab_size: int, source: object) -> None:
    """A tokenizer whose ids reach past the model's embedding table is another model's: refused before any text."""
    check_vocabulary_size(len(tokenizer), vocab_size, source)


def check_vocabulary_size(size: int, vocab_size: int, source: object) -> None:
    """`check_vocabulary_fits` for a tokenizer of `size` entries."""
    if size > vocab_size:
        raise DataError(
            f"the tokenizer {source} has {size:,} entries but the model embeds {vocab_size:,} tokens: its ids mean "
            "other words to this model (or none). Use the model's own tokenizer (drop --tokenizer) or one of its "
            "vocabulary"
        )


def text_id_table(tokenizer: PreTrainedTokenizerBase) -> np.ndarray:
    """bool per id: whether it is text (special tokens and padding are not; [UNK] is, it stands for text)."""
    table = np.ones(len(tokenizer), dtype=bool)
    table[sorted(set(tokenizer.all_special_ids) - {tokenizer.unk_token_id})] = False
    return table


def unk_counts(
    tokenizer: PreTrainedTokenizerBase, input_ids: torch.Tensor, is_text: np.ndarray | None = None
) -> tuple[int, int]:
    """([UNK] tokens, text tokens) of encoded rows (`is_text`: the tokenizer's `text_id_table`, when a caller
    counting many batches keeps it). Numpy lookups: a request is a few dozen ids, where a torch op costs more."""
    table = text_id_table(tokenizer) if is_text is None else is_text
    unk_id, ids = tokenizer.unk_token_id, input_ids.numpy()
    text = table[ids.clip(0, len(table) - 1)]
    return (int((ids == unk_id).sum()) if unk_id is not None else 0), int(text.sum())


def unk_refusal(unk: int, tokens: int, limit: float, what: str, source: object) -> DataError | None:
    """The error for text that is more [UNK] than `limit` (data_prep's guard, `common.vocab`), else None."""
    if unk_fraction(unk, tokens) <= limit:
        return None
    return DataError(
        f"{describe_unk(unk, tokens)} in {what} with the tokenizer {source}, above --max-unk-fraction {limit:g}: the "
        "vocabulary does not fit this text (another model's tokenizer, cased vs uncased, another language?). Use the "
        "model's own tokenizer, or accept it with --max-unk-fraction 1"
    )


def uses_token_types(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether segment ids are passed on to the model (see `load_tokenizer`)."""
    return "token_type_ids" in tokenizer.model_input_names


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
    encoder = _backend_encoder(tokenizer, max_length)
    out = _wrapper_encode(tokenizer, text_a, text_b, max_length) if encoder is None else encoder(text_a, text_b)
    if not uses_token_types(tokenizer):
        out["token_type_ids"] = torch.zeros_like(out["input_ids"])
    out["index"] = torch.tensor([e.index for e in examples], dtype=torch.long)
    labels = [e.label for e in examples]
    if all(label is not None for label in labels):
        dtype = torch.float32 if isinstance(labels[0], float) else torch.long
        out["labels"] = torch.tensor(labels, dtype=dtype)
    return out


def _wrapper_encode(
    tokenizer: PreTrainedTokenizerBase, text_a: list[str], text_b: list[str] | None, max_length: int
) -> dict[str, torch.Tensor]:
    """The `transformers` call: what `_BackendEncoder` equals (tests/finetune/test_tokenizers.py), and the route of a
    tokenizer without a Rust backend or a padding token."""
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
    ids = enc["input_ids"]
    types = enc["token_type_ids"] if "token_type_ids" in enc else torch.zeros_like(ids)
    return {"input_ids": ids, "attention_mask": enc["attention_mask"], "token_type_ids": types}


class _BackendEncoder:
    """The tokenizer's Rust backend (`tokenizers.Tokenizer`), cloned with this truncation and padding set once.

    Why: the `transformers` call re-checks and re-sets the backend's truncation and padding and builds a
    `BatchEncoding` on every call, ~0.3 ms per call on this machine, which a request of one input served by the
    early-exit engine in ~3 ms notices (bench/serving/serving.py); the backend itself tokenises a sentence in ~60 µs.
    Same ids, masks and segment ids as the call (tested on GLUE dev sets and on RoBERTa's byte-level BPE)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, max_length: int) -> None:
        from tokenizers import Tokenizer

        self.backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
        self.backend.enable_truncation(max_length, strategy="longest_first", direction=tokenizer.truncation_side)
        self.backend.enable_padding(
            direction=tokenizer.padding_side,
            pad_id=tokenizer.pad_token_id,
            pad_type_id=tokenizer.pad_token_type_id,
            pad_token=tokenizer.pad_token,
        )

    def __call__(self, text_a: list[str], text_b: list[str] | None) -> dict[str, torch.Tensor]:
        if len(text_a) == 1:  # a request of one input: `encode` runs on this thread (`encode_batch` wakes a pool)
            one = self.backend.encode(text_a[0], None if text_b is None else text_b[0])
            table = np.array([[one.ids], [one.attention_mask], [one.type_ids]], dtype=np.int64)  # one buffer
        else:
            encodings = self.backend.encode_batch(text_a if text_b is None else list(zip(text_a, text_b)))
            table = np.array(
                [[e.ids for e in encodings], [e.attention_mask for e in encodings], [e.type_ids for e in encodings]],
                dtype=np.int64,
            )
        ids, mask, types = torch.from_numpy(table)  # (rows, length) each, contiguous views of the one buffer
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


_ENCODERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> {(max_length, size): _BackendEncoder}


def _backend_encoder(tokenizer: PreTrainedTokenizerBase, max_length: int) -> _BackendEncoder | None:
    """The tokenizer's `_BackendEncoder` at `max_length` (made once per tokenizer and length), or None when it has
    no Rust backend or no padding token (then the `transformers` call runs, and says what is wrong). The answer is
    kept either way: `transformers` resolves `backend_tokenizer` and `pad_token_id` through `__getattr__`, which a
    request of one input notices."""
    key = (max_length, len(tokenizer))  # tokens added to the tokenizer since: a new clone
    try:
        per_length = _ENCODERS.setdefault(tokenizer, {})
    except TypeError:  # an object that cannot be weakly referenced: no cache
        per_length = {}
    if key not in per_length:
        usable = getattr(tokenizer, "backend_tokenizer", None) is not None and tokenizer.pad_token_id is not None
        per_length[key] = _BackendEncoder(tokenizer, max_length) if usable else None
    return per_length[key]


LENGTH_POOL = 50  # batches per rank that `group_by_length` sorts together (Hugging Face's "megabatch" of 50)


def iterate_batches(
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[Example],
    batch_size: int,
    max_length: int,
    shuffle: bool = False,
    seed: int = 0,
    drop_last: bool = False,
    shard: tuple[int, int] = (0, 1),
    start_batch: int = 0,
    group_by_length: bool = False,
) -> Iterator[dict[str, torch.Tensor]]:
    """Encoded batches in file order (evaluation) or a seeded shuffle (training); tokenised lazily, batch by batch.

    `shard=(r, R)` yields only batches r, r + R, ... (data parallelism: the same shuffle on every rank).
    `start_batch=k` starts at this rank's k-th batch without tokenising the ones before (a resumed epoch).
    `group_by_length`: batches of examples of similar length (`_length_grouped`), each padded to its longest.
    """
    order = list(range(len(examples)))
    if shuffle:
        random.Random(seed).shuffle(order)
    stop = len(order) - (len(order) % batch_size if drop_last else 0)
    if group_by_length:
        yield from _length_grouped(tokenizer, examples, order[:stop], batch_size, max_length, seed, shard, start_batch)
        return
    rank, world = shard
    for start in range((rank + start_batch * world) * batch_size, stop, batch_size * world):
        chunk = [examples[i] for i in order[start : start + batch_size]]
        if chunk:
            yield encode_examples(tokenizer, chunk, max_length)


def _length_grouped(
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[Example],
    order: list[int],
    batch_size: int,
    max_length: int,
    seed: int,
    shard: tuple[int, int],
    start_batch: int,
) -> Iterator[dict[str, torch.Tensor]]:
    """`iterate_batches` with little padding: the shuffled order is cut into pools of `LENGTH_POOL` batches per
    rank; each pool is tokenised once, sorted by length (longest first, ties in shuffled order), cut into batches,
    and the batches are shuffled (seeded by the seed and the pool), so that lengths do not run in order over an
    epoch. Batch j of a pool goes to rank j mod R, which gives every rank as many batches as without grouping (full
    pools: `LENGTH_POOL` each), so the resume arithmetic (`start_batch`) is unchanged: whole pools before it are
    skipped untokenised. The order is a pure function of (examples, seed, batch size, world size, tokenizer,
    max_length): a resumed run sees the batches an uninterrupted one would."""
    rank, world = shard
    pool = LENGTH_POOL * batch_size * world
    first_pool, skip = divmod(start_batch, LENGTH_POOL)
    left_padded = getattr(tokenizer, "padding_side", "right") == "left"
    for start in range(first_pool * pool, len(order), pool):
        encoded = encode_examples(tokenizer, [examples[i] for i in order[start : start + pool]], max_length)
        lengths = encoded["attention_mask"].sum(1)
        by_length = torch.argsort(lengths, descending=True, stable=True)
        batches = list(torch.split(by_length, batch_size))
        random.Random(f"{seed}/{start}").shuffle(batches)
        for rows in batches[rank::world][skip:]:
            longest = int(lengths[rows].max())
            cut = slice(-longest, None) if left_padded else slice(0, longest)
            yield {key: value[rows][:, cut] if value.dim() == 2 else value[rows] for key, value in encoded.items()}
        skip = 0


def subsample(examples: Sequence[Example], limit: int | None, seed: int = 0) -> list[Example]:
    """A seeded random subset of `limit` rows (all rows when `limit` is None or large enough): small CPU runs."""
    if limit is None or limit >= len(examples):
        return list(examples)
    rng = random.Random(seed)
    picked = sorted(rng.sample(range(len(examples)), limit))
    return [examples[i] for i in picked]


class Batch(NamedTuple):
    """One inference batch: its rows' positions in the split, and the tensors trimmed to its longest row."""

    rows: torch.Tensor
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor


@dataclass
class EncodedSplit:
    """A tokenised split held as padded tensors (right padding), plus real lengths, labels and submission ids."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor
    labels: torch.Tensor | None
    index: torch.Tensor
    lengths: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.lengths = self.attention_mask.sum(1)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @classmethod
    def from_examples(
        cls, tokenizer: PreTrainedTokenizerBase, examples: Sequence[Example], max_length: int, chunk: int = 4096
    ) -> EncodedSplit:
        """Tokenise `examples` (`chunk` at a time, so that a large test set never exists as Python lists at once),
        right-padded to the longest row."""
        starts = range(0, len(examples), chunk)
        parts = [encode_examples(tokenizer, examples[i : i + chunk], max_length) for i in starts]
        if not parts:
            raise ValueError("EncodedSplit: no examples")
        longest = max(part["input_ids"].shape[1] for part in parts)

        def stacked(key: str, pad: int = 0) -> torch.Tensor:
            if len(parts) == 1:  # one chunk (a request, a dev set): already padded to its longest
                return parts[0][key]
            return torch.cat([F.pad(part[key], (0, longest - part[key].shape[1]), value=pad) for part in parts])

        labels = torch.cat([part["labels"] for part in parts]) if all("labels" in part for part in parts) else None
        return cls(
            stacked("input_ids", tokenizer.pad_token_id),
            stacked("attention_mask"),
            stacked("token_type_ids", tokenizer.pad_token_type_id),
            labels,
            torch.cat([part["index"] for part in parts]),
        )

    def select(self, rows: torch.Tensor) -> EncodedSplit:
        """The rows `rows` (positions), in that order."""
        labels = self.labels[rows] if self.labels is not None else None
        return EncodedSplit(
            self.input_ids[rows], self.attention_mask[rows], self.token_type_ids[rows], labels, self.index[rows]
        )

    def batches(
        self, batch_size: int, sort_by_length: bool = True, device: torch.device | str | None = None
    ) -> list[Batch]:
        """The split in batches, each trimmed to its longest row. Length-sorted (longest first) unless told
        otherwise, so that batches carry little padding; `Batch.rows` (on the CPU) says where each row came from.
        `device`: where the batches' tensors go (the model's), once, so that repeated passes copy nothing."""
        if len(self) == 1:  # a request of one input: one batch, no order to find
            length, tensors = int(self.lengths[0]), (self.input_ids, self.attention_mask, self.token_type_ids)
            return [Batch(torch.zeros(1, dtype=torch.long), *(t[:, :length].to(device or "cpu") for t in tensors))]
        order = torch.argsort(self.lengths, descending=True, stable=True) if sort_by_length else torch.arange(len(self))
        out = []
        for start in range(0, len(self), batch_size):
            rows = order[start : start + batch_size]
            longest = int(self.lengths[rows].max())
            tensors = (self.input_ids, self.attention_mask, self.token_type_ids)
            out.append(Batch(rows, *(t[rows, :longest].contiguous().to(device or "cpu") for t in tensors)))
        return out


def forward_in_order(
    forward: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Any],
    batches: Sequence[Batch],
    progress: Callable[[int], None] | None = None,
) -> tuple[Any, float]:
    """`forward(input_ids, attention_mask, token_type_ids)` over `batches`; its outputs concatenated along dim 0 and
    put back in dataset order on the CPU, and the wall time (seconds) of the forward calls alone (batching is done
    before the clock starts, reordering after it stops). `progress(n)` is called after each batch of n rows.

    An output may be a tensor, or a tuple, dict or dataclass of them (a dataclass's other fields are taken from the
    first batch).
    """
    start = time.perf_counter()
    outputs = []
    for batch in batches:
        outputs.append(forward(batch.input_ids, batch.attention_mask, batch.token_type_ids))
        if progress is not None:
            progress(len(batch.rows))
    elapsed = time.perf_counter() - start
    return in_dataset_order(outputs, batches), elapsed


def in_dataset_order(outputs: Sequence[Any], batches: Sequence[Batch]) -> Any:
    """Per-batch outputs (one per batch of `batches`) concatenated and put back in dataset order, on the CPU."""
    if len(batches) == 1 and len(batches[0].rows) == 1:  # one input (a request served alone): in order already
        return _gather(outputs, None)
    return _gather(outputs, torch.argsort(torch.cat([batch.rows for batch in batches])))


def _gather(parts: Sequence[Any], order: torch.Tensor | None) -> Any:
    """Concatenate per-batch outputs of one structure (moved to the CPU) and index them by `order` (None: as is)."""
    first = parts[0]
    if isinstance(first, torch.Tensor):
        joined = first.cpu() if len(parts) == 1 else torch.cat([part.cpu() for part in parts])
        return joined if order is None else joined[order]
    if isinstance(first, dict):
        return {key: _gather([p[key] for p in parts], order) for key in first}
    if isinstance(first, tuple | list):
        return type(first)(_gather([p[i] for p in parts], order) for i in range(len(first)))
    if dataclasses.is_dataclass(first):
        values = {
            f.name: _gather([getattr(p, f.name) for p in parts], order)
            if isinstance(getattr(first, f.name), torch.Tensor)
            else getattr(first, f.name)
            for f in dataclasses.fields(first)
            if f.init
        }
        return type(first)(**values)
    raise TypeError(f"forward_in_order: cannot gather outputs of type {type(first).__name__}")
