"""`PreparedCorpus`: documents and sentences of a prepared directory by index, through `numpy.memmap`.

Opening is cheap (the manifest plus one small header read and one stat per shard, no shard data read), and the
object pickles without its memmaps (they reopen lazily), so every rank and dataloader worker can hold one.
Full integrity checking (re-hashing) is `python -m data_prep verify`; what the reader catches cheaply: a missing,
truncated or foreign shard file (sizes, headers, the .bin hash recorded in the .idx), a manifest that is not one,
an index whose first/last entries do not span its .bin (checked when a shard is first opened), and a sentence or
document whose offsets point outside its .bin (checked on every access: two comparisons). Flipped bytes inside
token data are for `verify`.
"""

from __future__ import annotations

import os
import resource
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from common.integrity import sha256_bytes
from common.io import parse_object
from common.vocab import TokenizerIdentity, TokenizerIdentityError, identity_of

from .errors import DataPrepError
from .shard_format import DTYPES, FORMAT, open_bin, open_idx_arrays, read_idx_header


def open_shard_budget() -> int:
    """How many shards one reader keeps open (each holds two file descriptors: the .bin and .idx memmaps).

    A 160 GB corpus has ~2,300 shards; random access touches all of them, which would exceed the common default of
    1,024 open files. The soft limit is raised to the hard one once per process, and a reader keeps at most an
    eighth of it (its least recently used shards are closed beyond that; a slice already handed out stays valid).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    soft = hard if soft == resource.RLIM_INFINITY else soft
    return max(32, soft // 16)


class PreparedCorpus:
    """One split (`"train"` or `"valid"`) of a directory written by `data_prep tokenize`.

    Global indices run over the split's shards in order: sentence i, document d. A document's sentences are
    consecutive and live in one shard, so `doc_tokens(d)` is a single memmap slice.
    """

    def __init__(self, path: str | os.PathLike, split: str = "train") -> None:
        self.path = Path(path)
        self.split = split
        mpath = self.path / "manifest.json"
        if not self.path.is_dir():
            found = "is a file, not a folder" if self.path.exists() else "not found"
            raise DataPrepError(f"{self.path}: prepared corpus directory {found}")
        if not mpath.is_file():
            raise DataPrepError(f"{mpath}: missing (not a prepared corpus, or tokenize/finalize has not finished)")
        raw = mpath.read_bytes()
        self.manifest_hash: str = sha256_bytes(raw)
        manifest = parse_object(raw, str(mpath), DataPrepError, "a data_prep manifest (a JSON object)")
        if manifest.get("format") != FORMAT:
            raise DataPrepError(f"{mpath}: not a data_prep manifest (format={manifest.get('format')!r})")
        if split not in manifest.get("splits", {}):
            raise DataPrepError(f"{mpath}: no split {split!r} (has {', '.join(manifest.get('splits', {}))})")
        self.manifest: dict[str, Any] = manifest
        try:
            self._load(manifest, split)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            if isinstance(e, DataPrepError):
                raise
            raise DataPrepError(
                f"{mpath}: damaged manifest (missing or invalid entry: {e!r}); run `python -m data_prep verify "
                f"{self.path}` or prepare the corpus again"
            ) from None
        self._open: OrderedDict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = OrderedDict()
        self.max_open_shards = open_shard_budget()
        self._lengths: np.ndarray | None = None
        self._bounds: np.ndarray | None = None

    def _load(self, manifest: dict[str, Any], split: str) -> None:
        """The tokenizer facts and the shard table of `split` (a KeyError/TypeError: a damaged manifest)."""
        tok = manifest["tokenizer"]
        self.tokenizer_dir: Path = self.path / tok.get("dir", "tokenizer")
        self.vocab_size: int = int(tok["vocab_size"])
        self.special_ids: dict[str, int] = {
            **{k: int(v) for k, v in tok["special_ids"].items()},
            "vocab_size": self.vocab_size,
        }
        self.dtype = np.dtype(manifest["dtype"])
        shards = manifest["splits"][split]["shards"]
        self.shard_names: list[str] = [s["name"] for s in shards]
        self._docs = np.zeros(len(shards) + 1, dtype=np.int64)
        self._sents = np.zeros(len(shards) + 1, dtype=np.int64)
        self._toks = np.zeros(len(shards) + 1, dtype=np.int64)
        np.cumsum([s["docs"] for s in shards], out=self._docs[1:])
        np.cumsum([s["sentences"] for s in shards], out=self._sents[1:])
        np.cumsum([s["tokens"] for s in shards], out=self._toks[1:])
        self.num_docs = int(self._docs[-1])
        self.num_sentences = int(self._sents[-1])
        self.num_tokens = int(self._toks[-1])
        self._headers = [self._check_shard(s) for s in shards]

    def tokenizer_identity(self) -> TokenizerIdentity | None:
        """What the corpus's token ids mean (`common.vocab.TokenizerIdentity`): the identity its manifest recorded
        (computed from its tokenizer files for a manifest written before identities), once the tokenizer files beside
        it are checked to still be that tokenizer (refused: a vocab.txt, tokenizer.json or tokenizer_config.json
        replaced after tokenizing). None for a corpus with neither."""
        recorded = TokenizerIdentity.from_dict(self.manifest["tokenizer"].get("identity"))
        try:
            found = identity_of(self.tokenizer_dir) if self.tokenizer_dir.is_dir() else None
        except TokenizerIdentityError as err:
            raise DataPrepError(f"{err} (the tokenizer of the corpus {self.path})") from None
        if recorded is not None and found is not None and recorded.fingerprint != found.fingerprint:
            raise DataPrepError(
                f"{self.tokenizer_dir}: its files ({found.summary()}) are not the tokenizer "
                f"{self.path / 'manifest.json'} records ({recorded.summary()}): it was replaced after tokenizing. "
                "Restore it, or prepare the corpus again with the tokenizer you want"
            )
        return recorded or found

    # ------------------------------------------------------------------------------------------ internals

    def _stem(self, name: str) -> Path:
        return self.path / self.split / name

    def _check_shard(self, rec: dict[str, Any]) -> Any:
        """Cheap consistency checks: files present, header valid and agreeing with the manifest, .bin size."""
        stem = self._stem(rec["name"])
        idx = stem.with_suffix(".idx")
        if not idx.is_file():
            raise DataPrepError(f"{idx}: shard index missing")
        header = read_idx_header(idx)
        if DTYPES[header.itemsize] != self.dtype:
            raise DataPrepError(f"{idx}: token dtype {header.dtype} but the manifest says {self.dtype}")
        if (header.num_docs, header.num_sentences, header.num_tokens) != (rec["docs"], rec["sentences"], rec["tokens"]):
            raise DataPrepError(
                f"{idx}: header says {header.num_docs} docs / {header.num_sentences} sentences / {header.num_tokens} "
                f"tokens, manifest says {rec['docs']} / {rec['sentences']} / {rec['tokens']} "
                "(index from another shard?)"
            )
        if header.bin_sha256 != rec["bin_sha256"]:
            raise DataPrepError(f"{idx}: belongs to another .bin (its recorded .bin sha256 differs from the manifest)")
        b = stem.with_suffix(".bin")
        try:
            size = b.stat().st_size
        except OSError as e:
            raise DataPrepError(f"{b}: shard token file missing ({e.strerror or e})") from e
        if size != header.num_tokens * header.itemsize:
            raise DataPrepError(
                f"{b}: {size} bytes, expected {header.num_tokens * header.itemsize} ({header.num_tokens} tokens)"
                + (" - truncated" if size < header.num_tokens * header.itemsize else "")
            )
        return header

    def _shard(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        got = self._open.get(k)
        if got is not None:
            self._open.move_to_end(k)
        else:
            stem = self._stem(self.shard_names[k])
            header = self._headers[k]
            starts, lengths, bounds = open_idx_arrays(stem.with_suffix(".idx"), header)
            got = (open_bin(stem.with_suffix(".bin"), header), starts, lengths, bounds)
            s, t = header.num_sentences, header.num_tokens
            spans = s == 0 or (int(starts[0]) == 0 and int(starts[-1]) + int(lengths[-1]) == t)
            if not spans or int(bounds[0]) != 0 or int(bounds[-1]) != s:
                raise self._corrupt(k, "its first/last sentence or document entries do not span its .bin")
            self._open[k] = got
            while len(self._open) > self.max_open_shards:
                self._open.popitem(last=False)
        return got

    def _corrupt(self, k: int, what: str) -> DataPrepError:
        idx = self._stem(self.shard_names[k]).with_suffix(".idx")
        return DataPrepError(f"{idx}: corrupt index ({what}); run `python -m data_prep verify {self.path}`")

    def _slice(self, k: int, ids: np.ndarray, start: int, end: int, what: str) -> np.ndarray:
        """ids[start:end], refused when a corrupt index points outside the .bin (numpy would clip it silently)."""
        if not 0 <= start <= end <= len(ids):
            raise self._corrupt(k, f"{what} spans tokens {start}..{end} of {len(ids)}")
        return ids[start:end]

    def _locate(self, cum: np.ndarray, i: int, n: int, what: str) -> tuple[int, int]:
        if not 0 <= i < n:
            raise IndexError(f"{what} {i} out of range (0..{n - 1})")
        k = 0 if len(cum) == 2 else int(np.searchsorted(cum, i, side="right")) - 1
        return k, i - int(cum[k])

    # ---------------------------------------------------------------------------------------------- API

    @property
    def num_shards(self) -> int:
        return len(self.shard_names)

    def sentence(self, i: int) -> np.ndarray:
        """Token ids of global sentence `i`: a read-only memmap slice (no copy)."""
        k, j = self._locate(self._sents, int(i), self.num_sentences, "sentence")
        ids, starts, lengths, _ = self._shard(k)
        s = int(starts[j])
        return self._slice(k, ids, s, s + int(lengths[j]), f"sentence {i}")

    def doc_sentence_range(self, doc: int) -> tuple[int, int]:
        """Global sentence indices [start, end) of document `doc`."""
        k, j = self._locate(self._docs, int(doc), self.num_docs, "document")
        bounds = self._shard(k)[3]
        base = int(self._sents[k])
        return base + int(bounds[j]), base + int(bounds[j + 1])

    def doc_tokens(self, doc: int) -> np.ndarray:
        """All token ids of document `doc` (its sentences back to back): one memmap slice."""
        k, j = self._locate(self._docs, int(doc), self.num_docs, "document")
        ids, starts, lengths, bounds = self._shard(k)
        a, b = int(bounds[j]), int(bounds[j + 1])
        if not 0 <= a < b <= len(starts):
            raise self._corrupt(k, f"document {doc} spans sentences {a}..{b} of {len(starts)}")
        s = int(starts[a])
        e = int(starts[b - 1]) + int(lengths[b - 1])
        return self._slice(k, ids, s, e, f"document {doc}")

    def doc_sentences(self, doc: int) -> list[np.ndarray]:
        a, b = self.doc_sentence_range(doc)
        return [self.sentence(i) for i in range(a, b)]

    def shard_arrays(self) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
        """Per shard: (its first global document, its first global sentence, its sentence lengths, its document
        boundaries in local sentence indices), as memmaps opened one shard at a time and closed after — what a
        pass over the whole corpus (the sample index) reads without holding every shard's arrays at once."""
        for k in range(self.num_shards):
            keep = k in self._open
            _, _, lengths, bounds = self._shard(k)
            yield int(self._docs[k]), int(self._sents[k]), lengths, bounds
            if not keep:
                self._open.pop(k, None)

    @property
    def sentence_lengths(self) -> np.ndarray:
        """int32 length of every sentence, global order (the memmap itself for a single shard)."""
        if self._lengths is None:
            parts = [self._shard(k)[2] for k in range(self.num_shards)]
            if len(parts) == 1:
                self._lengths = parts[0]
            else:
                self._lengths = np.concatenate(parts) if parts else np.zeros(0, np.int32)
        return self._lengths

    @property
    def doc_boundaries(self) -> np.ndarray:
        """int64[num_docs + 1]: document d = global sentences [b[d], b[d+1])."""
        if self._bounds is None:
            out = np.zeros(self.num_docs + 1, dtype=np.int64)
            for k in range(self.num_shards):
                bounds = self._shard(k)[3]
                out[self._docs[k] : self._docs[k + 1]] = np.asarray(bounds[:-1]) + self._sents[k]
            out[-1] = self.num_sentences
            self._bounds = out
        return self._bounds

    def shard_of_sentence(self, i: int) -> int:
        return self._locate(self._sents, int(i), self.num_sentences, "sentence")[0]

    def __repr__(self) -> str:
        return (
            f"PreparedCorpus({str(self.path)!r}, split={self.split!r}: {self.num_docs} docs, "
            f"{self.num_sentences} sentences, {self.num_tokens} tokens in {self.num_shards} shards)"
        )

    # ---------------------------------------------------------------------------------------------- pickle

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_open"] = OrderedDict()
        state["_lengths"] = None
        state["_bounds"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
