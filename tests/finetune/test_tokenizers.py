"""Tokenizers of other backbones (RoBERTa's byte-level BPE through AutoTokenizer, WordPiece through BertTokenizer),
segment ids only where the model has embeddings for them, and `--model` / `--tokenizer` as hub names (an offline,
hand-made hub cache)."""

import json
import shutil

import pytest
import torch
from hub_cache import add_to_hub_cache
from tokenizers import ByteLevelBPETokenizer
from transformers import BertTokenizer, RobertaConfig, RobertaModel, RobertaTokenizer

from common.vocab import identity_of
from finetune.__main__ import main
from finetune.data import _wrapper_encode, encode_examples, load_tokenizer, paired_tokenizer, tokenizer_kind
from finetune.tasks import DataError, Example, get_task, load_split

PAIRS = [Example("A man is playing a guitar.", "Someone plays music.", 0, 0), Example("It rains.", "It is dry.", 1, 1)]


@pytest.fixture(scope="module")
def roberta_dir(tmp_path_factory, glue_dir):
    """A tiny RoBERTa checkpoint (random weights) with its own byte-level BPE tokenizer trained on RTE sentences."""
    directory = tmp_path_factory.mktemp("roberta")
    rows = load_split(get_task("RTE"), glue_dir, "train")[:400]
    bpe = ByteLevelBPETokenizer()
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    bpe.train_from_iterator(
        [r.text_a for r in rows] + [r.text_b for r in rows], vocab_size=600, special_tokens=specials
    )
    bpe.save_model(str(directory))
    tokenizer = RobertaTokenizer(str(directory / "vocab.json"), str(directory / "merges.txt"))
    tokenizer.save_pretrained(directory)
    config = RobertaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=66,  # 64 positions: RoBERTa's start at pad_token_id + 1 = 2
        type_vocab_size=1,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    RobertaModel(config).save_pretrained(directory)
    return directory


def test_roberta_bpe_loads_through_auto_tokenizer_with_one_segment_type(roberta_dir):
    assert tokenizer_kind(roberta_dir) == "auto"
    tokenizer = load_tokenizer(roberta_dir)
    assert not isinstance(tokenizer, BertTokenizer) and "Roberta" in type(tokenizer).__name__
    batch = encode_examples(tokenizer, PAIRS, 32)
    assert batch["input_ids"][0, 0].item() == tokenizer.bos_token_id  # <s> a </s></s> b </s>
    assert torch.equal(batch["token_type_ids"], torch.zeros_like(batch["input_ids"]))  # type_vocab_size 1


@pytest.mark.parametrize("task, max_length", [("SST-2", 128), ("MRPC", 128), ("MRPC", 24), ("RTE", 40)])
def test_encoding_through_the_backend_equals_the_transformers_call(minilm, roberta_dir, glue_dir, task, max_length):
    """`encode_examples` tokenises through the Rust backend (a clone with truncation and padding set once); every dev
    row of real GLUE data, in batches of 1 and 32 (pairs truncated longest-first at a short length too), gives the
    ids, masks and segment ids the `transformers` call gives, for WordPiece and byte-level BPE."""
    rows = load_split(get_task(task), glue_dir, "dev")
    for directory in (minilm, roberta_dir):
        tokenizer = load_tokenizer(directory)
        for size in (1, 32):
            for start in range(0, min(len(rows), 320), size):
                chunk = rows[start : start + size]
                fast = encode_examples(tokenizer, chunk, max_length)
                texts_b = [e.text_b for e in chunk] if chunk[0].text_b is not None else None
                slow = _wrapper_encode(tokenizer, [e.text_a for e in chunk], texts_b, max_length)
                for key in ("input_ids", "attention_mask"):
                    assert torch.equal(fast[key], slow[key]), (directory.name, task, start, key)
                if "token_type_ids" in tokenizer.model_input_names:
                    assert torch.equal(fast["token_type_ids"], slow["token_type_ids"]), (task, start)
    assert max(int(fast["attention_mask"].sum(1).max()), 0) <= max_length


def test_tokens_added_after_a_first_encoding_are_seen(minilm):
    """The backend clone is made per tokenizer size: a token added later is encoded as the tokenizer now does."""
    tokenizer = load_tokenizer(minilm)
    example = [Example("a zqxjvword here", None, None, 0)]
    before = encode_examples(tokenizer, example, 16)["input_ids"]
    tokenizer.add_tokens(["zqxjvword"])
    after = encode_examples(tokenizer, example, 16)["input_ids"]
    assert after.shape[1] < before.shape[1] and int(after[0, 2]) == len(tokenizer) - 1


def test_wordpiece_segment_ids_follow_the_model(minilm, tmp_path):
    assert tokenizer_kind(minilm) == "wordpiece"
    two_types = load_tokenizer(minilm)  # MiniLM's config.json: type_vocab_size 2
    assert isinstance(two_types, BertTokenizer)
    types = encode_examples(two_types, PAIRS, 32)["token_type_ids"]
    assert types.max().item() == 1  # the second sentence is segment 1
    one_type = load_tokenizer(minilm, type_vocab_size=1)  # e.g. a BERT vocabulary paired with a one-type model
    assert encode_examples(one_type, PAIRS, 32)["token_type_ids"].max().item() == 0
    vocab_only = tmp_path / "vocab_only"  # a folder with only vocab.txt: BertTokenizer (AutoTokenizer fails on it)
    vocab_only.mkdir()
    (vocab_only / "vocab.txt").write_bytes((minilm / "vocab.txt").read_bytes())
    assert load_tokenizer(vocab_only).tokenize("hello world") == ["hello", "world"]


