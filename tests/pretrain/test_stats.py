"""The statistics that cross the ranks: named fields, one flat tensor, one all-reduce (here a fake of two ranks)."""

from __future__ import annotations

from types import SimpleNamespace

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
    assert stats.pack().shape == (4 * 3 + 7,) and stats.pack().dtype == torch.float64
    dist = TwoRanks()
    total = stats.all_reduce(dist)
    assert dist.calls == 1 and not total.preempted
    assert float(total.loss) == 60.0 and float(total.tokens) == 2 * 2 * 14 and float(total.masked) == 12
    assert float(total.padded) == 64 and float(total.data_wait_s) == 1.0 and float(total.comm_s) == 0.5
    means = total.exit_means(4)
    assert means["mlm_loss"] == [1.5, 3.0, 4.5] and means["sop_loss"] == [2.5, 4.0, 5.5]
    assert list(means) == ["mlm_loss", "sop_loss", "mlm_accuracy", "sop_accuracy"]


def test_preemption_vote_of_any_rank_stops_all():
    stats = StepStats.zeros(2, "cpu")
    stats.vote_preemption(True)
    assert stats.all_reduce(TwoRanks()).preempted


def test_eval_sums_weigh_mlm_by_tokens_and_sop_by_samples():
    sums = EvalSums.zeros(2, "cpu")
    sums.add_batch(_out(2, 1.0), _batch())
    record = sums.all_reduce(TwoRanks()).means()
    assert record["samples"] == 4
    assert record["mlm_loss"] == [1.0, 2.0] and record["sop_loss"] == [2.0, 3.0]
