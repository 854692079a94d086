"""First contact with a GPU node (bench/gpu/gpu_check.sh runs this file first): the per-node preflight passes and
reports the GPUs, the build and the precision; with --full, DeepSpeed's FusedAdam is built by the preflight for this
GPU's own arch (or refused in one line) and takes the default optimizer's step (torch's fused AdamW), and attention runs
without FlashAttention, as on a V100 (sm_70 has SDPA's memory-efficient kernel, not flash), in fp16."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.dist import free_port

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]


def preflight(corpus: Path, run_dir: Path, device: str, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    env["EB_TASKS_PER_NODE"] = str(torch.cuda.device_count()) if device == "cuda" else "1"
    sets = [f"data.corpora=[{{path: {corpus}, weight: 1}}]", "model.init_from=null"]
    sets += ["train.global_batch_size=64", "train.micro_batch_size=8", *extra]
    cmd = [sys.executable, "-m", "pretrain", "preflight", "--config", "configs/elasticbert_base.yaml"]
    cmd += ["--output", str(run_dir), *[a for s in sets for a in ("--set", s)]]
    run = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    print(run.stdout)  # the node's line lands in the log
    return run


def test_the_preflight_passes_on_this_node(device, synthetic_corpus, tmp_path):
    run = preflight(synthetic_corpus, tmp_path / "run", device)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert "preflight ok: 1 node(s) agree" in run.stdout
    if device == "cuda":
        name = torch.cuda.get_device_name(0)
        assert f"gpus: {torch.cuda.device_count()} x {name}" in run.stdout
        want = "bf16" if torch.cuda.get_device_capability(0) >= (8, 0) else "fp16"
        assert f"precision: {want} (auto:" in run.stdout
    else:
        assert "gpus: no GPU (CPU node)" in run.stdout


@pytest.mark.gpu_full
def test_fused_adam_is_built_for_this_gpu_and_takes_the_default_optimizers_step(device, synthetic_corpus, tmp_path):
    """optim.backend=deepspeed: the preflight builds FusedAdam for this GPU's arch (TORCH_CUDA_ARCH_LIST from its
    capability, whatever the image exports), or refuses in one line (no nvcc, a failed build); then the kernel's
    step against the default (torch's fused AdamW), one step, fp32, to 1e-6."""
    if device != "cuda":
        pytest.skip("the CUDA kernels are the GPU run's; tests/pretrain/test_fake_cuda.py covers the CPU")
    run = preflight(synthetic_corpus, tmp_path / "run", device, "optim.backend=deepspeed")
    line = next((x for x in run.stdout.splitlines() if x.startswith(f"preflight {socket.gethostname()}")), "")
    assert "Traceback" not in run.stdout + run.stderr, run.stderr[-3000:]
    major, minor = torch.cuda.get_device_capability(0)
    if run.returncode != 0:  # a clear refusal is the other acceptable outcome
        assert "optimizer: " in line and ("and this node has none" in line or "failed to build" in line), line
        pytest.skip(f"FusedAdam refused in one line on this box: {line[:300]}")
    assert "fused_adam built/loaded in" in line and f"{major}.{minor}" in line.split("built/loaded in")[1], line
    sys.path.insert(0, str(REPO / "tests" / "pretrain"))
    from test_optimizer import fused_adam_reference

    from pretrain.ds_runtime import set_op_build_arch

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
    set_op_build_arch()  # as the trainer does: the same arch, so the preflight's build is the one loaded
    from deepspeed.ops.adam import FusedAdam

    ds_live = [torch.nn.Parameter(p.clone()) for p in start]
    ds_opt = FusedAdam(ds_live, **hyper, adam_w_mode=True)
    for p, g in zip(ds_live, grads[0]):
        p.grad = g.clone()
    ds_opt.step()
    for got, ref in zip(live, ds_live):
        torch.testing.assert_close(got.detach(), ref.detach(), rtol=1e-6, atol=1e-6)


@pytest.mark.gpu_full
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
