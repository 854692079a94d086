import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from data_prep.errors import DataPrepError
from data_prep.splitter import split_sentences
from data_prep.tokenizer import (
    META,
    Encoder,
    _cap_sentences,
    adopt_vocab,
    check_tokenizer_dir,
    load_meta,
    resolve_tokenizer,
    tokenizer_identity,
    train_tokenizer,
)


def _paragraphs(path: Path, limit: int) -> list[str]:
    raw = path.read_bytes()[:limit]
    return [d.decode("utf-8", "replace") for d in re.split(rb"\n(?:[ \t\r]*\n)+", raw) if d.strip()]


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory, vocab):
    return tmp_path_factory.mktemp("tok") / "tokenizer"


def test_adopted_vocab_matches_the_shipped_tokenizer(bert_dir, vocab, gutenberg):
    """Our tokenizer.json built from vocab.txt gives the ids of the package's own tokenizer.json (truncation off)."""
    from tokenizers import Tokenizer

    meta = adopt_vocab(vocab, bert_dir)
    assert meta["kind"] == "wordpiece" and meta["lowercase"] is True
    assert meta["vocab_size"] == 30522
    assert meta["special_ids"] == {"pad": 0, "unk": 100, "cls": 101, "sep": 102, "mask": 103}
    assert meta["dtype"] == "uint16"
    ref = Tokenizer.from_file(str(vocab.parent / "tokenizer.json"))
    ref.no_truncation()
    ref.no_padding()
    docs = _paragraphs(gutenberg / "11-0.txt", 60_000)
    ours = Encoder(bert_dir).tok
    a = [e.ids for e in ref.encode_batch(docs, add_special_tokens=False)]
    b = [e.ids for e in ours.encode_batch(docs, add_special_tokens=False)]
    assert a == b
    assert max(len(x) for x in a) > 128  # the shipped file would have truncated these without no_truncation()
    # idempotent; hashes recorded and checked
    assert adopt_vocab(vocab, bert_dir)["sha256"] == meta["sha256"]
    assert check_tokenizer_dir(bert_dir) == []
    assert set(meta["files"]) == {"vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}


def test_transformers_loads_it(bert_dir, vocab):
    from transformers import BertTokenizer

    adopt_vocab(vocab, bert_dir)
    tok = BertTokenizer.from_pretrained(str(bert_dir))
    ids = tok("Alice was beginning to get very tired.", add_special_tokens=True)["input_ids"]
    assert ids[0] == 101 and ids[-1] == 102 and 100 not in ids
    assert tok.mask_token_id == 103 and tok.pad_token_id == 0


def test_fast_path_sentence_cut_equals_per_sentence_encoding(bert_dir, vocab, gutenberg):
    """Mapping splitter offsets onto one whole-document encoding == encoding each sentence on its own."""
    adopt_vocab(vocab, bert_dir)
    enc = Encoder(bert_dir)
    docs = _paragraphs(gutenberg / "1952-0.txt", 40_000)
    docs.append("Zero\u200bwidth start.\u200b Next one. \ufeffBOM-led sentence here.")
    ids, lens, counts = enc.encode_docs(docs)
    expected_ids, expected_lens, expected_counts = [], [], []
    for d in docs:
        k = 0
        for a, b in split_sentences(d):
            e = enc.tok.encode(d[a:b], add_special_tokens=False).ids
            if e:
                expected_ids += e
                expected_lens.append(len(e))
                k += 1
        expected_counts.append(k)
    assert counts.tolist() == expected_counts
    assert lens.tolist() == expected_lens
    assert ids.tolist() == expected_ids
    assert ids.dtype == np.uint16 and sum(expected_counts) > 200


def test_special_token_text_is_not_a_special_token(bert_dir, vocab):
    adopt_vocab(vocab, bert_dir)
    ids, _, _ = Encoder(bert_dir).encode_docs(["A [SEP] in the text and a [MASK] too."])
    assert 102 not in ids.tolist() and 103 not in ids.tolist()


def test_missing_specials_are_appended(tmp_path):
    v = tmp_path / "vocab.txt"
    v.write_text("\n".join(["[PAD]", "[UNK]", "the", "cat", "##s", "sat", "."]) + "\n")
    meta = adopt_vocab(v, tmp_path / "tok")
    assert meta["special_ids"]["cls"] == 7 and meta["special_ids"]["mask"] == 9
    assert meta["special_ids"]["pad"] == 0 and meta["vocab_size"] == 10
    ids, lens, counts = Encoder(tmp_path / "tok").encode_docs(["The cats sat. The cat sat."])
    assert ids.tolist() == [2, 3, 4, 5, 6, 2, 3, 5, 6] and lens.tolist() == [5, 4] and counts.tolist() == [2]


def test_bad_vocab_files(tmp_path):
    (tmp_path / "dup.txt").write_text("a\nb\na\n")
    with pytest.raises(DataPrepError, match=r"dup\.txt: line 3: duplicate token 'a'"):
        adopt_vocab(tmp_path / "dup.txt", tmp_path / "t1")
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(DataPrepError, match=r"empty\.txt: empty vocab"):
        adopt_vocab(tmp_path / "empty.txt", tmp_path / "t2")
    with pytest.raises(DataPrepError, match="not a tokenizer"):
        resolve_tokenizer(tmp_path / "nope", tmp_path / "t3")


def test_other_vocab_into_the_same_dir_is_refused(tmp_path, vocab):
    adopt_vocab(vocab, tmp_path / "tok")
    v = tmp_path / "vocab.txt"
    v.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"]) + "\n")
    with pytest.raises(DataPrepError, match="different tokenizer"):
        adopt_vocab(v, tmp_path / "tok")
    assert load_meta(tmp_path / "tok")["vocab_size"] == 30522  # untouched


def test_tampered_tokenizer_file_is_detected(tmp_path, vocab):
    adopt_vocab(vocab, tmp_path / "tok")
    with open(tmp_path / "tok" / "vocab.txt", "a") as f:
        f.write("extra\n")
    problems = check_tokenizer_dir(tmp_path / "tok")
    assert len(problems) == 1 and "vocab.txt" in problems[0]


@pytest.mark.parametrize("kind", ["wordpiece", "unigram", "bpe"])
def test_train(tmp_path, gutenberg, kind):
    docs = _paragraphs(gutenberg / "11-0.txt", 170_000)
    meta = train_tokenizer(docs, tmp_path / "tok", kind=kind, vocab_size=2000, lowercase=True)
    assert meta["kind"] == kind
    assert 500 < meta["vocab_size"] <= 2100
    assert set(meta["special_ids"]) == {"pad", "unk", "cls", "sep", "mask"}
    assert len(set(meta["special_ids"].values())) == 5
    saved = json.loads((tmp_path / "tok" / META).read_text())
    assert saved["sha256"] == meta["sha256"] and check_tokenizer_dir(tmp_path / "tok") == []
    enc = Encoder(tmp_path / "tok")
    ids, lens, counts = enc.encode_docs(["Alice was beginning to get very tired. She peeped into the book.", ""])
    assert counts.tolist() == [2, 0] and len(lens) == 2 and int(lens.sum()) == len(ids)
    assert int(ids.max()) < meta["vocab_size"]
    unk = meta["special_ids"]["unk"]
    assert (ids == unk).mean() < 0.2
    if kind == "wordpiece":
        from transformers import BertTokenizer

        assert BertTokenizer.from_pretrained(str(tmp_path / "tok")).mask_token_id == meta["special_ids"]["mask"]


def test_train_on_nothing_is_an_error(tmp_path):
    with pytest.raises(DataPrepError, match="no text"):
        train_tokenizer([], tmp_path / "tok", kind="wordpiece", vocab_size=100)


def test_cap_sentences():
    lens = np.array([3, 10, 4], np.int32)
    counts = np.array([2, 0, 1])
    new_lens, new_counts = _cap_sentences(lens, counts, 4)
    assert new_lens.tolist() == [3, 4, 4, 2, 4] and new_counts.tolist() == [4, 0, 1]


def test_unknown_kind_names_the_choices(tmp_path):
    with pytest.raises(DataPrepError, match=r"tokenizer kind='unigam' \(did you mean 'unigram'\?\)"):
        train_tokenizer(["Some text."], tmp_path / "tok", kind="unigam")
    assert not (tmp_path / "tok").exists()


def test_missing_specials_are_appended_with_a_loud_warning(tmp_path, caplog, dp, gutenberg):
    v = tmp_path / "vocab.txt"
    v.write_text("\n".join(["[PAD]", "[UNK]", "the", "cat", "##s", "sat", "."]) + "\n")
    with caplog.at_level("WARNING", logger="data_prep"):
        adopt_vocab(v, tmp_path / "tok")
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning.startswith(f"{v}: WARNING: the vocab has no [CLS] [SEP] [MASK]: appended as ids 7-9")
    caplog.clear()
    with caplog.at_level("WARNING", logger="data_prep"):
        adopt_vocab(tmp_path / "tok" / "vocab.txt", tmp_path / "tok2")  # a complete vocab: silent
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    # the CLI shows it on stderr, naming the file
    r = dp.run_cli("train-tokenizer", "--output", str(tmp_path / "o"), "--vocab", str(v))
    assert r.returncode == 0 and f"{v}: WARNING: the vocab has no [CLS] [SEP] [MASK]" in r.stderr


@pytest.mark.parametrize(
    "lines, message",
    [
        (["[PAD]", "[UNK]", "the 12043", "of 9032"], r"line 3: 'the 12043' is not a WordPiece token"),
        (["[PAD]", "", "the"], r"line 2: '' is not a WordPiece token"),
        (["[PAD]", "[UNK]", "[CLS]", "[unused0]"], r"holds only special tokens \(4\): every word would be \[UNK\]"),
    ],
)
def test_vocab_files_that_cannot_be_a_vocab_are_refused(tmp_path, lines, message):
    v = tmp_path / "vocab.txt"
    v.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataPrepError, match=re.escape(str(v)) + ": " + message):
        adopt_vocab(v, tmp_path / "tok")
    assert not (tmp_path / "tok").exists()


