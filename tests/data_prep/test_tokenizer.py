import json
import re
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
