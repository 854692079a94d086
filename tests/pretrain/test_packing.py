"""Packing (`data.packing`): a micro-batch's samples several to a row, on real prepared Gutenberg samples.

What must hold: the packed step computes what the padded step computes — per-exit MLM and SOP losses and every
gradient equal (fp32, CPU, 1e-5 relative) for one exit group and for two, with gradient equilibrium — and no
sample sees another one's tokens (checked by changing a neighbour's tokens; the same check fails without the mask).
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from pretrain_testlib import TINY

import elasticbert.backbone as backbone
from data_prep.reader import PreparedCorpus
from elasticbert import ElasticBertConfig, ElasticBertForPreTraining, exit_groups
from pretrain.collation import IGNORE_INDEX, Collator, collate, pack, pack_rows, row_plan
from pretrain.config import RunConfig, config_problems, load_config
from pretrain.data import (
    BlendedDataset,
    MaskingConfig,
    PretrainingDataset,
    RankBatches,
    SampleOrder,
    load_or_build_index,
)

SEQ = 128
LAYERS = 4


@pytest.fixture(scope="module")
def dataset(prepared_gutenberg, tmp_path_factory):
    """Many short samples (short_seq_prob 0.5), so that rows hold several samples."""
    corpus = PreparedCorpus(prepared_gutenberg, "train")
    index, _, _ = load_or_build_index(corpus, "train", SEQ, 0.5, 3, [tmp_path_factory.mktemp("idx")])
    return PretrainingDataset(corpus, index, MaskingConfig(SEQ, 0.15, 3, 3))


@pytest.fixture(scope="module")
def items(dataset):
    return [dataset[i] for i in range(0, 48, 3)]  # 16 samples, a micro-batch


def tiny_model(vocab_size: int) -> ElasticBertForPreTraining:
    torch.manual_seed(0)
    config = ElasticBertConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=SEQ,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return ElasticBertForPreTraining(config).float()


def model_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in batch.items() if k != "keys"}  # what the trainer hands the engine


# --------------------------------------------------------------------------------------------------- the packing


def test_rows_hold_every_sample_once_within_capacity_deterministically():
    rng = np.random.default_rng(0)
    for _ in range(200):
        capacity = int(rng.choice([16, 128, 512]))
        lengths = rng.integers(1, capacity + 1, size=int(rng.integers(1, 64))).tolist()
        rows = pack_rows(lengths, capacity)
        assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
        assert all(sum(lengths[i] for i in row) <= capacity for row in rows)
        assert all(row == sorted(row) for row in rows)  # batch order within a row
        assert rows == pack_rows(list(lengths), capacity)
        # best fit: no two rows could be merged, and never more rows than one per sample
        fills = sorted(sum(lengths[i] for i in row) for row in rows)
        assert len(fills) < 2 or fills[0] + fills[1] > capacity
    assert pack_rows([100, 28, 60, 40, 30, 40], 128) == [[0, 1], [2, 3], [4, 5]]  # longest first, best fit
    with pytest.raises(ValueError, match="sample 1 has 129 tokens"):
        pack_rows([5, 129], 128)


def test_the_row_plan_holds_every_sample_within_its_width_and_pads_less_than_best_fit_rows():
    rng = np.random.default_rng(1)
    padding = {"plan": 0, "best fit": 0}
    for _ in range(100):
        capacity = int(rng.choice([128, 512]))
        # short documents: most samples well under capacity, a few cut at it (WikiText-2's paragraphs at 512)
        lengths = np.minimum(rng.geometric(8 / capacity, size=int(rng.integers(1, 48))) + 8, capacity).tolist()
        rows, width = row_plan(lengths, capacity)
        assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
        assert all(row == sorted(row) for row in rows)  # batch order within a row
        assert max(lengths) <= width <= capacity and (width % 8 == 0 or width == capacity)
        assert all(sum(lengths[i] for i in row) <= width for row in rows)
        assert (rows, width) == row_plan(list(lengths), capacity)  # a pure function of the lengths
        best_fit = pack_rows(lengths, capacity)  # one of the plans it starts from: never more tokens than that
        fill = max(sum(lengths[i] for i in row) for row in best_fit)
        assert len(rows) * width <= len(best_fit) * min(-(-fill // 8) * 8, capacity)
        padding["plan"] += len(rows) * width - sum(lengths)
        padding["best fit"] += len(best_fit) * min(-(-fill // 8) * 8, capacity) - sum(lengths)
    assert padding["plan"] < 0.5 * padding["best fit"], padding
    # three samples of 64: two rows of 128 hold them with 64 tokens of padding, three rows of 64 with none
    assert row_plan([64, 64, 64], 128) == ([[0], [1], [2]], 64)
    # the same tokens either way (no padding): the narrower rows, whose attention is cheaper
    assert row_plan([64, 64, 64, 64], 128) == ([[0], [1], [2], [3]], 64)
    assert row_plan([64, 64, 30, 34], 128) == ([[0], [1], [2, 3]], 64)


def test_a_packed_batch_carries_each_sample_whole_in_batch_order(items):
    batch = pack([{**it, "key": np.asarray([0, i])} for i, it in enumerate(items)], pad_id=0, capacity=SEQ)
    rows, width = batch["input_ids"].shape
    assert rows < len(items) and width % 8 == 0 and width <= SEQ
    assert batch["sop_labels"].tolist() == [int(it["sop_label"]) for it in items]
    assert batch["keys"][:, 1].tolist() == list(range(len(items)))
    assert torch.equal(batch["attention_mask"], (batch["sample_ids"] > 0).long())
    assert int(batch["attention_mask"].sum()) == sum(len(it["input_ids"]) for it in items)
    flat = {k: batch[k].reshape(-1) for k in ("input_ids", "token_type_ids", "mlm_labels", "sample_ids")}
    for i, it in enumerate(items):
        start = int(batch["cls_positions"][i])
        span = slice(start, start + len(it["input_ids"]))
        assert (flat["sample_ids"][span] == i + 1).all() and int(
            (flat["sample_ids"] == i + 1).sum()
        ) == span.stop - start
        assert flat["input_ids"][span].tolist() == it["input_ids"].tolist()
        assert flat["token_type_ids"][span].tolist() == it["token_type_ids"].tolist()
        assert flat["mlm_labels"][span].tolist() == it["mlm_labels"].tolist()
    assert (batch["mlm_labels"][batch["sample_ids"] == 0] == IGNORE_INDEX).all()


def test_a_micro_batch_that_packing_barely_shrinks_stays_padded():
    def sample(n):
        return {
            "input_ids": np.arange(n) + 5,
            "token_type_ids": np.zeros(n),
            "mlm_labels": np.full(n, -100),
            "sop_label": 0,
        }

    near_full = [sample(n) for n in (128, 120, 124, 8)]  # packing saves one row of four: 25 %
    assert pack(near_full, capacity=SEQ)["input_ids"].shape[0] == 3
    assert "sample_ids" not in pack(near_full, capacity=SEQ, min_saving=0.3)  # a padded batch, as collate makes it
    full = [sample(n) for n in (128, 120, 124, 100)]  # nothing to pack: one sample per padded row
    padded = pack(full, capacity=SEQ)
    assert "sample_ids" not in padded and all(torch.equal(padded[k], v) for k, v in collate(full).items())


def test_packing_removes_the_padding_of_real_samples(items):
    padded = collate(items)
    packed = pack(items, capacity=SEQ)
    real = int(padded["attention_mask"].sum())
    before = 1 - real / padded["input_ids"].numel()
    after = 1 - real / packed["input_ids"].numel()
    print(f"padding {before:.1%} -> {after:.1%}, {len(items)} samples in {packed['input_ids'].shape[0]} rows")
    assert before > 0.2 and after < before / 2


# ------------------------------------------------------------------------------------------- equal training


def _step(model, batch, exits):
    model.zero_grad(set_to_none=True)
    out = model(**model_inputs(batch), active_exits=exits, gradient_equilibrium=True)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("num_groups", [1, 2])
def test_a_packed_step_has_the_padded_steps_losses_and_gradients(items, num_groups):
    model = tiny_model(30522)
    padded, packed = collate(items), pack(items, capacity=SEQ)
    assert packed["input_ids"].shape[0] < padded["input_ids"].shape[0]
    for exits in exit_groups(LAYERS, num_groups):
        ref, ref_grads = _step(model, padded, exits)
        out, grads = _step(model, packed, exits)
        assert out.exit_layers == ref.exit_layers == tuple(exits)
        for name in ("mlm_loss", "sop_loss", "mlm_accuracy", "sop_accuracy"):
            torch.testing.assert_close(getattr(out, name), getattr(ref, name), rtol=1e-5, atol=0, msg=name)
        torch.testing.assert_close(out.loss, ref.loss, rtol=1e-5, atol=0)
        assert out.num_masked == ref.num_masked
        assert grads.keys() == ref_grads.keys()
        for name, g in ref_grads.items():
            scale = float(g.abs().max())
            worst = float((grads[name] - g).abs().max())
            # + 1e-10: the key biases' gradients are zero up to rounding (a softmax ignores a shift), ~1e-13 here
            assert worst <= 1e-5 * scale + 1e-10, (
                f"exits {exits}, {name}: max |Δgrad| {worst:.3g} vs max |grad| {scale:.3g}"
            )


def test_the_masked_positions_come_from_the_host_and_spare_the_models_nonzero(items, monkeypatch):
    """Both collations hand the model the masked tokens' flattened indices (found on the host), and a step given
    them equals the step that finds them itself: so the trainer's forward never runs `nonzero` (a host sync on a
    GPU). Without them (a transformers caller) the model still finds them."""
    model = tiny_model(30522)
    for batch in (collate(items), pack(items, capacity=SEQ)):
        expected = (batch["mlm_labels"].reshape(-1) != IGNORE_INDEX).nonzero().squeeze(1)
        assert torch.equal(batch["mlm_positions"], expected) and len(expected) > 0
        exits = tuple(range(1, LAYERS + 1))
        found, found_grads = _step(model, {k: v for k, v in batch.items() if k != "mlm_positions"}, exits)
        with monkeypatch.context() as patched:
            patched.setattr(torch.Tensor, "nonzero", lambda *a, **k: pytest.fail("the model ran nonzero"))
            given, given_grads = _step(model, batch, exits)
        assert given.num_masked == found.num_masked == len(expected)
        assert torch.equal(given.loss, found.loss) and torch.equal(given.mlm_accuracy, found.mlm_accuracy)
        assert all(torch.equal(given_grads[name], g) for name, g in found_grads.items())


def _hidden(model, batch):
    inputs = model_inputs(batch)
    out = model.elasticbert(
        inputs["input_ids"],
        attention_mask=inputs["attention_mask"],
        token_type_ids=inputs["token_type_ids"],
        sample_ids=inputs["sample_ids"],
        output_hidden_states=True,
    )
    return torch.stack(out.hidden_states)  # [layers + 1, R, T, H]


def _neighbour_leak(model, items):
    """Change every token of one sample that shares a row; return how far the other samples' hidden states move."""
    batch = pack(items, capacity=SEQ)
    sample_ids = batch["sample_ids"]
    row = int(torch.argmax(sample_ids.max(1).values - sample_ids.masked_fill(sample_ids == 0, 10**6).min(1).values))
    victim = int(sample_ids[row].max())  # the last sample of a row holding several
    assert int(sample_ids[row][0]) != victim
    changed = {k: v.clone() for k, v in batch.items()}
    where = sample_ids == victim
    changed["input_ids"][where] = torch.randint(1000, 2000, (int(where.sum()),))
    changed["token_type_ids"][where] = 1 - changed["token_type_ids"][where]
    with torch.no_grad():
        a, b = _hidden(model, batch), _hidden(model, changed)
    others = (sample_ids != victim) & (sample_ids > 0)
    assert float((a - b)[:, where].abs().max()) > 1e-2  # the change itself is visible where it was made
    return float((a - b)[:, others].abs().max())


