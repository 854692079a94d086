"""Analytic FLOPs (ELUE conventions) against torch's own FLOP counter, and the parameter count."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from elasticbert import ElasticBertForSequenceClassification, ElasticBertModel
from elasticbert.flops import encoder_parameter_count, exit_flops, layer_flops, sample_flops


def _cpu_flash_attention_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
    return sdpa_flop_count(query_shape, key_shape, value_shape)


# torch's counter registers the CUDA attention kernels but not the CPU flash-attention one that SDPA dispatches to
# here; count it with torch's own SDPA formula (2·b·h·s_q·s_k·(d_qk + d_v)).
CPU_SDPA = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_attention_flops}


def _counted(model, *args, **kwargs):
    counter = FlopCounterMode(display=False, custom_mapping=CPU_SDPA)
    with counter, torch.no_grad():
        model(*args, **kwargs)
    return counter.get_total_flops()


@pytest.mark.parametrize("exit_type", ["linear", "mha"])
@pytest.mark.parametrize("seq_len,exit_layer", [(7, 1), (23, 3), (40, 4)])
def test_analytic_matmul_flops_match_flop_counter(tiny_config, exit_type, seq_len, exit_layer):
    cfg = tiny_config(
        hidden_size=64,
        intermediate_size=256,
        exit_type=exit_type,
        num_labels=3,
        exit_layers=[exit_layer],
        exit_mha_dim=16,
        exit_mha_heads=4,
    )
    model = ElasticBertForSequenceClassification(cfg).eval()
    ids = torch.randint(1, cfg.vocab_size, (1, seq_len))
    counted = _counted(model, ids)
    analytic = sample_flops(cfg, seq_len, exit_layer)
    assert abs(analytic.matmul - counted) <= 0.01 * counted, (analytic.matmul, counted)
    # The conventions add softmax/scaling and LayerNorm terms on top (a few percent at this size).
    assert analytic.total > analytic.matmul


def test_batch_and_layer_scaling(tiny_config):
    cfg = tiny_config(hidden_size=64, intermediate_size=256)
    model = ElasticBertModel(cfg).eval()
    ids = torch.randint(1, cfg.vocab_size, (4, 16))
    counted = _counted(model, ids, exit_layers=[2])
    assert counted == pytest.approx(4 * 2 * layer_flops(cfg, 16).matmul, rel=1e-9)


def test_elue_conventions_hand_computed(tiny_config):
    """One layer at n=10, H=32, I=64, 4 heads, by hand from the ELUE counter's rules (MACs, then ×2)."""
    cfg = tiny_config()
    n, h, i, a = 10, 32, 64, 4
    macs = 3 * n * h * h + a * (n * n + (h // a) * n * n + n * n + n * n * (h // a))  # self-attention hook
    macs += n * h * h + 2 * n * h  # attention output dense + LayerNorm
    macs += n * h * i + n * i * h + 2 * n * h  # FFN + LayerNorm
    assert layer_flops(cfg, n).total == 2 * macs
    assert exit_flops(cfg, n, "linear").total == 2 * (h * h + h * cfg.num_labels)


def test_parameter_count(tiny_config):
    cfg = tiny_config()
    assert encoder_parameter_count(cfg) == ElasticBertModel(cfg).num_parameters()
