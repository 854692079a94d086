"""Packed rows (`data.packing`) on the GPU kernel the users' V100s have: SDPA's memory-efficient attention, forced, with
the block-diagonal mask (`elasticbert.masks.packed_attention_mask`), computes the padded step's losses and gradients.
FlashAttention takes no mask, so a packed step never runs on it; the V100 (sm_70) has no FlashAttention anyway. With
EB_CHECK_DEVICE=cpu the same comparison runs on the CPU's SDPA (no kernel forced)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from elasticbert import ElasticBertConfig, ElasticBertForPreTraining
from pretrain.collation import collate, pack

pytestmark = pytest.mark.gpu
SEQ = 128


def _items(count: int = 24, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    items = []
    for n in rng.integers(8, SEQ + 1, size=count).tolist():
        ids = rng.integers(5, 900, size=n)
        labels = np.where(rng.random(n) < 0.15, ids, -100)
        labels[0] = -100
        types = (np.arange(n) >= n // 2).astype(np.int64)
        items.append({"input_ids": ids, "token_type_ids": types, "mlm_labels": labels, "sop_label": int(n % 2)})
    return items


def _kernel(device: str):
    if device != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION)  # no fallback: an unsupported mask raises


def _step(model, batch, device):
    model.zero_grad(set_to_none=True)
    inputs = {k: v.to(device) for k, v in batch.items() if k != "keys"}
    with _kernel(device):
        out = model(**inputs, active_exits=(1, 3, 4), gradient_equilibrium=True)
        out.loss.backward()
    return out, {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_packed_step_equals_the_padded_step_on_the_memory_efficient_kernel(device, dtype):
    if device == "cpu" and dtype == torch.float16:
        pytest.skip("fp16 is the V100's precision: checked on the GPU")
    torch.manual_seed(0)
    config = ElasticBertConfig(
        vocab_size=1000, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=SEQ, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    model = ElasticBertForPreTraining(config).to(device=device, dtype=dtype)
    items = _items()
    padded, packed = collate(items), pack(items, capacity=SEQ)
    assert packed["input_ids"].shape[0] < padded["input_ids"].shape[0]
    ref, ref_grads = _step(model, padded, device)
    out, grads = _step(model, packed, device)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for name in ("mlm_loss", "sop_loss"):
        torch.testing.assert_close(getattr(out, name).float(), getattr(ref, name).float(), rtol=tol, atol=tol)
    for name, g in ref_grads.items():
        worst = float((grads[name] - g).abs().max())
        assert worst <= tol * float(g.abs().max()) + 1e-6, f"{name}: max |Δgrad| {worst:.3g}"