def test_no_sample_sees_another_samples_tokens(items, monkeypatch):
    model = tiny_model(30522).eval()
    assert _neighbour_leak(model, items) <= 1e-6
    # the same check with a padding-only mask (the row as one text) sees the leak: it can fail
    monkeypatch.setattr(backbone, "packed_attention_mask", lambda ids: (ids > 0)[:, None, None, :])
    assert _neighbour_leak(model, items) > 1e-3


# ------------------------------------------------------------------------------------------------ the trainer


def test_workers_build_the_same_packed_batches(dataset):
    order = SampleOrder([len(dataset)], [1.0], seed=2)
    collator = Collator(0, packing=True, max_length=SEQ)
    assert pickle.loads(pickle.dumps(collator)).packing

    def batches(workers):
        loader = torch.utils.data.DataLoader(
            BlendedDataset([dataset]),
            batch_sampler=RankBatches(order, 32, 16, 8, 0, 2),
            collate_fn=collator,
            num_workers=workers,
            prefetch_factor=2 if workers else None,
        )
        it = iter(loader)
        return [next(it) for _ in range(4)]

    for a, b in zip(batches(0), batches(2)):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        assert a["keys"].shape[0] == 8 and a["input_ids"].shape[0] <= 8


def test_packing_is_the_default_and_is_refused_with_compile():
    cfg = RunConfig()
    assert cfg.data.packing is True
    unpacked = RunConfig()
    unpacked.data.packing = False
    assert cfg.semantic_hash() == unpacked.semantic_hash()  # a resume may switch it
    cfg.train.compile = unpacked.train.compile = True
    assert any("train.compile=true needs data.packing=false" in p for p in config_problems(cfg))
    assert not any("packing" in p for p in config_problems(unpacked))


