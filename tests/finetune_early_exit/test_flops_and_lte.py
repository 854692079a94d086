"""Per-sample FLOPs of real runs against the analytic formula and torch's FLOP counter; LTE head training."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from elasticbert.flops import embedding_flops, exit_flops, layer_flops
from finetune.serve.early_exit import (
    LearnedExitHead,
    exit_errors,
    make_rule,
    per_sample_flops,
    run_batch,
    run_dataset,
    static_flops,
    train_lte_head,
)


def _cpu_sdpa(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
    return sdpa_flop_count(query_shape, key_shape, value_shape)


CPU_SDPA = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa}


def _mixed_rule(model, split):
    """Patience 1: samples leave wherever two consecutive exits first agree, so exit layers vary."""
    return make_rule("patience", 1, model.config.num_labels)


def test_per_sample_flops_are_the_formula_summed_over_what_ran(classifier, sst2_dev):
    cfg = classifier.config
    result, _ = run_dataset(classifier, sst2_dev.batches(8), _mixed_rule(classifier, sst2_dev))
    total, matmul = per_sample_flops(cfg, result)
    assert len(set(result.exit_layers.tolist())) >= 2
    for i in range(len(sst2_dev)):
        n, layer = int(sst2_dev.lengths[i]), int(result.exit_layers[i])
        heads = [e for e in classifier.exit_layers if e <= layer]  # every exit passed on the way, the last included
        assert result.trace(i) == tuple(heads)
        expected = embedding_flops(cfg, n)
        for _ in range(layer):
            expected = expected + layer_flops(cfg, n)
        for _ in heads:
            expected = expected + exit_flops(cfg, n)
        assert total[i] == pytest.approx(expected.total, rel=1e-12)
        assert matmul[i] == pytest.approx(expected.matmul, rel=1e-12)
    # real (unpadded) lengths: a short sample costs less than a long one exiting at the same layer
    assert static_flops(cfg, sst2_dev.lengths, 6).std() > 0


def _counted(model, split, i, rule, lte_dim=0):
    ids = split.input_ids[i : i + 1, : int(split.lengths[i])]
    types = split.token_type_ids[i : i + 1, : int(split.lengths[i])]
    counter = FlopCounterMode(display=False, custom_mapping=CPU_SDPA)
    with counter:
        result = run_batch(model, ids, torch.ones_like(ids), types, rule)
    _, matmul = per_sample_flops(model.config, result, lte_dim)
    return counter.get_total_flops(), float(matmul[0]), int(result.exit_layers[0])


@pytest.mark.parametrize("kind", ["linear", "mha", "lte"])
def test_flops_match_torch_flop_counter(kind, classifier, mha_classifier, sst2_dev):
    """Batch 1 (no padding): what torch counts equals the matmul part of the sample's analytic FLOPs."""
    model = mha_classifier if kind == "mha" else classifier
    lte_dim = 0
    rule = _mixed_rule(model, sst2_dev)
    if kind == "lte":
        head = LearnedExitHead(model.config.hidden_size)
        rule, lte_dim = make_rule("lte", 0.5, 2, lte_head=head), model.config.hidden_size
        with torch.no_grad():
            head.linear.weight.normal_(0, 0.05)
    layers = set()
    for i in range(0, len(sst2_dev), 5):
        counted, analytic, layer = _counted(model, sst2_dev, i, rule, lte_dim)
        layers.add(layer)
        assert analytic == pytest.approx(counted, rel=1e-9), (i, layer)
    if kind != "lte":
        assert len(layers) >= 2, layers


def test_lte_head_training_and_round_trip(classifier, sst2_dev, tmp_path):
    head, stats = train_lte_head(classifier, sst2_dev, epochs=20)
    assert stats["final_mse"] <= stats["initial_mse"]
    assert set(stats) >= {"samples", "error_rate_exit1", "error_rate_exit6"}
    path = tmp_path / "lte.safetensors"
    head.save(path, {"task": "SST-2"})
    loaded = LearnedExitHead.load(path)
    x = torch.randn(5, classifier.config.hidden_size)
    torch.testing.assert_close(loaded(x), head(x))
    # the default LTE sweep: quantiles of the head's predictions where it is consulted (increasing, in (0, 1))
    assert len(loaded.suggested_thresholds) == 7 and loaded.suggested_thresholds == head.suggested_thresholds
    assert loaded.suggested_thresholds == sorted(loaded.suggested_thresholds)
    assert 0 < loaded.suggested_thresholds[0] and loaded.suggested_thresholds[-1] < 1


def test_exit_errors():
    logits = torch.tensor([[[2.0, 0.0], [0.0, 1.0]]])  # one sample, two exits
    assert exit_errors(logits, torch.tensor([0])).tolist() == [[0.0, 1.0]]
    reg = torch.tensor([[[1.0], [3.0]]])
    torch.testing.assert_close(exit_errors(reg, torch.tensor([1.0])), torch.tanh(torch.tensor([[0.0, 2.0]])))
