"""First contact with a GPU node (bench/gpu_check.sh runs this file first): the per-node preflight passes and reports
the GPUs, the build and the precision; the default optimizer (torch's fused AdamW) takes FusedAdam's step on the GPU;
attention runs without FlashAttention, as on a V100 (sm_70 has SDPA's memory-efficient kernel, not flash), in fp16."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]


def test_the_preflight_passes_on_this_node(device, synthetic_corpus, tmp_path):
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29731", "EB_TASKS_PER_NODE": "1"}
    env["EB_TASKS_PER_NODE"] = str(torch.cuda.device_count()) if device == "cuda" else "1"
    sets = [f"data.corpora=[{{path: {synthetic_corpus}, weight: 1}}]", "model.init_from=null"]
    sets += ["train.global_batch_size=64", "train.micro_batch_size=8"]
    cmd = [sys.executable, "-m", "pretrain", "preflight", "--config", "configs/elasticbert_base.yaml"]
    cmd += ["--output", str(tmp_path / "run"), *[a for s in sets for a in ("--set", s)]]
    run = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    print(run.stdout)  # the node's line lands in gpu_tests.log
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert "preflight ok: 1 node(s) agree" in run.stdout
    if device == "cuda":
        name = torch.cuda.get_device_name(0)
        assert f"gpus: {torch.cuda.device_count()} x {name}" in run.stdout
        want = "bf16" if torch.cuda.get_device_capability(0) >= (8, 0) else "fp16"
        assert f"precision: {want} (auto:" in run.stdout
    else:
        assert "gpus: no GPU (CPU node)" in run.stdout


def test_torch_fused_adamw_takes_fusedadams_step_on_the_gpu(device):
    """DeepSpeed's FusedAdam CUDA kernel (built here with nvcc, when the box has one) against the default, one step,
    fp32, to 1e-6; without nvcc the reference update of tests/pretrain/test_optimizer.py stands in for the kernel."""
    if device != "cuda":
        pytest.skip("the CUDA kernels are the GPU run's; tests/pretrain/test_optimizer.py covers the CPU")
    sys.path.insert(0, str(REPO / "tests" / "pretrain"))
    from test_optimizer import fused_adam_reference

    torch.manual_seed(0)
    start = [torch.randn(1024, 256, device="cuda"), torch.randn(256, device="cuda")]
    grads = [[torch.randn_like(p) for p in start]]
    hyper = dict(lr=2e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)
    live = [torch.nn.Parameter(p.clone()) for p in start]
    opt = torch.optim.AdamW(live, **hyper, fused=True)
    for p, g in zip(live, grads[0]):
        p.grad = g.clone()
    opt.step()
    want = fused_adam_reference(start, grads, steps=1, **hyper)
    for got, ref in zip(live, want):
        torch.testing.assert_close(got.detach(), ref, rtol=1e-6, atol=1e-6)
    try:
        from deepspeed.ops.adam import FusedAdam

        ds_live = [torch.nn.Parameter(p.clone()) for p in start]
        ds_opt = FusedAdam(ds_live, **hyper, adam_w_mode=True)
        for p, g in zip(ds_live, grads[0]):
            p.grad = g.clone()
        ds_opt.step()
    except Exception as e:  # noqa: BLE001  (no nvcc on the box: the op cannot be built)
        print(f"FusedAdam not built here ({type(e).__name__}: {str(e)[:200]}): compared with the reference only")
        return
    for got, ref in zip(live, ds_live):
        torch.testing.assert_close(got.detach(), ref.detach(), rtol=1e-6, atol=1e-6)


def test_attention_needs_no_flash_kernel_in_fp16(device):
    """What a V100 offers SDPA (memory-efficient and math, no flash): the model's forward and backward in fp16."""
    if device != "cuda":
        pytest.skip("SDPA's CUDA backends are the GPU run's")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from elasticbert import ElasticBertConfig, ElasticBertForPreTraining

    cfg = ElasticBertConfig(vocab_size=1000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4)
    model = ElasticBertForPreTraining(cfg).cuda()
    ids = torch.randint(5, 1000, (4, 128), device="cuda")
    mask = torch.ones_like(ids)
    mask[:, 100:] = 0
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]), torch.autocast("cuda", torch.float16):
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        loss = out.hidden_states[-1].float().pow(2).mean() + out.sop_logits[-1].float().logsumexp(-1).mean()
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
