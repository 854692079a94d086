"""`data.group_by_length`: fine-tuning batches of similar-length examples (finetune.data.iterate_batches).

What must hold: every example once per epoch, every rank as many batches as without grouping, a pure function of the
seed (a resume from any batch sees the uninterrupted run's batches: bit-identical runs, tested through a real
preempted run), far less padding on real GLUE, and per-exit losses of a grouped batch equal to the same examples
padded to max_length.
"""

from __future__ import annotations

import pytest
import torch
from finetune_preemption import STEPS, results, signal_after_step, train_argv

from elasticbert import ElasticBertForSequenceClassification
from finetune.__main__ import main
from finetune.data import LENGTH_POOL, encode_examples, iterate_batches
from finetune.tasks import load_split


@pytest.fixture(scope="module")
def cola(glue_dir):
    return load_split("CoLA", glue_dir, "train")


def _batches(tokenizer, examples, grouped, world=1, rank=0, start=0, batch=8, drop_last=False):
    return list(
        iterate_batches(
            tokenizer, examples, batch, 64, shuffle=True, seed=3, drop_last=drop_last, shard=(rank, world),
            start_batch=start, group_by_length=grouped,
        )
    )  # fmt: skip


@pytest.mark.parametrize("world,drop_last", [(1, False), (2, False), (3, True)])
def test_an_epoch_covers_every_example_once_and_ranks_keep_their_batch_counts(tokenizer, cola, world, drop_last):
    examples = cola[: LENGTH_POOL * 8 * world + 37]  # full pools and a partial one
    for rank in range(world):
        plain = _batches(tokenizer, examples, False, world, rank, drop_last=drop_last)
        grouped = _batches(tokenizer, examples, True, world, rank, drop_last=drop_last)
        assert len(grouped) == len(plain)
    seen = [int(i) for r in range(world) for b in _batches(tokenizer, examples, True, world, r, drop_last=drop_last)
            for i in b["index"]]  # fmt: skip
    expected = len(examples) - (len(examples) % 8 if drop_last else 0)
    assert len(seen) == len(set(seen)) == expected


def test_a_grouped_batch_is_what_encoding_its_examples_gives(tokenizer, cola):
    by_index = {e.index: e for e in cola}
    for batch in _batches(tokenizer, cola[:900], True)[:20]:
        alone = encode_examples(tokenizer, [by_index[int(i)] for i in batch["index"]], 64)
        assert batch.keys() == alone.keys() and all(torch.equal(batch[k], alone[k]) for k in batch)


def test_the_order_is_a_function_of_the_seed_and_a_resume_sees_the_rest(tokenizer, cola):
    examples = cola[: LENGTH_POOL * 8 * 2 + 100]
    full = _batches(tokenizer, examples, True, world=2, rank=1)
    assert [b["index"].tolist() for b in full] == [
        b["index"].tolist() for b in _batches(tokenizer, examples, True, 2, 1)
    ]
    for start in (1, LENGTH_POOL - 1, LENGTH_POOL, LENGTH_POOL + 7):  # inside, at the end of, and past a pool
        rest = _batches(tokenizer, examples, True, world=2, rank=1, start=start)
        assert [b["index"].tolist() for b in rest] == [b["index"].tolist() for b in full[start:]]


def test_grouping_removes_most_of_cola_padding(tokenizer, cola):
    def padding(batches):
        real = sum(int(b["attention_mask"].sum()) for b in batches)
        return 1 - real / sum(b["input_ids"].numel() for b in batches)

    plain = padding(_batches(tokenizer, cola, False, batch=32))
    grouped = padding(_batches(tokenizer, cola, True, batch=32))
    print(
        f"CoLA train, batch 32, padded to each batch's longest: {plain:.1%} padding; grouped by length: {grouped:.1%}"
    )
    assert plain > 0.4 and grouped < 0.08


@pytest.mark.parametrize("exit_type", ["linear", "mha"])
def test_per_exit_losses_equal_those_of_the_examples_padded_to_max_length(tokenizer, minilm, cola, exit_type):
    torch.manual_seed(0)
    model = ElasticBertForSequenceClassification.from_pretrained(
        minilm, num_labels=2, exit_type=exit_type, exit_layers=[2, 4, 6]
    ).eval()
    batch = next(b for b in _batches(tokenizer, cola[:900], True, batch=16) if b["input_ids"].shape[1] < 40)
    examples = {e.index: e for e in cola}
    full = encode_examples(tokenizer, [examples[int(i)] for i in batch["index"]], 128)
    full = {k: torch.nn.functional.pad(v, (0, 128 - v.shape[1])) if v.dim() == 2 else v for k, v in full.items()}
    assert full["input_ids"].shape[1] == 128 > batch["input_ids"].shape[1]
    with torch.no_grad():
        grouped = model(**{k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids", "labels")})
        padded = model(**{k: full[k] for k in ("input_ids", "attention_mask", "token_type_ids", "labels")})
    losses = [torch.nn.functional.cross_entropy(logits, batch["labels"]) for logits in grouped.exit_logits]
    reference = [torch.nn.functional.cross_entropy(logits, batch["labels"]) for logits in padded.exit_logits]
    torch.testing.assert_close(torch.stack(losses), torch.stack(reference), rtol=1e-5, atol=1e-6)


def test_a_grouped_run_preempted_mid_epoch_resumes_bit_identical(tmp_path, monkeypatch, capsys):
    grouped = ("--set", "data.group_by_length=true")
    reference = tmp_path / "reference"
    assert main(train_argv(reference, "jt", *grouped)) == 0
    other = tmp_path / "ungrouped"
    assert main(train_argv(other, "jt")) == 0
    run = tmp_path / "run"
    with monkeypatch.context() as mp:
        signal_after_step(mp, STEPS - 1)  # inside the second epoch: its pool is tokenised and partly skipped
        assert main(train_argv(run, "jt", *grouped)) == 75
    capsys.readouterr()
    assert main(train_argv(run, "jt")) == 2  # the setting is part of the run: resuming without it is refused
    assert "data.group_by_length" in capsys.readouterr().err
    assert main(train_argv(run, "jt", *grouped)) == 0
    assert results(run) == results(reference)
    assert results(other) != results(reference)  # grouping made other batches (the test can fail)
