"""Fault injection for the two roots of issue 38's classes 1 and 2, through the entry points a user meets: the
`finetune` and `pretrain` commands, `load_pretrained`, `AutoModel*.from_pretrained`, and `transformers.pipeline` with
`trust_remote_code=True` in a process that never imported elasticbert.

Audit class 1 - verification lives where weights are loaded: a directory this project sealed (checksums.json, and
`"checksums": "checksums.json"` in its config.json) whose files changed, or that lost its checksums.json, is refused
by every entry point, naming the file and the override (`--no-verify-checksums` / `verify_checksums=False`).
Audit class 2 - tokenizers have an identity (`common.vocab`: vocabulary in id order, normalisation, special tokens),
recorded in manifests, checkpoints and model directories and compared wherever tokens meet weights again.

Each case's docstring names its class and whether the issue named it or the re-audit added it. What must hold: exit 2
(or a CheckpointError / DataError) with one message naming both sides, never a traceback, never a silent load; and no
false alarm on directories that were never sealed or tokenizers that are the same one in another form.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from faults import flip_bytes
from requirements import GLUE, GUTENBERG, require_data
from transformers import AutoModel, AutoModelForSequenceClassification

from common.vocab import identity_of
from elasticbert import CheckpointError, ElasticBertForSequenceClassification, load_pretrained, minilm_dir
from elasticbert.loading import set_checksum_verification
from finetune.__main__ import main

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "tiny_cpu.yaml"
ROWS = {"train": 17, "dev": 13, "test": 9}
PRETRAIN = [
    "train.global_batch_size=8",
    "optim.warmup_steps=1",
    "checkpoint.interval=2",
    "logging.tensorboard=false",
    "eval.interval=0",
]


# ------------------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def glue(tmp_path_factory) -> Path:
    require_data(GLUE / "SST-2")
    root = tmp_path_factory.mktemp("glue")
    (root / "SST-2").mkdir()
    for split, n in ROWS.items():
        lines = (GLUE / "SST-2" / f"{split}.tsv").read_text(encoding="utf-8").splitlines()[:n]
        (root / "SST-2" / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def train_argv(glue: Path, out: Path, *extra: str, model: Path | None = None) -> list[str]:
    """A run of seconds: one layer, one step, a few rows."""
    argv = ["train", "--model", str(model or minilm_dir()), "--task", "SST-2", "--data-dir", str(glue)]
    argv += ["--output", str(out), "--layers", "1", "--train-steps", "1", "--batch-size", "4", "--max-length", "32"]
    return [*argv, "--no-progress", *extra]


def error_of(capsys, argv: list[str]) -> str:
    """A `finetune` command that must fail as a user error: exit 2, one message, no traceback."""
    capsys.readouterr()
    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    assert "error: " in err and "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def finished(tmp_path_factory, glue) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    assert main(train_argv(glue, out)) == 0
    return out


@pytest.fixture
def best(tmp_path, finished) -> Path:
    """A copy of a fine-tuned best/ (sealed by `finetune train`) for one case to damage."""
    shutil.copytree(finished / "best", tmp_path / "best")
    return tmp_path / "best"


@pytest.fixture(autouse=True)
def verification_back_on():
    yield
    set_checksum_verification(True)  # `--no-verify-checksums` switches it off for the process


@pytest.fixture
def texts(tmp_path) -> Path:
    (tmp_path / "in.txt").write_text("a fine film\na dull and tired story\n", encoding="utf-8")
    return tmp_path / "in.txt"


def _vocab_lines() -> list[str]:
    return (minilm_dir() / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]


def _tokenizer_variant(directory: Path, shuffle: bool = False, **config: object) -> Path:
    """MiniLM's tokenizer as vocab.txt + tokenizer_config.json: the same tokens at other ids (`shuffle`; the specials
    keep theirs, so the size and the [UNK] rate are the same) and/or other settings (`do_lower_case=False`)."""
    directory.mkdir(parents=True)
    tokens = _vocab_lines()
    if shuffle:
        tokens = tokens[:1000] + tokens[1000:][::-1]
    (directory / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    settings = json.loads((minilm_dir() / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**settings, **config}))
    return directory


PIPELINE = """
import json, sys
from transformers import pipeline
assert "elasticbert" not in sys.modules
out = {}
for directory in sys.argv[1:]:
    try:
        scores = pipeline("text-classification", model=directory, trust_remote_code=True, top_k=None)(["a fine film"])
        out[directory] = {"scores": sorted(s["score"] for s in scores[0])}
    except ValueError as err:
        out[directory] = {"error": f"{type(err).__name__}: {err}"}