def test_a_wordpiece_tokenizer_json_is_adopted_like_its_vocab(tmp_path, vocab):
    """A model folder's tokenizer.json (no vocab.txt) gives the very tokenizer its vocab.txt gives."""
    from data_prep.tokenizer import adopt_tokenizer_json

    folder = tmp_path / "model"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((vocab.parent / name).read_bytes())
    a = resolve_tokenizer(folder, tmp_path / "from_json")
    b = adopt_vocab(vocab, tmp_path / "from_vocab")
    assert a["sha256"] == b["sha256"] and a["lowercase"] is True and a["vocab_size"] == 30522
    bpe = json.loads((vocab.parent / "tokenizer.json").read_text())
    bpe["model"] = {"type": "BPE", "vocab": {"a": 0}, "merges": []}
    (tmp_path / "bpe.json").write_text(json.dumps(bpe))
    with pytest.raises(DataPrepError, match=r"bpe\.json: a BPE tokenizer; data_prep adopts WordPiece"):
        adopt_tokenizer_json(tmp_path / "bpe.json", tmp_path / "t")
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(DataPrepError, match=r"junk\.json:1:2: not valid JSON"):
        resolve_tokenizer(tmp_path / "junk.json", tmp_path / "t")


def test_tokenizer_sources_that_are_not_one(tmp_path):
    (tmp_path / "bad.model").write_bytes(b"\x00not a sentencepiece model" * 10)
    with pytest.raises(DataPrepError, match=r"bad\.model: not a sentencepiece model"):
        resolve_tokenizer(tmp_path / "bad.model", tmp_path / "t1")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "config.json").write_text("{}")
    with pytest.raises(DataPrepError, match=r"folder: not a tokenizer \(expected .*found: config\.json\)"):
        resolve_tokenizer(tmp_path / "folder", tmp_path / "t2")
    with pytest.raises(DataPrepError, match=r"missing\.txt: not a tokenizer: no such file or directory"):
        resolve_tokenizer(str(tmp_path / "missing.txt"), tmp_path / "t3")


