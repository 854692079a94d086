"""The statistics that cross the ranks: named fields, one flat tensor, one all-reduce (here a fake of two ranks)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from pretrain.stats import EvalSums, StepStats


class TwoRanks:
    """`all_reduce` as if a second rank held the same tensor: sums double."""

    calls = 0

    def all_reduce(self, t):
        self.calls += 1
        t.mul_(2)


def _out(k, base):
    v = torch.arange(1, k + 1, dtype=torch.float32) * base
    return SimpleNamespace(
        loss=torch.tensor(base * 10.0), mlm_loss=v, sop_loss=v + 1, mlm_accuracy=v / 10, sop_accuracy=v / 100
    )


def _batch():
    labels = torch.full((2, 8), -100)
    labels[0, :3] = 7
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 6:] = 0
    return {"attention_mask": mask, "mlm_labels": labels, "input_ids": torch.zeros(2, 8, dtype=torch.long)}


def test_step_stats_pack_reduce_unpack():
    stats = StepStats.zeros(3, "cpu")
    for base in (1.0, 2.0):
        stats.add_micro_batch(_out(3, base), _batch())
    stats.data_wait_s += 0.5
    stats.comm_s += 0.25
    stats.vote_preemption(False)
    assert stats.pack().shape == (4 * 3 + 12,) and stats.pack().dtype == torch.float64
    dist = TwoRanks()
    total = stats.reduce_and_read(dist)
    v = total.values
    assert dist.calls == 1 and not total.preempted
    assert v["loss"] == 60.0 and v["tokens"] == 2 * 2 * 14 and v["masked"] == 12
    assert v["padded"] == 64 and v["data_wait_s"] == 1.0 and v["comm_s"] == 0.5
    reduced = StepStats.zeros(3, "cpu").all_reduce(TwoRanks())  # the tensor form (validation uses it)
    assert isinstance(reduced, StepStats) and reduced.mlm_loss.shape == (3,)
    means = total.exit_means(4)
    assert means["mlm_loss"] == [1.5, 3.0, 4.5] and means["sop_loss"] == [2.5, 4.0, 5.5]
    assert list(means) == ["mlm_loss", "sop_loss", "mlm_accuracy", "sop_accuracy"]


def test_preemption_vote_of_any_rank_stops_all():
    stats = StepStats.zeros(2, "cpu")
    stats.vote_preemption(True)
    assert stats.reduce_and_read(TwoRanks()).preempted


def test_eval_sums_weigh_mlm_by_tokens_and_sop_by_samples():
    sums = EvalSums.zeros(2, "cpu")
    sums.add_batch(_out(2, 1.0), _batch())
    record = sums.all_reduce(TwoRanks()).means()
    assert record["samples"] == 4
    assert record["mlm_loss"] == [1.0, 2.0] and record["sop_loss"] == [2.0, 3.0]


def test_a_step_is_read_once_and_carries_the_vote_the_norm_and_any_nan():
    stats = StepStats.zeros(3, "cpu")
    for base in (1.0, 2.0):
        stats.add_micro_batch(_out(3, base), _batch())
    stats.set_grad_norm(torch.tensor(0.75))
    stats.vote_preemption(True)
    reads = []
    real_tolist = torch.Tensor.tolist

    def counted(t):
        reads.append(t.shape)
        return real_tolist(t)

    torch.Tensor.tolist = counted
    try:
        totals = stats.reduce_and_read(TwoRanks())
    finally:
        torch.Tensor.tolist = real_tolist
    assert reads == [(4 * 3 + 12,)]  # one device-to-host read of the packed sums
    assert totals.preempted and totals.grad_norm == 0.75  # the same norm on both ranks, not summed
    assert totals.values["loss"] == 60.0 and totals.values["tokens"] == 2 * 2 * 14
    assert totals.exit_means(4)["mlm_loss"] == [1.5, 3.0, 4.5]
    assert all(isinstance(v, float | list) for v in totals.values.values())
    nan = StepStats.zeros(1, "cpu")
    nan.add_micro_batch(SimpleNamespace(**{**vars(_out(1, 1.0)), "loss": torch.tensor(float("nan"))}), _batch())
    nan.set_grad_norm(float("inf"))  # what DeepSpeed reports for an fp16 overflow
    read = nan.reduce_and_read(TwoRanks())
    assert read.values["loss"] != read.values["loss"] and read.grad_norm == float("inf") and not read.preempted
    assert StepStats.zeros(1, "cpu").reduce_and_read(TwoRanks()).grad_norm is None  # no norm from DeepSpeed


def test_a_packed_micro_batch_counts_its_samples_rows_and_attention_work():
    """Three samples of 3, 2 and 4 tokens in two rows of 5 (sample_ids 1-3; 0 = padding): 3 samples, 2 rows, 9 real
    tokens, Σ l² = 29 — what the same samples padded one to a row give, but for the rows."""
    sample_ids = torch.tensor([[1, 1, 1, 2, 2], [3, 3, 3, 3, 0]])
    packed = {
        "input_ids": torch.zeros(2, 5, dtype=torch.long),
        "attention_mask": (sample_ids > 0).long(),
        "mlm_labels": torch.full((2, 5), -100),
        "sample_ids": sample_ids,
        "sop_labels": torch.zeros(3, dtype=torch.long),
    }
    padded_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    padded = {
        "input_ids": torch.zeros(3, 4, dtype=torch.long),
        "attention_mask": padded_mask,
        "mlm_labels": torch.full((3, 4), -100),
        "sop_labels": torch.zeros(3, dtype=torch.long),
    }
    got = {}
    for name, batch in (("packed", packed), ("padded", padded)):
        stats = StepStats.zeros(1, "cpu")
        stats.add_micro_batch(_out(1, 1.0), batch)
        got[name] = {k: float(getattr(stats, k)) for k in ("samples", "rows", "tokens", "attended", "padded")}
    assert got["packed"] == {"samples": 3, "rows": 2, "tokens": 9, "attended": 29, "padded": 10}
    assert got["padded"] == {"samples": 3, "rows": 3, "tokens": 9, "attended": 29, "padded": 12}


def test_mfu_counts_the_attention_of_each_sample_at_its_own_length():
    """Samples of mixed lengths: the step's useful FLOPs are the sum of each sample's (Σ l² / Σ l as the attention
    length, the SOP head once per sample), not the mean length's; equal lengths give the old figure."""
    from elasticbert import ElasticBertConfig
    from elasticbert.flops import training_flops_per_token
    from pretrain.mfu import model_flops_utilization

    cfg = ElasticBertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=4, num_attention_heads=4)
    lengths, exits = [16, 64, 128], (2, 4)
    per_sample = sum(training_flops_per_token(cfg, exits, n, 0.15) * n for n in lengths)
    tokens = float(sum(lengths))
    attended = float(sum(n * n for n in lengths))
    mfu = model_flops_utilization(cfg, exits, tokens, 0.15 * tokens, 3, 1.0, 1.0, 1, attended)
    assert mfu == pytest.approx(per_sample, rel=1e-9)
    mean_only = model_flops_utilization(cfg, exits, tokens, 0.15 * tokens, 3, 1.0, 1.0, 1)
    assert mean_only < per_sample  # the mean length under-counts attention (Σ l² >= (Σ l)² / n)
    equal = model_flops_utilization(cfg, exits, 192.0, 0.15 * 192, 3, 1.0, 1.0, 1, 3 * 64.0**2)
    assert equal == pytest.approx(training_flops_per_token(cfg, exits, 64, 0.15) * 192, rel=1e-12)
