"""The [UNK]-rate guard's threshold and wording, shared by every stage that tokenizes text: data_prep (tokenize,
finalize, stats), pretrain (a prepared corpus's manifest) and finetune (training data and `predict` inputs).

Why a guard on the [UNK] rate: a vocabulary that does not fit the text (a 3-word vocab, an uncased vocab with
lower-casing off, another script, a tokenizer of another model) still tokenizes "successfully", and training then
spends its compute on [UNK]s.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import UserError
from .integrity import sha256_bytes, sha256_file
from .io import read_object

# The [UNK] share of all tokens above which `tokenize` and `finalize` refuse a corpus (`--max-unk-fraction`),
# `pretrain` too (it reads `totals.unk_tokens` / `totals.tokens` of manifest.json), and `finetune train` / `predict`.
# Measured by bench/data/unk_rates.py on ../shared/data/corpus (104 English Gutenberg books = 15.6 M tokens, 1 Spanish
# book, WikiText-2 test), documents read as `tokenize` reads them; [UNK] share of all tokens (per-book range):
#   bert-base-uncased (matching)             0.0016 % Gutenberg (books 0-0.12 %), 0.011 % WikiText, 0 % Spanish
#   the same vocab with lower-casing off     8.9 % Gutenberg (books 2.7-55 %), 16 % WikiText
#   a Cyrillic-script WordPiece (30k)        71 % Gutenberg (books 52-80 %), 72 % WikiText
#   a 3-word vocab (the, of, and)            90 % Gutenberg (books 84-98 %), 88 % WikiText
# 1 % is 8x the worst single book of the matching vocab and below every single book of the wrong ones. What it does
# not catch is another language in the same script (a Spanish WordPiece on English: 1.7 %, books 0.15-8.5 %); what it
# does refuse is a weak self-trained vocab on text it never saw (a cased 30k WordPiece trained on 20 books: 0.06 % on
# Gutenberg, 2.1 % on WikiText's non-Latin characters): --max-unk-fraction accepts such a corpus knowingly.
DEFAULT_MAX_UNK_FRACTION = 0.01


def unk_fraction(unk: int, tokens: int) -> float:
    return unk / tokens if tokens else 0.0


def describe_unk(unk: int, tokens: int) -> str:
    """'0.0123 % [UNK] (12 of 97,561 tokens)'."""
    return f"{100 * unk_fraction(unk, tokens):.3g} % [UNK] ({unk:,} of {tokens:,} tokens)"


# ------------------------------------------------------------------------------------------------ tokenizer identity
#
# A tokenizer's identity is what decides which ids a text becomes: its vocabulary in id order, how text is normalised
# (lower-casing, accent stripping, ...), how it is pre-split, the model's own rules (WordPiece's prefix, BPE's merges,
# Unigram's scores) and which tokens play the special roles. Two tokenizers with the same identity turn every text into
# the same ids; a size and an [UNK] rate cannot tell a shuffled vocabulary or a cased tokenizer from the right one.
# `identity_of(directory)` computes it from whatever files the directory holds (tokenizer.json, vocab.txt with
# tokenizer_config.json, vocab.json + merges.txt, a sentencepiece .model), so the same tokenizer gives the same
# fingerprint in a data_prep directory, a model directory and the copy `transformers` saves of it. It is recorded where
# tokens are written or weights saved (data_prep manifests, pre-training checkpoints, model config.json:
# `tokenizer_identity`) and compared wherever they meet again (`check_same_tokenizer`).

IDENTITY_FORMAT = 1
IDENTITY_KEY = "tokenizer_identity"  # the field of a model's config.json (and of a data_prep manifest's tokenizer)
ROLES = ("unk", "cls", "sep", "pad", "mask")
DEFAULT_SPECIALS = {
    "WordPiece": {"unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "pad": "[PAD]", "mask": "[MASK]"},
    "BPE": {"unk": "<unk>", "cls": "<s>", "sep": "</s>", "pad": "<pad>", "mask": "<mask>"},
    "Unigram": {"unk": "<unk>", "cls": "<s>", "sep": "</s>", "pad": "<pad>", "mask": "<mask>"},
}


class TokenizerIdentityError(UserError):
    """A tokenizer that is not the one the data or the weights were made with, or a tokenizer directory whose files
    contradict each other (names both sides and, where there is one, the override)."""


@dataclass(frozen=True)
class TokenizerIdentity:
    """A tokenizer's fingerprint (sha256 of its canonical description) and what a message shows of it."""

    fingerprint: str
    kind: str  # WordPiece, BPE, Unigram or sentencepiece
    vocab_size: int
    lowercase: bool | None  # None: not known (sentencepiece: inside its normalisation rules)
    strip_accents: bool | None

    @property
    def short(self) -> str:
        return self.fingerprint[:12]

    def summary(self) -> str:
        """'WordPiece, 30,522 tokens, lower-cased, fingerprint 3f2a9c0b11de'."""
        casing = {True: ", lower-cased", False: ", cased", None: ""}[self.lowercase]
        if self.lowercase is not None and self.strip_accents is not None and self.strip_accents != self.lowercase:
            casing += ", accents stripped" if self.strip_accents else ", accents kept"
        return f"{self.kind}, {self.vocab_size:,} tokens{casing}, fingerprint {self.short}"

    def to_dict(self) -> dict[str, Any]:
        return {"format": IDENTITY_FORMAT, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, record: object) -> TokenizerIdentity | None:
        """The identity a file recorded; None when there is none (written before identities) or it is not one."""
        if not isinstance(record, dict) or not isinstance(record.get("fingerprint"), str):
            return None
        try:
            return cls(
                fingerprint=record["fingerprint"],
                kind=str(record.get("kind", "?")),
                vocab_size=int(record.get("vocab_size", 0)),
                lowercase=record.get("lowercase"),
                strip_accents=record.get("strip_accents"),
            )
        except (TypeError, ValueError):
            return None


