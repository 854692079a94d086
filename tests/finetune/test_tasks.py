"""Task registry, loaders (real GLUE + ELUE-layout fixtures), bad input, metrics and tokenisation."""

from collections import Counter

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from finetune.data import encode_examples, iterate_batches, subsample
from finetune.tasks import (
    ELUE_TASKS,
    DataError,
    Example,
    benchmark_score,
    get_task,
    load_split,
)

# Data rows per file, from ../shared/data/SOURCES.md.
ROWS = {
    ("SST-2", "train"): 67349,
    ("SST-2", "dev"): 872,
    ("SST-2", "test"): 1821,
    ("MRPC", "train"): 3668,
    ("MRPC", "dev"): 408,
    ("MRPC", "test"): 1725,
    ("RTE", "train"): 2490,
    ("RTE", "dev"): 277,
    ("RTE", "test"): 3000,
    ("STS-B", "train"): 5749,
    ("STS-B", "dev"): 1500,
    ("STS-B", "test"): 1379,
    ("CoLA", "train"): 8551,
    ("CoLA", "dev"): 1043,
    ("CoLA", "test"): 1063,
    ("QNLI", "dev"): 5463,
    ("QNLI", "test"): 5463,
}


@pytest.mark.parametrize("task,split", sorted(ROWS))
def test_every_present_glue_file_loads_with_exact_row_count(glue_dir, task, split):
    examples = load_split(task, glue_dir, split)
    assert len(examples) == ROWS[task, split]
    spec = get_task(task)
    assert all(isinstance(e.text_a, str) and e.text_a for e in examples[:50])
    assert all((e.text_b is not None) == spec.is_pair for e in examples)
    if split == "test":
        assert all(e.label is None for e in examples)
        assert [e.index for e in examples[:3]] == [0, 1, 2]
    else:
        assert all(e.label is not None for e in examples)


def test_label_distributions_match_sources(glue_dir):
    assert Counter(e.label for e in load_split("SST-2", glue_dir, "train")) == {0: 29780, 1: 37569}
    rte = get_task("RTE")
    counts = Counter(rte.label_names[e.label] for e in load_split(rte, glue_dir, "train"))
    assert counts == {"entailment": 1249, "not_entailment": 1241}
    assert Counter(e.label for e in load_split("CoLA", glue_dir, "dev")) == {0: 322, 1: 721}
    assert Counter(e.label for e in load_split("MRPC", glue_dir, "train")) == {0: 1194, 1: 2474}
    stsb = [e.label for e in load_split("STS-B", glue_dir, "dev")]
    assert isinstance(stsb[0], float) and abs(np.mean(stsb) - 2.364) < 1e-3


def test_mrpc_bom_and_cola_headerless(glue_dir):
    raw = (glue_dir / "MRPC" / "train.tsv").read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf")  # the BOM is really there
    first = load_split("MRPC", glue_dir, "train")[0]
    assert first.label == 1 and first.text_a.startswith("Amrozi accused his brother")
    assert first.text_b.startswith("Referring to him as only")
    cola = load_split("CoLA", glue_dir, "train")
    assert cola[0].text_a == "Our friends won't buy this analysis, let alone the next one we propose."
    assert cola[0].label == 1
    assert load_split("CoLA", glue_dir, "test")[0].text_a == "Bill whistled past the house."


def test_task_names_and_typos():
    assert get_task("sst2").name == "SST-2"
    assert get_task("sts-b").num_labels == 1 and get_task("STS-B").is_regression
    assert get_task("mnli-mm").split_files["dev"] == "dev_mismatched.tsv"
    assert get_task("MNLI").submission_name == "MNLI-m"
    assert get_task("SciTail").name == "elue/SciTail"
    assert get_task("elue:sst-2").benchmark == "elue"
    with pytest.raises(DataError, match="Did you mean 'SST-2'"):
        get_task("SST2x")
    with pytest.raises(DataError, match="Did you mean 'RTE'"):
        get_task("RTEE")


ELUE_FIXTURES = {
    "SST-2": "sentence\tlabel\na great film\t1\na dull mess\t0\n",
    "IMDb": "sentence\tlabel\nloved every minute of it\t1\nwhat a waste\t0\nfine\t1\n",
    "SNLI": "premise\thypothesis\tlabel\nA man sleeps.\tA man rests.\t0\nA dog runs.\tA cat sits.\t2\nx\ty\t1\n",
    "SciTail": "premise\thypothesis\tlabel\nWater boils at 100.\tIt boils.\t1\nSun is a star.\tMoon is a star.\t0\n",
    "MRPC": "sentence1\tsentence2\tlabel\nHe left.\tHe went away.\t1\nIt rained.\tIt was sunny.\t0\n",
    "STS-B": "sentence1\tsentence2\tlabel\nA cat.\tA cat.\t5.0\nA dog.\tA car.\t0.4\n",
}