print(json.dumps(out))
"""


def _pipeline(*directories: Path) -> dict[str, dict]:
    """`pipeline(..., trust_remote_code=True)` on each directory, in a fresh process without `import elasticbert`."""
    out = subprocess.run(
        [sys.executable, "-c", PIPELINE, *map(str, directories)],
        cwd=directories[0].parent,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------ class 1: checksums


def test_flipped_tensor_bytes_are_refused_by_automodel_and_the_remote_code_pipeline(best, capsys):
    """Audit class 1, named by the issue: flipped tensor bytes in a fine-tuned best/ loaded through
    `AutoModelForSequenceClassification.from_pretrained` and `pipeline(..., trust_remote_code=True)` (which loaded
    them silently, with other scores): refused naming the file; `verify_checksums=False` loads them anyway."""
    intact = _pipeline(best)[str(best)]
    flip_bytes(best / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model.safetensors: contents differ .*verify_checksums=False"):
        AutoModelForSequenceClassification.from_pretrained(best)
    assert "model.safetensors: contents differ" in _pipeline(best)[str(best)]["error"]
    loaded = AutoModelForSequenceClassification.from_pretrained(best, verify_checksums=False)
    assert loaded is not None and "scores" in intact


def test_a_config_changed_by_hand_is_refused_through_automodel(best):
    """Audit class 1, named by the issue: config.json with another layer_norm_eps (still valid JSON, so every format
    check passes) loaded through `AutoModel` and `AutoModelForSequenceClassification`: refused."""
    text = (best / "config.json").read_text()
    assert '"layer_norm_eps": 1e-12' in text
    (best / "config.json").write_text(text.replace('"layer_norm_eps": 1e-12', '"layer_norm_eps": 1e-19'))
    for auto in (AutoModel, AutoModelForSequenceClassification):
        with pytest.raises(CheckpointError, match="config.json: contents differ from the sha256"):
            auto.from_pretrained(best)


def test_a_copy_without_checksums_is_refused_by_every_entry_point(best, capsys, texts):
    """Audit class 1, named by the issue: a best/ copied without its checksums.json (a partial copy) loaded unverified
    without a word. Its config.json says it was sealed, so `load_pretrained`, `AutoModel*`, the remote-code pipeline
    and `predict` refuse it, naming the flag that accepts it, which then loads it."""
    (best / "checksums.json").unlink()
    message = "checksums.json is missing, but"
    with pytest.raises(CheckpointError, match=message):
        load_pretrained(ElasticBertForSequenceClassification, best)
    with pytest.raises(CheckpointError, match=message):
        AutoModelForSequenceClassification.from_pretrained(best)
    assert message in _pipeline(best)[str(best)]["error"]
    err = error_of(capsys, ["predict", "--model", str(best), "--input", str(texts), "--no-progress"])
    assert message in err and "--no-verify-checksums" in err
    assert main(["predict", "--model", str(best), "--input", str(texts), "--no-progress", "--no-verify-checksums"]) == 0
    load_pretrained(ElasticBertForSequenceClassification, best, verify_checksums=False)


def test_a_flipped_tokenizer_file_is_refused_before_any_text_is_read(best, capsys, texts):
    """Audit class 1, added by the re-audit: bytes flipped inside best/tokenizer.json (a token of the vocabulary
    changes; the file still parses) - refused by `predict` and by the remote-code pipeline (the tokenizer files are
    under the same checksums as the weights)."""
    data = (best / "tokenizer.json").read_text(encoding="utf-8")
    at = data.index('"film":')
    (best / "tokenizer.json").write_text(data[:at] + '"filn":' + data[at + 7 :], encoding="utf-8")
    err = error_of(capsys, ["predict", "--model", str(best), "--input", str(texts), "--no-progress"])
    assert "tokenizer.json: contents differ from the sha256 in checksums.json" in err
    assert "tokenizer.json: contents differ" in _pipeline(best)[str(best)]["error"]


def test_weights_replaced_by_another_models_are_refused(tmp_path, best, glue, capsys):
    """Audit class 1, added by the re-audit: model.safetensors replaced by another fine-tuned model's (the same
    architecture, so it loads cleanly and scores differently) - refused by `AutoModelForSequenceClassification` and
    `evaluate`."""
    other = tmp_path / "other"
    assert main(train_argv(glue, other, "--seed", "7")) == 0
    shutil.copy(other / "best" / "model.safetensors", best / "model.safetensors")
    with pytest.raises(CheckpointError, match="model.safetensors: contents differ"):
        AutoModelForSequenceClassification.from_pretrained(best)
    err = error_of(capsys, ["evaluate", "--model", str(best), "--data-dir", str(glue), "--output", str(tmp_path / "e")])
    assert "model.safetensors: contents differ from the sha256 in checksums.json" in err


def test_an_official_layout_export_without_checksums_is_refused(tmp_path, finished, capsys):
    """Audit class 1, added by the re-audit: `finetune export --layout fnlp` seals its directory too; a copy of it
    without checksums.json is refused by `load_pretrained` and `AutoModel`, and the export itself (its config.json
    carries only the official fields and the seal marker) still loads when intact."""
    out = tmp_path / "fnlp"
    assert main(["export", "--model", str(finished / "best"), "--output", str(out), "--layout", "fnlp"]) == 0
    load_pretrained(ElasticBertForSequenceClassification, out)
    (out / "checksums.json").unlink()
    with pytest.raises(CheckpointError, match="checksums.json is missing, but"):
        load_pretrained(ElasticBertForSequenceClassification, out)
    with pytest.raises(CheckpointError, match="checksums.json is missing, but"):
        AutoModelForSequenceClassification.from_pretrained(out)


def test_saving_an_early_exit_setting_into_an_unverifiable_copy_is_refused(best, capsys):
    """Audit class 1, added by the re-audit: `save-early-exit` into a best/ that lost its checksums.json would rewrite
    config.json in a directory nobody can verify: refused, and nothing is written."""
    (best / "checksums.json").unlink()
    before = (best / "config.json").read_bytes()
    err = error_of(capsys, ["save-early-exit", "--model", str(best), "--strategy", "entropy", "--threshold", "0.3"])
    assert "checksums.json is missing, but" in err
    assert (best / "config.json").read_bytes() == before


def test_directories_that_were_never_sealed_load_as_before(tmp_path, finished):
    """Audit class 1, added by the re-audit (no false alarm): the MiniLM package (a hub BERT) and a model saved with
    plain `save_pretrained` carry no seal and load through `load_pretrained`, `AutoModel` and the pipeline; a
    sealed directory re-saved in place drops its stale seal and loads."""
    load_pretrained(ElasticBertForSequenceClassification, minilm_dir())
    AutoModel.from_pretrained(minilm_dir())
    model = AutoModelForSequenceClassification.from_pretrained(finished / "best")
    model.save_pretrained(tmp_path / "plain")
    shutil.copy(finished / "best" / "tokenizer.json", tmp_path / "plain")
    shutil.copy(finished / "best" / "tokenizer_config.json", tmp_path / "plain")
    assert not (tmp_path / "plain" / "checksums.json").exists()
    load_pretrained(ElasticBertForSequenceClassification, tmp_path / "plain")
    assert "scores" in _pipeline(tmp_path / "plain")[str(tmp_path / "plain")]


# --------------------------------------------------------------------------------- class 2: tokenizer identity


def test_a_same_size_vocabulary_with_other_ids_is_refused(tmp_path, glue, capsys):
    """Audit class 2, named by the issue: `--tokenizer` a vocabulary of MiniLM's size with other ids (it trained to
    exit 0: same size, same [UNK] rate) - refused before any data is read, naming both fingerprints."""
    shuffled = _tokenizer_variant(tmp_path / "shuffled", shuffle=True)
    err = error_of(capsys, train_argv(glue, tmp_path / "run", "--tokenizer", str(shuffled)))
    assert f"the tokenizer {shuffled}" in err and "the same size, but other tokens" in err
    assert identity_of(shuffled).short in err and identity_of(minilm_dir()).short in err
    assert not (tmp_path / "run" / "best").exists()


def test_a_cased_tokenizer_on_an_uncased_model_is_refused(tmp_path, glue, capsys):
    """Audit class 2, named by the issue: MiniLM's vocabulary read cased (`do_lower_case: false`) on the uncased
    MiniLM - refused, saying it is cased vs lower-cased."""
    cased = _tokenizer_variant(tmp_path / "cased", do_lower_case=False)
    err = error_of(capsys, train_argv(glue, tmp_path / "run", "--tokenizer", str(cased)))
    assert "cased vs lower-cased" in err


def test_a_normaliser_that_keeps_accents_is_refused(tmp_path, glue, capsys):
    """Audit class 2, added by the re-audit: the same vocabulary and casing with another normaliser (accents kept,
    `strip_accents: false`, in tokenizer.json and tokenizer_config.json alike) - refused: 'café' becomes other ids."""
    from transformers import BertTokenizer

    kept = tmp_path / "kept"
    BertTokenizer.from_pretrained(str(_tokenizer_variant(tmp_path / "src", strip_accents=False))).save_pretrained(kept)
    assert json.loads((kept / "tokenizer.json").read_text())["normalizer"]["strip_accents"] is False
    err = error_of(capsys, train_argv(glue, tmp_path / "run", "--tokenizer", str(kept)))
    assert "accents kept vs stripped" in err


def test_the_same_tokenizer_in_another_form_is_accepted_and_recorded(tmp_path, glue, finished, texts):
    """Audit class 2, added by the re-audit (no false alarm): data_prep's install of MiniLM's vocab as `--tokenizer`
    trains; best/config.json records the identity, best/'s saved tokenizer files have it, and predict runs."""
    from data_prep.tokenizer import adopt_vocab

    adopt_vocab(minilm_dir() / "vocab.txt", tmp_path / "tok")
    assert main(train_argv(glue, tmp_path / "run", "--tokenizer", str(tmp_path / "tok"))) == 0
    recorded = json.loads((tmp_path / "run" / "best" / "config.json").read_text())["tokenizer_identity"]
    saved = identity_of(tmp_path / "run" / "best").fingerprint
    assert recorded["fingerprint"] == identity_of(minilm_dir()).fingerprint == saved
    assert main(["predict", "--model", str(tmp_path / "run" / "best"), "--input", str(texts), "--no-progress"]) == 0
    assert json.loads((finished / "best" / "config.json").read_text())["tokenizer_identity"] == recorded


