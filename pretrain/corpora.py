"""Opening the prepared corpora of a run config: data_prep's reader, its verification (once per corpus version), the
one-tokenizer check across a blend and against the checkpoint a run resumes from (tokenizer identities,
`common.vocab`), each corpus's fingerprint (`corpus_fingerprint`: what a checkpoint records of the data it trained on,
compared on resume by `pretrain.checkpoint.check_resume_data`), and the sample indexes (cached beside the data).

`train` calls `open_data` before any process group exists, so a bad corpus costs seconds; `build-index` calls it
offline (and imports no trainer) to verify, stamp and cache everything once after data_prep.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.io import atomic_write_text
from common.vocab import (
    DEFAULT_MAX_UNK_FRACTION,
    TokenizerIdentity,
    check_same_tokenizer,
    describe_unk,
    unk_fraction,
)
from data_prep.errors import DataPrepError
from data_prep.reader import PreparedCorpus
from data_prep.verify import verify_dir

from .checkpoint import check_resume_tokenizer
from .config import ConfigError, CorpusConfig, RunConfig, resolve_path
from .data import MaskingConfig, PretrainingDataset, load_or_build_index


@dataclass
class DataBundle:
    """The datasets of every corpus (in config order) and what they share."""

    train: list[PretrainingDataset] = field(default_factory=list)
    valid: list[PretrainingDataset] = field(default_factory=list)
    special_ids: dict = field(default_factory=dict)
    tokenizer_dir: Path | None = None
    tokenizer_identity: TokenizerIdentity | None = None  # what the token ids mean (common.vocab), corpus 0's
    tokenizer_where: str = ""  # which corpus that is, for messages
    index_paths: list[str] = field(default_factory=list)  # where each index lives: per corpus, train then valid
    fingerprints: list[dict] = field(default_factory=list)  # per corpus, in config order (`corpus_fingerprint`)
    notes: list[str] = field(default_factory=list)  # what a user should know before spending compute (printed)


def open_corpus(path: Path, split: str) -> PreparedCorpus:
    """data_prep's reader (its errors, DataPrepError, carry data_prep verify's messages)."""
    return PreparedCorpus(path, split=split)


def _verification_stamp(path: Path) -> str:
    """Name of the stamp of this exact corpus version: manifest hash + size and mtime of every file."""
    manifest = path / "manifest.json"
    files = sorted(
        p for p in path.rglob("*") if p.is_file() and "index_cache" not in p.parts and ".work" not in p.parts
    )
    key = hashlib.sha256(manifest.read_bytes() if manifest.is_file() else b"")
    for f in files:
        st = f.stat()
        key.update(f"{f.relative_to(path)}:{st.st_size}:{st.st_mtime_ns}".encode())
    return f"verified_{key.hexdigest()[:16]}.json"


def verify_corpus(path: Path, caches: list[Path]) -> None:
    """`data_prep verify` (every shard re-hashed) unless a stamp says this exact corpus already passed it.

    The stamp lives beside the sample index, so a corpus is re-hashed once per version, not at every restart; its
    problems are raised verbatim as DataPrepError.
    """
    name = _verification_stamp(path)
    if any((Path(c) / name).is_file() for c in caches):
        return
    problems = verify_dir(path)
    if problems:
        raise DataPrepError(f"{path} failed data_prep verify:\n" + "\n".join(f"  - {p}" for p in problems))
    for c in caches:
        try:
            Path(c).mkdir(parents=True, exist_ok=True)
            atomic_write_text(Path(c) / name, json.dumps({"verified": str(path), "time": time.time()}))
            return
        except OSError:
            continue


def corpus_fingerprint(corpus: PreparedCorpus, path: Path, k: int) -> dict[str, Any]:
    """What a checkpoint records of corpus k: the sha256 of its manifest (which records every shard's token count and
    its .bin's sha256, so it names the data) and the size of every shard file it lists (the reader checks them against
    the manifest; a stat each, cheap at 160 GB), joined into one short `fingerprint`. A corpus rebuilt in place with
    other text of the same vocabulary has another one, even where its shard sizes happen to agree."""
    sizes = []
    for split, entry in sorted(corpus.manifest.get("splits", {}).items()):
        for shard in entry.get("shards", []):
            for suffix in (".bin", ".idx"):
                name = f"{split}/{shard['name']}{suffix}"
                try:
                    sizes.append((name, (path / name).stat().st_size))
                except OSError:
                    sizes.append((name, -1))  # (a split the run does not open: its reader names missing files)
    digest = hashlib.sha256(corpus.manifest_hash.encode())
    for name, size in sizes:
        digest.update(f"\n{name}:{size}".encode())
    return {
        "corpus": k,
        "path": str(path),
        "fingerprint": digest.hexdigest()[:16],
        "manifest_sha256": corpus.manifest_hash,
        "shard_files": len(sizes),
        "bytes": sum(max(size, 0) for _, size in sizes),
    }


def tokenizer_dir_of(corpus: Any) -> Path | None:
    return Path(corpus.tokenizer_dir) if getattr(corpus, "tokenizer_dir", None) else None


def corpus_tokenizer(corpus: PreparedCorpus, path: Path, k: int, bundle: DataBundle) -> TokenizerIdentity | None:
    """The identity of corpus k's tokenizer (`PreparedCorpus.tokenizer_identity`: its manifest's record, its files
    checked against it); every corpus of a blend must have the first one's: the same ids must mean the same words."""
    identity = corpus.tokenizer_identity()
    if k == 0:
        bundle.special_ids, bundle.tokenizer_dir = dict(corpus.special_ids), tokenizer_dir_of(corpus)
        bundle.tokenizer_identity, bundle.tokenizer_where = identity, f"data.corpora[0] ({path})"
        return identity
    check_same_tokenizer(
        identity,
        f"the tokenizer of data.corpora[{k}] ({path})",
        bundle.tokenizer_identity,
        f"of {bundle.tokenizer_where}",
        "blended corpora must be prepared with the same tokenizer (data_prep tokenize --tokenizer)",
        error=ConfigError,
    )
    if identity is None and corpus.special_ids != bundle.special_ids:  # corpora without tokenizer files at all
        raise ConfigError(
            f"data.corpora[{k}] ({path}) has other special ids or vocabulary size than data.corpora[0]; blended "
            "corpora must be prepared with the same tokenizer"
        )
    return identity