def test_elue_layout_fixtures(tmp_path):
    for name, text in ELUE_FIXTURES.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "dev.tsv").write_text(text, encoding="utf-8")
        first_col = "sentence" if name in ("SST-2", "IMDb") else ("premise" if "premise" in text else "sentence1")
        header = "index\t" + "\t".join(text.splitlines()[0].split("\t")[:-1])
        rows = [f"{i}\t" + "\t".join(line.split("\t")[:-1]) for i, line in enumerate(text.splitlines()[1:])]
        (folder / "test.tsv").write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
        spec = get_task(f"elue/{name}")
        dev = load_split(spec, tmp_path, "dev")
        assert len(dev) == len(text.splitlines()) - 1, name
        assert dev[0].text_a == text.splitlines()[1].split("\t")[0], first_col
        test = load_split(spec, tmp_path, "test")
        assert [e.index for e in test] == list(range(len(dev)))
        assert all(e.label is None for e in test)
    assert load_split("elue/STS-B", tmp_path, "dev")[1].label == pytest.approx(0.4)
    assert [e.label for e in load_split("elue/SNLI", tmp_path, "dev")] == [0, 2, 1]
    assert set(ELUE_TASKS) == {f"elue/{n}" for n in ELUE_FIXTURES}


# Files whose header names none of our columns, laid out as the official ELUE processors read them (fastnlp/ElasticBERT
# elue/elue.py): per task, a labelled row, the (text_a, text_b, label) expected from it, and a test row.
ELUE_BY_POSITION = {
    "SST-2": ("c0\tc1", "a great film\t1", ("a great film", None, 1), "i\tc1", "7\ta dull mess"),
    "IMDb": ("c0\tc1", "what a waste\t0", ("what a waste", None, 0), "i\tc1", "7\tloved it"),
    "SNLI": ("p\th\tx\ty", "A man.\tA person.\tz\t2", ("A man.", "A person.", 2), "i\tp\th", "7\tA dog.\tA cat."),
    "SciTail": ("p\th\ty", "Water.\tIt boils.\t1", ("Water.", "It boils.", 1), "i\tp\th", "7\tSun.\tStar."),
    "STS-B": ("s\tt\tsim", "A cat.\tA dog.\t0.4", ("A cat.", "A dog.", 0.4), "i\ts\tt", "7\tA.\tB."),
    "MRPC": (
        "q\ta\tb\ts\tt",
        "1\t11\t12\tHe left.\tHe went.",
        ("He left.", "He went.", 1),
        "q\ta\tb\ts\tt",
        "0\t1\t2\tX.\tY.",
    ),
}


@pytest.mark.parametrize("name", sorted(ELUE_BY_POSITION))
def test_elue_files_with_other_header_names_are_read_by_the_official_positions(tmp_path, name):
    header, row, (text_a, text_b, label), test_header, test_row = ELUE_BY_POSITION[name]
    folder = tmp_path / name
    folder.mkdir()
    (folder / "dev.tsv").write_text(f"{header}\n{row}\n", encoding="utf-8")
    (folder / "test.tsv").write_text(f"{test_header}\n{test_row}\n", encoding="utf-8")
    (dev,) = load_split(f"elue/{name}", tmp_path, "dev")
    assert (dev.text_a, dev.text_b) == (text_a, text_b) and dev.label == pytest.approx(label)
    (test,) = load_split(f"elue/{name}", tmp_path, "test")
    assert test.label is None and test.text_a == test_row.split("\t")[-2 if text_b else -1]
    assert test.index == (0 if name == "MRPC" else 7)  # MRPC's test rows carry no index in the official reader