def difference(a: TokenizerIdentity, b: TokenizerIdentity) -> str:
    """What tells two identities apart, in words ('lower-cased vs cased'; 'the same size, other tokens or ids')."""
    if a.kind != b.kind:
        return f"{a.kind} vs {b.kind}"
    if a.vocab_size != b.vocab_size:
        return f"{a.vocab_size:,} vs {b.vocab_size:,} tokens"
    if None not in (a.lowercase, b.lowercase) and a.lowercase != b.lowercase:
        return f"{'lower-cased' if a.lowercase else 'cased'} vs {'lower-cased' if b.lowercase else 'cased'}"
    if None not in (a.strip_accents, b.strip_accents) and a.strip_accents != b.strip_accents:
        return f"accents {'stripped' if a.strip_accents else 'kept'} vs {'stripped' if b.strip_accents else 'kept'}"
    return "the same size, but other tokens, ids or rules"


def check_same_tokenizer(
    found: TokenizerIdentity | None,
    found_where: str,
    expected: TokenizerIdentity | None,
    expected_where: str,
    fix: str,
    error: type[Exception] = TokenizerIdentityError,
) -> None:
    """Refuse (`error`, one message naming both sides, what differs and `fix`) when two identities differ; nothing
    to compare when either is unknown."""
    if found is None or expected is None or found.fingerprint == expected.fingerprint:
        return
    raise error(
        f"{found_where} is not the tokenizer {expected_where}: {difference(found, expected)}, so the same text "
        f"becomes other token ids [found: {found.summary()}; expected: {expected.summary()}]. {fix}"
    )


