"""FLOPs of token-level exit (`elasticbert.flops.token_exit_flops`): equal to the ELUE counter when every token runs
every layer, a count by hand on a small case, and what the ELUE submission's TokenLayer module runs."""

import math

import pytest
import torch
from tiny_models import tiny_config
from torch.utils.flop_counter import FlopCounterMode

from elasticbert.flops import layer_flops, sample_flops, token_exit_flops, token_layer_flops
from finetune.hashee_report import TOKEN_LAYER_SOURCE, token_trace
from finetune.score.submission import model_definition


@pytest.mark.parametrize("n", [1, 7, 33])
def test_every_token_at_every_layer_is_the_elue_count(n):
    config = tiny_config(num_labels=3)
    assert token_layer_flops(config, n, n) == layer_flops(config, n)
    assert token_exit_flops(config, n, [n] * config.num_hidden_layers) == sample_flops(config, n, 4)


def test_a_small_case_by_hand():
    """h = 4, I = 8, 2 heads, 3 tokens of which 1 runs: Q and output 1·16 each, K and V 3·16 each, FFN 2·1·32 MACs
    -> 2·(16 + 16 + 48 + 48 + 64) = 384 matmul FLOPs, plus the products 2·1·3·4 MACs = 48 FLOPs; extras: scaling and
    softmax 2·2·1·3 MACs, two LayerNorms 2·(2·1·4) MACs -> 2·(12 + 16) = 56 FLOPs."""
    config = tiny_config(hidden_size=4, num_attention_heads=2, intermediate_size=8)
    flops = token_layer_flops(config, 1, 3)
    assert (flops.matmul, flops.extra) == (384 + 48, 56)
    assert token_layer_flops(config, 0, 3).total == 0  # a layer nobody runs is skipped
    whole = token_exit_flops(config, 3, [3, 1, 0, 0])
    expected = 2 * 2 * 3 * 4 + layer_flops(config, 3).total + flops.total + 2 * (4 * 4 + 4 * 2)
    assert whole.total == expected


def test_running_counts_must_fit_the_sample():
    with pytest.raises(ValueError, match="running tokens"):
        token_exit_flops(tiny_config(), 3, [4, 1])


def test_the_submissions_token_layer_runs_the_counted_matmuls():
    """ELUE runs `layer_i` of a HashEE trace on an input of the traced (r, n, H): the submission's model.py's
    TokenLayer costs what our counter counts for its products and projections."""
    config = tiny_config(num_labels=2)
    namespace: dict = {}
    exec(model_definition(config) + TOKEN_LAYER_SOURCE, namespace)  # noqa: S102 - the file the submission writes
    modules = namespace["build"]()
    r, n, h = 3, 7, config.hidden_size
    with FlopCounterMode(display=False) as counter:
        out = modules["layer_2"](torch.randn(1, r, n, h))
    assert out.shape == (1, r, h)
    assert counter.get_total_flops() == token_layer_flops(config, r, n).matmul
    assert token_trace(7, [7, 3, 0, 0], 32) == "(7),emb; (7,7,32),layer_1; (3,7,32),layer_2; (32),exit_4"
    assert math.isclose(token_layer_flops(config, r, n).matmul, counter.get_total_flops())