def test_damaged_tokenizer_metadata_is_named(tmp_path, vocab):
    adopt_vocab(vocab, tmp_path / "tok")
    meta = json.loads((tmp_path / "tok" / META).read_text())
    del meta["files"]
    (tmp_path / "tok" / META).write_text(json.dumps(meta))
    with pytest.raises(DataPrepError, match=rf"{META}: damaged tokenizer metadata \(missing or invalid: files\)"):
        check_tokenizer_dir(tmp_path / "tok")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(vocab_size=5), r"--vocab-size must be in 6\.\."),
        (dict(vocab_size=1 << 32), r"--vocab-size must be in"),
        (dict(threads=0), r"--threads must be >= 1"),
    ],
)
def test_training_ranges(tmp_path, kwargs, message):
    with pytest.raises(DataPrepError, match=message):
        train_tokenizer(["Some text."], tmp_path / "tok", **kwargs)
    assert not (tmp_path / "tok").exists()


def test_tokenizer_by_hub_name_offline(tmp_path, dp, vocab, gutenberg):
    """`--tokenizer ORG/NAME` resolves through the standard Hugging Face cache (HF_HOME, offline): the very tokenizer
    the local files give; a name that is not cached is a one-line error saying how to get it."""
    from hub_cache import add_to_hub_cache

    files = ["vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json"]
    add_to_hub_cache(
        tmp_path / "hf" / "hub",
        "sentence-transformers/all-MiniLM-L6-v2",
        {name: (vocab.parent / name).read_bytes() for name in files},
    )
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": ""}
    book = str(gutenberg / "1952-0.txt")
    r = dp.run_cli(
        "tokenize",
        book,
        "--output",
        str(tmp_path / "hub"),
        "--tokenizer",
        "sentence-transformers/all-MiniLM-L6-v2",
        "--no-progress",
        env=env,
    )
    assert r.returncode == 0, r.stderr
    local = dp.run_cli(
        "tokenize", book, "--output", str(tmp_path / "local"), "--tokenizer", str(vocab), "--no-progress"
    )
    assert local.returncode == 0, local.stderr
    assert dp.manifest_bytes(tmp_path / "hub") == dp.manifest_bytes(tmp_path / "local")
    r = dp.run_cli("tokenize", book, "--output", str(tmp_path / "x"), "--tokenizer", "nobody/no-such-model", env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "--tokenizer nobody/no-such-model: not a local directory and not in the Hugging Face cache" in r.stderr
    assert "offline mode is on" in r.stderr


# ------------------------------------------------------------------------------------------------ tokenizer identity


def _permuted(vocab: Path, directory: Path) -> Path:
    """The same tokens at other ids (specials kept in place): a vocabulary of the same size that fits the same text."""
    tokens = vocab.read_text(encoding="utf-8").split("\n")[:-1]
    head, rest = tokens[:1000], tokens[1000:]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("\n".join(head + rest[::-1]) + "\n", encoding="utf-8")
    return directory / "vocab.txt"


def test_a_tokenizer_has_one_identity_whatever_files_hold_it(tmp_path, vocab):
    """The MiniLM package's tokenizer.json + vocab.txt, a bare vocab.txt, data_prep's install of it and the copy
    transformers saves of each have one fingerprint, recorded in data_prep_tokenizer.json; the same tokens at other
    ids, lower-casing off, accents kept, or another special token each give another one."""
    from transformers import BertTokenizer

    from common.vocab import identity_of

    shipped = identity_of(vocab.parent)
    meta = adopt_vocab(vocab, tmp_path / "dp")
    assert meta["identity"]["fingerprint"] == shipped.fingerprint == identity_of(tmp_path / "dp").fingerprint
    assert shipped.summary().startswith("WordPiece, 30,522 tokens, lower-cased, fingerprint ")
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "vocab.txt").write_bytes(vocab.read_bytes())
    assert identity_of(tmp_path / "bare") == shipped
    for source in (vocab.parent, tmp_path / "dp", tmp_path / "bare"):
        BertTokenizer.from_pretrained(str(source)).save_pretrained(tmp_path / "saved" / source.name)
        assert identity_of(tmp_path / "saved" / source.name) == shipped, source

    others = {
        "permuted": adopt_vocab(_permuted(vocab, tmp_path / "p"), tmp_path / "permuted"),
        "cased": adopt_vocab(vocab, tmp_path / "cased", lowercase=False),
    }
    fingerprints = {name: meta["identity"]["fingerprint"] for name, meta in others.items()}
    (tmp_path / "accents").mkdir()
    (tmp_path / "accents" / "vocab.txt").write_bytes(vocab.read_bytes())
    (tmp_path / "accents" / "tokenizer_config.json").write_text(json.dumps({"strip_accents": False}))
    fingerprints["accents"] = identity_of(tmp_path / "accents").fingerprint
    (tmp_path / "special").mkdir()
    (tmp_path / "special" / "vocab.txt").write_bytes(vocab.read_bytes())
    (tmp_path / "special" / "tokenizer_config.json").write_text(json.dumps({"mask_token": "[unused1]"}))
    fingerprints["special"] = identity_of(tmp_path / "special").fingerprint
    assert len({shipped.fingerprint, *fingerprints.values()}) == 5
    assert others["permuted"]["identity"]["vocab_size"] == shipped.vocab_size  # the size cannot tell it apart