def test_the_tiny_runs_of_the_resume_tests_pack(prepared_gutenberg, tmp_path):
    """tests/pretrain/test_training.py and tests/faults/test_pretrain.py run configs/tiny_cpu.yaml on this data with
    packing on by default: their first steps do hold packed micro-batches (so their exactness covers packing)."""
    cfg = load_config(TINY)
    corpus = PreparedCorpus(prepared_gutenberg, "train")
    d = cfg.data
    index, _, _ = load_or_build_index(corpus, "train", d.max_length, d.short_seq_prob, cfg.train.seed, [tmp_path])
    dataset = PretrainingDataset(
        corpus, index, MaskingConfig(d.max_length, d.masked_lm_prob, d.max_ngram, cfg.train.seed)
    )
    order = SampleOrder([len(dataset)], [1.0], cfg.train.seed)
    collator = Collator(0, 8, d.packing, d.max_length)
    batches = RankBatches(order, 0, cfg.train.global_batch_size, cfg.train.micro_batch_size, 0, 2)
    micro = [
        collator([{**dataset[i], "key": np.asarray([k, i])} for k, i in keys]) for keys, _ in zip(batches, range(12))
    ]
    packed = [b for b in micro if "sample_ids" in b]
    print(f"{len(packed)} of {len(micro)} micro-batches packed")
    assert d.packing and len(packed) >= 3