def test_roberta_backbone_fine_tunes_end_to_end_with_its_own_tokenizer(tmp_path, roberta_dir, glue_dir, capsys):
    out = tmp_path / "run"
    argv = ["train", "--model", str(roberta_dir), "--task", "RTE", "--data-dir", str(glue_dir), "--output", str(out)]
    argv += ["--exits", "--train-steps", "3", "--batch-size", "8", "--max-length", "48", "--max-train-examples", "32"]
    argv += ["--max-dev-examples", "16", "--no-progress"]
    assert main(argv) == 0
    assert tokenizer_kind(out / "best") == "auto"  # its BPE tokenizer was saved with the model, and reloads as such
    original, saved = load_tokenizer(roberta_dir), load_tokenizer(out / "best")
    assert type(saved) is type(original)
    assert torch.equal(
        encode_examples(saved, PAIRS, 32)["input_ids"], encode_examples(original, PAIRS, 32)["input_ids"]
    )
    scores = json.loads((out / "dev_scores.json").read_text())
    assert set(scores["best"]["exits"]) == {"1", "2"}
    # best/ records the identity of the tokenizer it was trained with, and its saved BPE files have that identity
    recorded = json.loads((out / "best" / "config.json").read_text())["tokenizer_identity"]
    assert recorded["fingerprint"] == identity_of(roberta_dir).fingerprint == identity_of(out / "best").fingerprint
    assert recorded["kind"] == "BPE"
    # RoBERTa's positions start at pad_token_id + 1: 66 embeddings hold 64 tokens, and a longer --max-length is
    # refused up front instead of failing at the first long row
    capsys.readouterr()
    assert main([*argv[:7], "--output", str(tmp_path / "long"), "--max-length", "65", "--train-steps", "1"]) == 2
    assert "embeds at most 64 positions" in capsys.readouterr().err


def test_model_and_tokenizer_by_hub_name_from_an_offline_cache(tmp_path, monkeypatch, minilm, glue_dir):
    cache = tmp_path / "hub"
    snapshot = add_to_hub_cache(cache, "sentence-transformers/all-MiniLM-L6-v2", minilm)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "run"
    name = "sentence-transformers/all-MiniLM-L6-v2"
    argv = ["train", "--model", name, "--tokenizer", name, "--task", "SST-2", "--data-dir", str(glue_dir)]
    argv += ["--output", str(out), "--layers", "1", "--train-steps", "2", "--batch-size", "4", "--max-length", "32"]
    argv += ["--max-train-examples", "16", "--max-dev-examples", "16", "--no-progress"]
    assert main(argv) == 0
    saved = json.loads((out / "run_config.json").read_text())
    assert saved["config"]["model"]["path"] == name  # the name as given; where it resolved to, beside it
    assert saved["resolved"]["model_path"] == str(snapshot)
    assert saved["resolved"]["tokenizer_path"] == str(snapshot)
    assert (out / "best" / "tokenizer.json").is_file()


def _variant(minilm, directory, transform=None, config=None):
    """MiniLM's tokenizer with its vocabulary changed by `transform` and/or its tokenizer_config.json by `config`."""
    directory.mkdir()
    tokens = (minilm / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    (directory / "vocab.txt").write_text("\n".join(transform(tokens) if transform else tokens) + "\n")
    settings = {**json.loads((minilm / "tokenizer_config.json").read_text()), **(config or {})}
    (directory / "tokenizer_config.json").write_text(json.dumps(settings))
    return directory


def test_a_tokenizer_is_paired_with_a_model_only_when_it_is_the_models(minilm, tmp_path):
    """The same vocabulary in another form pairs with MiniLM; the same tokens at other ids (same size: the size check
    passes it) and the cased reading of its vocabulary are refused, naming both sides; so are a model directory's own
    tokenizer files that are not what its config.json records (load_tokenizer, as predict and evaluate load it)."""
    same = _variant(minilm, tmp_path / "same")
    assert paired_tokenizer(same, minilm).fingerprint == identity_of(minilm).fingerprint
    shuffled = _variant(minilm, tmp_path / "shuffled", lambda t: t[:1000] + t[1000:][::-1])
    with pytest.raises(DataError, match="the same size, but other tokens") as refused:
        paired_tokenizer(shuffled, minilm)
    assert f"the tokenizer {shuffled}" in str(refused.value) and f"the model {minilm} was trained with" in str(
        refused.value
    )
    assert identity_of(minilm).short in str(refused.value) and "drop --tokenizer" in str(refused.value)
    cased = _variant(minilm, tmp_path / "cased", config={"do_lower_case": False})
    with pytest.raises(DataError, match="cased vs lower-cased"):
        paired_tokenizer(cased, minilm)
    model = tmp_path / "model"  # a model directory whose config.json records MiniLM's tokenizer, with other files
    shutil.copytree(shuffled, model)
    config = json.loads((minilm / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "tokenizer_identity": identity_of(minilm).to_dict()}))
    with pytest.raises(DataError, match=r"config.json records so\)"):
        load_tokenizer(model)