def test_tokenizer_files_that_contradict_each_other_are_refused(tmp_path, vocab):
    """A vocab.txt swapped beside its tokenizer.json, or a tokenizer_config.json whose do_lower_case contradicts the
    tokenizer.json (transformers reads one, data_prep the other) has no one identity: refused, naming the files."""
    from common.vocab import TokenizerIdentityError, identity_of

    adopt_vocab(vocab, tmp_path / "tok")
    swapped = tmp_path / "swapped"
    shutil.copytree(tmp_path / "tok", swapped)
    _permuted(vocab, tmp_path / "p")
    shutil.copy(tmp_path / "p" / "vocab.txt", swapped / "vocab.txt")
    with pytest.raises(TokenizerIdentityError, match=r"vocab.txt: holds another vocabulary than .*tokenizer.json"):
        identity_of(swapped)
    flipped = tmp_path / "flipped"
    shutil.copytree(tmp_path / "tok", flipped)
    config = json.loads((flipped / "tokenizer_config.json").read_text())
    (flipped / "tokenizer_config.json").write_text(json.dumps({**config, "do_lower_case": False}))
    with pytest.raises(TokenizerIdentityError, match="tokenizer.json has lowercase True but tokenizer_config.json"):
        identity_of(flipped)
    with pytest.raises(DataPrepError, match="tokenizer.json has lowercase"):
        tokenizer_identity(flipped)  # data_prep's own reading of it