def test_an_elue_file_too_narrow_for_the_official_positions_names_its_header(tmp_path):
    (tmp_path / "SNLI").mkdir()
    (tmp_path / "SNLI" / "dev.tsv").write_text("text\ny\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"dev.tsv:1: header \['text'\] names none of the expected columns"):
        load_split("elue/SNLI", tmp_path, "dev")
    # GLUE tasks keep the strict header check
    (tmp_path / "RTE").mkdir()
    (tmp_path / "RTE" / "dev.tsv").write_text("a\tb\tc\td\n0\tx\ty\tentailment\n", encoding="utf-8")
    with pytest.raises(DataError, match="lacks the text column"):
        load_split("RTE", tmp_path, "dev")


def _write(tmp_path, task, split, text):
    folder = tmp_path / task
    folder.mkdir(exist_ok=True)
    path = folder / f"{split}.tsv"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "task,text,message",
    [
        ("RTE", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\ta\tb\n", r"train\.tsv:3: expected 4"),
        ("RTE", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n", r"train\.tsv:2: unknown label 'maybe'"),
        ("STS-B", "sentence1\tsentence2\tscore\na\tb\tfive\n", r"train\.tsv:2: label 'five' is not a finite number"),
        ("SST-2", "", r"train\.tsv: empty file"),
        ("SST-2", "sentence\tlabel\n", r"train\.tsv: header only"),
        ("SST-2", "sentence\tlabel\na\t1\n\nb\t0\n", r"train\.tsv:3: blank line"),
        ("SST-2", "text\tlabel\na\t1\n", r"train\.tsv:1: header .* lacks the text column"),
        ("SST-2", "sentence\tscore\na\t1\n", r"train\.tsv:1: header .* has no label column"),
    ],
)
def test_bad_files_name_file_and_line(tmp_path, task, text, message):
    _write(tmp_path, task, "train", text)
    with pytest.raises(DataError, match=message):
        load_split(task, tmp_path, "train")


def test_missing_split_and_missing_dir(tmp_path):
    _write(tmp_path, "RTE", "train", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n")
    with pytest.raises(DataError, match=r"RTE/dev\.tsv: no 'dev' split for task RTE \(files in .*: train\.tsv\)"):
        load_split("RTE", tmp_path, "dev")
    with pytest.raises(DataError, match="does not exist"):
        load_split("RTE", tmp_path / "nowhere", "dev")


def test_metrics_match_sklearn_scipy_in_percent():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 200)
    logits = rng.normal(size=(200, 2)) + np.eye(2)[y] * 0.8
    pred = logits.argmax(1)
    mrpc = get_task("MRPC").compute_metrics(logits, y)
    assert mrpc["accuracy"] == pytest.approx(100 * accuracy_score(y, pred))
    assert mrpc["f1"] == pytest.approx(100 * f1_score(y, pred))
    assert mrpc["score"] == pytest.approx((mrpc["f1"] + mrpc["accuracy"]) / 2)
    assert get_task("CoLA").compute_metrics(pred, y)["score"] == pytest.approx(100 * matthews_corrcoef(y, pred))
    s = rng.uniform(0, 5, 100)
    p = s + rng.normal(size=100)
    st = get_task("STS-B").compute_metrics(p[:, None], s)
    assert st["pearson"] == pytest.approx(100 * pearsonr(p, s)[0])
    assert st["spearman"] == pytest.approx(100 * spearmanr(p, s)[0])
    assert get_task("STS-B").compute_metrics(np.ones(100), s)["pearson"] == 0.0  # constant predictions
    assert get_task("SST-2").main_metric == "score"


def test_benchmark_aggregates():
    scores = {"CoLA": 50.0, "MNLI": 80.0, "MNLI-mm": 82.0, "RTE": 60.0}
    assert benchmark_score(scores, "glue") == pytest.approx((50 + 81 + 60) / 3)
    assert benchmark_score({"elue/SST-2": 90.0, "SNLI": 80.0}, "elue") == pytest.approx(85.0)
    with pytest.raises(ValueError):
        benchmark_score(scores, "superglue")


def test_encode_examples_respects_explicit_lengths(tokenizer):
    long = Example(text_a="word " * 300, text_b=None, label=1, index=0)
    short = Example(text_a="a fine film", text_b=None, label=0, index=1)
    enc = encode_examples(tokenizer, [long, short], max_length=200)
    assert enc["input_ids"].shape == (2, 200)  # not cut to the tokenizer.json's built-in 128
    assert enc["attention_mask"][1].sum() == 5 and enc["labels"].tolist() == [1, 0]
    assert encode_examples(tokenizer, [short], max_length=16)["input_ids"].shape == (1, 5)  # no padding to 128
    pair = Example(text_a="a b c", text_b="d e", label=2.5, index=7)
    enc = encode_examples(tokenizer, [pair], 32)
    assert enc["token_type_ids"].tolist() == [[0, 0, 0, 0, 0, 1, 1, 1]] and enc["labels"].dtype.is_floating_point
    batches = list(iterate_batches(tokenizer, [short] * 5, 2, 16, shuffle=True, seed=1))
    assert [b["input_ids"].shape[0] for b in batches] == [2, 2, 1]
    assert len(subsample([short] * 10, 3, seed=0)) == 3