def identity_of(directory: str | os.PathLike) -> TokenizerIdentity | None:
    """The identity of the tokenizer whose files `directory` holds (None when it holds none): tokenizer.json (checked
    against a vocab.txt and a tokenizer_config.json beside it), else vocab.txt (+ tokenizer_config.json), else
    vocab.json + merges.txt, else one sentencepiece .model. A directory whose files contradict each other is refused
    (TokenizerIdentityError naming both files): `tokenizers` (data_prep) and `transformers` would read it apart."""
    directory = Path(directory)
    config = {**_json_file(directory / "special_tokens_map.json"), **_json_file(directory / "tokenizer_config.json")}
    if (directory / "tokenizer.json").is_file():
        return _from_tokenizer_json(directory, config)
    if (directory / "vocab.txt").is_file():
        tokens = _vocab_lines(directory / "vocab.txt")
        lowercase = config.get("do_lower_case", True)
        pre = _pre_tokenizer({"type": "BertPreTokenizer"})
        return _identity("WordPiece", tokens, _bert_normalizer(config, lowercase), {"pre": pre, "prefix": "##"}, config)
    if (directory / "vocab.json").is_file() and (directory / "merges.txt").is_file():
        return _bpe_files(directory, config)
    models = sorted(directory.glob("*.model")) if directory.is_dir() else []
    if len(models) == 1:
        return _sentencepiece(models[0])
    return None


# ------------------------------------------------------------------------------------------------------- internals


def _json_file(path: Path) -> dict[str, Any]:
    return read_object(path, TokenizerIdentityError, missing_ok=True)


def _vocab_lines(path: Path) -> list[str]:
    return [line.rstrip("\r") for line in read_vocab_lines(path)]


def read_vocab_lines(path: Path, error: type[Exception] = TokenizerIdentityError) -> list[str]:
    """The lines of a vocab.txt as written (a final newline ends the last line, not one more); an unreadable file is
    one `error` naming it."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise error(f"{path}: cannot read the vocabulary ({err})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _canonical_hash(description: dict[str, Any]) -> str:
    text = json.dumps(description, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return sha256_bytes(text.encode("utf-8"))


def _identity(
    kind: str, tokens: list[str], normalizer: dict[str, Any], rules: dict[str, Any], config: dict[str, Any]
) -> TokenizerIdentity:
    """The identity of a tokenizer described canonically: vocabulary in id order, normalisation, pre-splitting and
    model rules, the ids of the special roles."""
    ids = {token: i for i, token in enumerate(tokens)}
    declared = dict(DEFAULT_SPECIALS.get(kind, {}))
    declared.update({r: t for r in ROLES if (t := _token(config.get(f"{r}_token"))) is not None})
    specials = {role: ids[t] for role, t in declared.items() if t is not None and t in ids}
    description = {
        "format": IDENTITY_FORMAT,
        "kind": kind,
        "vocab": sha256_bytes(json.dumps(tokens, ensure_ascii=False).encode("utf-8")),
        "normalizer": normalizer,
        "rules": rules,
        "specials": specials,
    }
    return TokenizerIdentity(
        fingerprint=_canonical_hash(description),
        kind=kind,
        vocab_size=len(tokens),
        lowercase=normalizer.get("lowercase"),
        strip_accents=normalizer.get("strip_accents"),
    )


def _token(value: object) -> str | None:
    """A special token as tokenizer_config.json / special_tokens_map.json write it: a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _bert_normalizer(config: dict[str, Any], lowercase: object) -> dict[str, Any]:
    """BERT's normalisation as transformers builds it from tokenizer_config.json (strip_accents None: as lowercase)."""
    lowercase = bool(lowercase)
    strip = config.get("strip_accents")
    return {
        "lowercase": lowercase,
        "strip_accents": lowercase if strip is None else bool(strip),
        "clean_text": True,
        "chinese_chars": bool(config.get("tokenize_chinese_chars", True)),
        "unicode": [],
        "other": [],
    }