def check_unk_fraction(corpus: PreparedCorpus, path: Path, k: int, limit: float, bundle: DataBundle) -> None:
    """Refuse a corpus whose manifest records too many [UNK] tokens (`totals.unk_tokens / totals.tokens`, above
    `data.max_unk_fraction`, default data_prep's DEFAULT_MAX_UNK_FRACTION): its vocabulary does not fit the text,
    and pre-training on it would mostly learn to predict [UNK]."""
    totals = corpus.manifest.get("totals", {})
    unk, tokens = totals.get("unk_tokens"), totals.get("tokens")
    if not isinstance(unk, int) or not isinstance(tokens, int):
        bundle.notes.append(
            f"{path / 'manifest.json'} records no totals.unk_tokens (prepared by an older data_prep): the [UNK] "
            f"share of data.corpora[{k}] is not checked; `python -m data_prep stats {path}` measures it"
        )
        return
    if unk_fraction(unk, tokens) > limit:
        raise ConfigError(
            f"data.corpora[{k}] ({path / 'manifest.json'}): {describe_unk(unk, tokens)}, above "
            f"data.max_unk_fraction={limit:g}: its vocabulary does not fit the text. Prepare it again with a "
            "matching vocabulary, or raise data.max_unk_fraction (1.0 never refuses)"
        )


def corpus_path(c: CorpusConfig, k: int) -> Path:
    path = resolve_path(c.path)
    if "$" in str(path):
        raise ConfigError(
            f"data.corpora[{k}].path={c.path!r}: environment variable not set "
            f"(export it, or --set data.corpora.{k}.path=DIR)"
        )
    return path


def index_caches(cfg: RunConfig, path: Path, run_dir: Path) -> list[Path]:
    """Where sample indexes (and verification stamps) are looked up and written, in order of preference."""
    if cfg.data.index_cache_dir:
        return [resolve_path(cfg.data.index_cache_dir)]
    return [path / "index_cache", run_dir / "index_cache"]


def _split_dataset(
    cfg: RunConfig, k: int, path: Path, corpus: PreparedCorpus, split: str, caches: list[Path], bundle: DataBundle
) -> PretrainingDataset:
    d = cfg.data
    index, where, _ = load_or_build_index(corpus, split, d.max_length, d.short_seq_prob, cfg.train.seed, caches)
    if len(index) == 0:
        raise ConfigError(
            f"data.corpora[{k}] ({path}, split {split}) yields no samples: documents need at "
            "least two sentences for sentence-order prediction"
        )
    bundle.index_paths.append(str(where) if where else f"(in memory) {path} {split}")
    masking = MaskingConfig(d.max_length, d.masked_lm_prob, d.max_ngram, cfg.train.seed)
    return PretrainingDataset(corpus, index, masking, corpus_id=k)


def open_data(cfg: RunConfig, run_dir: Path, need_valid: bool) -> DataBundle:
    """Open every corpus (train and, if evaluating, valid), check they share one tokenizer, load/build indexes."""
    bundle = DataBundle()
    limit = DEFAULT_MAX_UNK_FRACTION if cfg.data.max_unk_fraction is None else cfg.data.max_unk_fraction
    for k, c in enumerate(cfg.data.corpora):
        path = corpus_path(c, k)
        corpus = open_corpus(path, "train")
        check_unk_fraction(corpus, path, k, limit, bundle)
        caches = index_caches(cfg, path, run_dir)
        if cfg.data.verify:
            verify_corpus(path, caches)
        corpus_tokenizer(corpus, path, k, bundle)
        bundle.fingerprints.append(corpus_fingerprint(corpus, path, k))
        if k == 0:  # a resumed run continues on tokens that mean what they meant
            where = f"the tokenizer of {bundle.tokenizer_where}"
            check_resume_tokenizer(run_dir / "checkpoints", bundle.tokenizer_identity, where)
        bundle.train.append(_split_dataset(cfg, k, path, corpus, "train", caches, bundle))
        if need_valid:
            valid = open_corpus(path, "valid")
            bundle.valid.append(_split_dataset(cfg, k, path, valid, "valid", caches, bundle))
    return bundle