def test_a_swapped_tokenizer_is_refused_even_past_the_checksums(best, capsys, texts):
    """Audit class 2, added by the re-audit: best/'s tokenizer replaced by a same-size one with other ids, loaded
    with `--no-verify-checksums` (the checksums would refuse it first): `predict` still refuses, because
    best/config.json records the identity its weights were trained with."""
    from transformers import BertTokenizer

    shuffled = _tokenizer_variant(best.parent / "shuffled", shuffle=True)
    BertTokenizer.from_pretrained(str(shuffled)).save_pretrained(best)
    argv = ["predict", "--model", str(best), "--input", str(texts), "--no-progress", "--no-verify-checksums"]
    err = error_of(capsys, argv)
    assert f"the tokenizer saved in {best}" in err and "config.json records so" in err


def test_tokenizer_files_that_contradict_each_other_are_refused(best, glue, capsys):
    """Audit class 2, added by the re-audit: best/tokenizer_config.json edited to `do_lower_case: false` while
    tokenizer.json lower-cases (transformers would follow one, data_prep the other): `evaluate --no-verify-checksums`
    refuses it, naming both files."""
    settings = json.loads((best / "tokenizer_config.json").read_text())
    (best / "tokenizer_config.json").write_text(json.dumps({**settings, "do_lower_case": False}))
    argv = ["evaluate", "--model", str(best), "--data-dir", str(glue), "--output", str(best.parent / "e")]
    err = error_of(capsys, [*argv, "--no-verify-checksums"])
    assert "tokenizer.json has lowercase True but tokenizer_config.json says False" in err