def _normalizer(spec: object) -> dict[str, Any]:
    """A tokenizer.json normaliser in canonical form (a Sequence flattened; BertNormalizer's strip_accents None
    resolved to its lowercase, as the library does)."""
    out: dict[str, Any] = {
        "lowercase": False,
        "strip_accents": False,
        "clean_text": False,
        "chinese_chars": False,
        "unicode": [],
        "other": [],
    }
    for step in _flatten(spec, "normalizers"):
        kind = step.get("type")
        if kind == "BertNormalizer":
            lowercase = bool(step.get("lowercase", True))
            strip = step.get("strip_accents")
            out["lowercase"] |= lowercase
            out["strip_accents"] |= lowercase if strip is None else bool(strip)
            out["clean_text"] |= bool(step.get("clean_text", True))
            out["chinese_chars"] |= bool(step.get("handle_chinese_chars", True))
        elif kind == "Lowercase":
            out["lowercase"] = True
        elif kind == "StripAccents":
            out["strip_accents"] = True
        elif kind in ("NFC", "NFD", "NFKC", "NFKD"):
            out["unicode"].append(kind)
        else:
            out["other"].append({k: v for k, v in sorted(step.items())})
    return out


def _flatten(spec: object, key: str) -> list[dict[str, Any]]:
    """The steps of a normaliser / pre-tokenizer (a Sequence's, in order; none for null)."""
    if not isinstance(spec, dict):
        return []
    if spec.get("type") == "Sequence":
        return [s for part in spec.get(key) or [] for s in _flatten(part, key)]
    return [spec]


def _pre_tokenizer(spec: object) -> list[dict[str, Any]]:
    """Pre-tokenizer steps with the options that change where text is split (ByteLevel's prefix space)."""
    steps = []
    for step in _flatten(spec, "pretokenizers"):
        kind = step.get("type")
        if kind == "ByteLevel":
            steps.append({"type": kind, "add_prefix_space": bool(step.get("add_prefix_space", True))})
        elif kind in ("BertPreTokenizer", "Whitespace", "WhitespaceSplit"):
            steps.append({"type": kind})
        else:
            steps.append({k: v for k, v in sorted(step.items())})
    return steps


def _from_tokenizer_json(directory: Path, config: dict[str, Any]) -> TokenizerIdentity:
    path = directory / "tokenizer.json"
    data = _json_file(path)
    model = data.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("type"), str):
        raise TokenizerIdentityError(f"{path}: not a tokenizers tokenizer.json (no model type)")
    kind = model["type"]
    tokens = _model_tokens(path, model, data.get("added_tokens"))
    normalizer = _normalizer(data.get("normalizer"))
    rules: dict[str, Any] = {"pre": _pre_tokenizer(data.get("pre_tokenizer"))}
    if kind == "WordPiece":
        _check_agrees_with_config(directory, config, normalizer)
        _check_agrees_with_vocab_txt(directory, tokens)
        rules["prefix"] = model.get("continuing_subword_prefix", "##")
    elif kind == "BPE":
        rules["merges"] = _digest([_merge(m) for m in model.get("merges") or []])
    elif kind == "Unigram":
        rules["scores"] = _digest([entry[1] for entry in model.get("vocab") or [] if isinstance(entry, list)])
    else:
        rules["model"] = _digest({k: v for k, v in model.items() if k != "vocab"})
    return _identity(kind, tokens, normalizer, rules, config)


def _digest(value: object) -> str:
    return sha256_bytes(json.dumps(value, ensure_ascii=False, sort_keys=True).encode("utf-8"))


def _merge(entry: object) -> str:
    """A BPE merge as 'a b' (tokenizer.json writes a pair or, before tokenizers 0.20, a string)."""
    return " ".join(entry) if isinstance(entry, list) else str(entry)


def _model_tokens(path: Path, model: dict[str, Any], added: object) -> list[str]:
    """The vocabulary in id order: the model's, with the added tokens at their ids; ids must run 0..n-1."""
    vocab = model.get("vocab")
    by_id: dict[int, str] = {}
    if isinstance(vocab, dict):
        by_id = {int(i): str(t) for t, i in vocab.items() if isinstance(i, int)}
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...]
        by_id = {i: str(e[0]) for i, e in enumerate(vocab) if isinstance(e, list) and e}
    for entry in added if isinstance(added, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("id"), int) and isinstance(entry.get("content"), str):
            by_id[entry["id"]] = entry["content"]
    if not by_id or sorted(by_id) != list(range(len(by_id))):
        raise TokenizerIdentityError(f"{path}: its vocabulary ids are not 0..n-1 without gaps (a damaged tokenizer)")
    return [by_id[i] for i in range(len(by_id))]