def test_the_manifest_records_the_identity_and_the_reader_checks_the_files_against_it(tmp_path, vocab, small_books):
    """Every manifest carries its tokenizer's identity; a corpus whose tokenizer files were replaced after tokenizing
    (another tokenizer of the same size installed over it) is refused by `PreparedCorpus.tokenizer_identity`, naming
    both fingerprints; one whose manifest predates identities gets it from its files."""
    from data_prep.pipeline import tokenize_corpus
    from data_prep.reader import PreparedCorpus

    out = tmp_path / "corpus"
    manifest = tokenize_corpus(small_books[:1], out, tokenizer=vocab, valid_fraction=0.0)
    recorded = manifest["tokenizer"]["identity"]
    corpus = PreparedCorpus(out)
    assert corpus.tokenizer_identity().fingerprint == recorded["fingerprint"]
    old = json.loads((out / "manifest.json").read_text())
    del old["tokenizer"]["identity"]
    (out / "manifest.json").write_text(json.dumps(old))
    assert PreparedCorpus(out).tokenizer_identity().fingerprint == recorded["fingerprint"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    adopt_vocab(_permuted(vocab, tmp_path / "p"), tmp_path / "other")
    for name in ("vocab.txt", "tokenizer.json"):
        shutil.copy(tmp_path / "other" / name, out / "tokenizer" / name)
    with pytest.raises(DataPrepError, match=r"are not the tokenizer .*manifest.json records") as refused:
        PreparedCorpus(out).tokenizer_identity()
    assert recorded["fingerprint"][:12] in str(refused.value)