# ----------------------------------------------------------------------------------- class 2: pre-training data


def _book(tmp_path: Path) -> Path:
    require_data(GUTENBERG / "11-0.txt")
    text = (GUTENBERG / "11-0.txt").read_text(encoding="utf-8")[:60_000]
    (tmp_path / "alice.txt").write_text(text, encoding="utf-8")
    return tmp_path / "alice.txt"


def _tokenize(book: Path, out: Path, vocab: Path) -> Path:
    from data_prep.pipeline import tokenize_corpus

    shutil.rmtree(out, ignore_errors=True)
    tokenize_corpus([str(book)], out, tokenizer=vocab, valid_fraction=0.0)
    return out


def _pretrain(argv: list[str]) -> tuple[int, str]:
    """`python -m pretrain ARGV` in its own process (a trainer's process group is one per process): exit code and
    stderr, which for a refusal is one message and no traceback."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-m", "pretrain", *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.returncode, done.stderr


def _refusal(argv: list[str]) -> str:
    code, err = _pretrain(argv)
    assert code == 2 and "pretrain: error: " in err, err[-3000:]
    return err


def _pretrain_argv(run: Path, *corpora: Path, steps: int = 2, extra: tuple[str, ...] = ()) -> list[str]:
    sets = [f"data.corpora.0.path={corpora[0]}", f"train.train_steps={steps}", *PRETRAIN, *extra]
    for k, corpus in enumerate(corpora[1:], start=1):
        sets += [f"data.corpora.{k}.path={corpus}", f"data.corpora.{k}.name=c{k}", f"data.corpora.{k}.weight=1.0"]
    return ["train", "--config", str(TINY), "--output", str(run), *[a for s in sets for a in ("--set", s)]]


@pytest.mark.slow
def test_a_corpus_re_tokenized_at_the_same_path_does_not_resume(tmp_path):
    """Audit class 2, named by the issue: a run checkpoints, then its corpus is re-tokenized with another vocabulary
    (the same size, other ids) and swapped in at the same path: the resume (which went on silently) is refused,
    naming both fingerprints, even with --force-resume; with the original corpus back it resumes."""
    book = _book(tmp_path)
    corpus = _tokenize(book, tmp_path / "corpus", minilm_dir() / "vocab.txt")
    run = tmp_path / "run"
    assert _pretrain(_pretrain_argv(run, corpus))[0] == 0
    assert (run / "checkpoints" / "latest").read_text().strip() == "global_step2"
    saved = json.loads((run / "checkpoints" / "global_step2" / "export" / "config.json").read_text())
    ours = identity_of(minilm_dir())
    assert saved["tokenizer_identity"]["fingerprint"] == ours.fingerprint
    shuffled = _tokenizer_variant(tmp_path / "shuffled", shuffle=True)
    _tokenize(book, corpus, shuffled / "vocab.txt")
    longer = [*_pretrain_argv(run, corpus, steps=4), "--force-resume"]  # even a forced resume is refused
    err = _refusal(longer)
    assert "global_step2 was trained with" in err and "the same size, but other tokens" in err
    assert ours.short in err and identity_of(shuffled).short in err
    _tokenize(book, corpus, minilm_dir() / "vocab.txt")
    assert _pretrain(longer)[0] == 0
    assert (run / "checkpoints" / "latest").read_text().strip() == "global_step4"


@pytest.mark.slow
def test_corpora_whose_tokenizer_changed_or_differs_are_refused(tmp_path):
    """Audit class 2, added by the re-audit: a corpus whose tokenizer/vocab.txt was replaced after tokenizing (its
    tokenizer.json still the old one), one whose tokenizer was replaced whole (manifest vs files), and a blend of two
    corpora of same-size vocabularies with other ids: each refused before a process group starts."""
    book = _book(tmp_path)
    corpus = _tokenize(book, tmp_path / "corpus", minilm_dir() / "vocab.txt")
    shuffled = _tokenizer_variant(tmp_path / "shuffled", shuffle=True)
    other = _tokenize(book, tmp_path / "other", shuffled / "vocab.txt")
    err = _refusal(_pretrain_argv(tmp_path / "blend", corpus, other))
    assert "the tokenizer of data.corpora[1]" in err and "is not the tokenizer of data.corpora[0]" in err

    swapped = tmp_path / "swapped"
    shutil.copytree(corpus, swapped)
    shutil.copy(shuffled / "vocab.txt", swapped / "tokenizer" / "vocab.txt")
    err = _refusal(_pretrain_argv(tmp_path / "r1", swapped, extra=("data.verify=false",)))
    assert "vocab.txt: holds another vocabulary than" in err

    replaced = tmp_path / "replaced"
    shutil.copytree(corpus, replaced)
    for name in ("vocab.txt", "tokenizer.json"):
        shutil.copy(other / "tokenizer" / name, replaced / "tokenizer" / name)
    err = _refusal(_pretrain_argv(tmp_path / "r2", replaced, extra=("data.verify=false",)))
    assert "manifest.json records" in err and "it was replaced after tokenizing" in err


@pytest.mark.slow
def test_an_uncased_corpus_with_a_cased_init_model_is_refused(tmp_path):
    """Audit class 2, added by the re-audit: `model.init_from` a copy of MiniLM whose tokenizer reads its vocabulary
    cased (the same vocab.txt, so the old byte comparison passed it) on a corpus tokenized uncased: refused."""
    corpus = _tokenize(_book(tmp_path), tmp_path / "corpus", minilm_dir() / "vocab.txt")
    cased = tmp_path / "cased_model"
    shutil.copytree(minilm_dir(), cased)
    (cased / "tokenizer.json").unlink()
    settings = json.loads((cased / "tokenizer_config.json").read_text())
    (cased / "tokenizer_config.json").write_text(json.dumps({**settings, "do_lower_case": False}))
    extra = (f"model.init_from={cased}", "model.num_hidden_layers=6", "model.hidden_size=384")
    extra += ("model.num_attention_heads=12", "model.intermediate_size=1536", "model.max_position_embeddings=512")
    err = _refusal(_pretrain_argv(tmp_path / "run", corpus, extra=extra))
    assert f"model.init_from={cased} was trained with" in err and "lower-cased vs cased" in err