def _check_agrees_with_config(directory: Path, config: dict[str, Any], normalizer: dict[str, Any]) -> None:
    """transformers builds a BERT tokenizer's normalisation from tokenizer_config.json (`do_lower_case` True when it
    does not say), `tokenizers` (data_prep, `AutoTokenizer` without a tokenizer class) from tokenizer.json: a directory
    where they disagree tokenizes one way in one and another way in the other, so it has no one identity."""
    if normalizer["unicode"] or normalizer["other"]:
        return
    declared = config.get("do_lower_case")
    expected = _bert_normalizer(config, declared if isinstance(declared, bool) else True)
    for key, name in (("lowercase", "do_lower_case"), ("strip_accents", "strip_accents")):
        if expected[key] != normalizer[key]:
            said = f"says {expected[key]}" if name in config else f"does not say it ({name} {expected[key]} then)"
            raise TokenizerIdentityError(
                f"{directory}: tokenizer.json has {key} {normalizer[key]} but tokenizer_config.json {said}: "
                "transformers and data_prep would tokenize the same text differently. Restore the tokenizer files, "
                f"or save the tokenizer again (`save_pretrained`) so that both say the same"
            )


def _check_agrees_with_vocab_txt(directory: Path, tokens: list[str]) -> None:
    vocab_txt = directory / "vocab.txt"
    if vocab_txt.is_file() and _vocab_lines(vocab_txt) != tokens:
        raise TokenizerIdentityError(
            f"{vocab_txt}: holds another vocabulary than {directory / 'tokenizer.json'} beside it (replaced after the "
            "tokenizer was saved?): restore the tokenizer files"
        )


def _bpe_files(directory: Path, config: dict[str, Any]) -> TokenizerIdentity:
    """A byte-level BPE saved as vocab.json + merges.txt (RoBERTa), as transformers builds it."""
    vocab = _json_file(directory / "vocab.json")
    if not all(isinstance(i, int) for i in vocab.values()):
        raise TokenizerIdentityError(f"{directory / 'vocab.json'}: not a token -> id mapping")
    merges = [line for line in _vocab_lines(directory / "merges.txt") if line and not line.startswith("#version")]
    tokens = _model_tokens(directory / "vocab.json", {"vocab": vocab}, None)
    pre = _pre_tokenizer({"type": "ByteLevel", "add_prefix_space": bool(config.get("add_prefix_space", False))})
    return _identity("BPE", tokens, _normalizer(None), {"pre": pre, "merges": _digest(merges)}, config)


def _sentencepiece(path: Path) -> TokenizerIdentity:
    """A sentencepiece model: its pieces, and the file itself (scores and normalisation rules live in it)."""
    import sentencepiece as spm

    try:
        processor = spm.SentencePieceProcessor(model_file=str(path))
    except (RuntimeError, OSError) as err:
        raise TokenizerIdentityError(f"{path}: not a sentencepiece model ({err})") from None
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    rules = {"model_sha256": sha256_file(path)}
    normalizer = {"lowercase": None, "strip_accents": None}
    return _identity("sentencepiece", pieces, normalizer, rules, {})


def model_identity(directory: str | os.PathLike) -> tuple[TokenizerIdentity | None, str]:
    """The tokenizer a model directory's weights were trained with, and what says so: its config.json's
    `tokenizer_identity` (recorded by pre-training and fine-tuning), else the tokenizer files beside the weights (a
    hub BERT, the MiniLM package); (None, "") when it has neither."""
    directory = Path(directory)
    recorded = TokenizerIdentity.from_dict(_json_file(directory / "config.json").get(IDENTITY_KEY))
    if recorded is not None:
        return recorded, f"{directory / 'config.json'} records"
    found = identity_of(directory)
    return found, (f"the tokenizer files of {directory} say" if found is not None else "")
