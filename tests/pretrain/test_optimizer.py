"""The default GPU optimizer needs no compiler: the DeepSpeed config generated for a CUDA device asks DeepSpeed for
torch's fused AdamW (`torch_adam` + `fused`), and that optimizer's step is the update the paper's FusedAdam computes
(decoupled weight decay, bias correction: DeepSpeed's multi_tensor_adam kernel in ADAM_MODE_1), shown on the CPU in
fp32 to 1e-6 — through a real DeepSpeed engine built from the generated config. FusedAdam/FusedLamb stay one flag away
(`optim.backend=deepspeed`); tests/gpu compares FusedAdam's CUDA kernel with the default on a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from pretrain_testlib import REPO, base_env

from common.dist import free_port
from common.errors import ConfigError
from pretrain.config import load_config
from pretrain.ds_config import fill_ds_config, load_ds_json
from pretrain.precision import DeviceCaps

V100 = DeviceCaps("cuda", "Tesla V100-SXM2-32GB", False, "7.0")


def fused_adam_reference(params, grads, lr, betas, eps, weight_decay, steps):
    """FusedAdam's update in ADAM_MODE_1 (adam_w_mode=True, bias_correction=True), in fp32 in the kernel's order
    (csrc/adam/multi_tensor_adam.cu): m, v moments; update = m̂ / (√v̂ + eps) + wd · p; p -= lr · update."""
    b1, b2 = betas
    p = [x.float().clone() for x in params]
    m = [torch.zeros_like(x) for x in p]
    v = [torch.zeros_like(x) for x in p]
    for t in range(1, steps + 1):
        for i, g in enumerate(grads[t - 1]):
            g = g.float()
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            update = (m[i] / (1 - b1**t)) / ((v[i] / (1 - b2**t)).sqrt() + eps) + weight_decay * p[i]
            p[i] = p[i] - lr * update
    return p


def test_torch_fused_adamw_is_fusedadams_update_to_1e6():
    torch.manual_seed(0)
    params = [torch.randn(64, 32), torch.randn(32), torch.randn(7, 3, 5)]
    grads = [[torch.randn_like(x) for x in params] for _ in range(5)]
    hyper = dict(lr=2e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)  # the paper's recipe (lr: its peak)
    for fused in (True, False):  # fused: the GPU default; the multi-tensor foreach path: what CPU runs use
        live = [torch.nn.Parameter(x.clone()) for x in params]
        opt = torch.optim.AdamW(live, **hyper, fused=fused)
        for step_grads in grads:
            for p, g in zip(live, step_grads):
                p.grad = g.clone()
            opt.step()
        want = fused_adam_reference(params, grads, steps=len(grads), **hyper)
        for got, ref in zip(live, want):
            # 1e-6 relative: a few fp32 ulps (torch rounds p·(1 − lr·wd) and the Adam step apart, the kernel at once)
            assert torch.allclose(got.detach(), ref, rtol=1e-6, atol=1e-6), (fused, (got - ref).abs().max())
    # the comparison can fail: coupled (L2) weight decay, Adam's mode 0, is a different update
    coupled = torch.nn.Parameter(params[0].clone())
    opt = torch.optim.Adam([coupled], **hyper)
    for step_grads in grads:
        coupled.grad = step_grads[0].clone()
        opt.step()
    coupled_ref = fused_adam_reference(params, grads, steps=5, **hyper)[0]
    assert not torch.allclose(coupled.detach(), coupled_ref, rtol=1e-5, atol=1e-5)


def generated(overrides: list[str], caps: DeviceCaps, world_size: int = 64) -> dict:
    cfg = load_config(
        REPO / "configs/elasticbert_base.yaml", ["data.corpora=[{path: /nonexistent, weight: 1}]", *overrides]
    )
    raw = load_ds_json(REPO / "ds_configs/zero1.json")
    return fill_ds_config(raw, cfg, world_size=world_size, caps=caps)[0]


def test_the_generated_gpu_config_asks_for_torch_fused_adamw_and_the_fused_kernels_are_one_flag_away():
    gpu = generated([], V100)["optimizer"]
    assert gpu["type"] == "AdamW" and gpu["params"]["torch_adam"] is True and gpu["params"]["fused"] is True
    assert gpu["params"]["weight_decay"] == 0.01 and gpu["params"]["betas"] == [0.9, 0.999]
    cpu = generated([], DeviceCaps.cpu())["optimizer"]["params"]
    assert cpu["torch_adam"] is True and "fused" not in cpu  # CPU runs keep the foreach path they always had
    fused_adam = generated(["optim.backend=deepspeed"], V100)["optimizer"]
    assert fused_adam["type"] == "AdamW" and fused_adam["params"]["torch_adam"] is False and "fused" not in fused_adam
    lamb = generated(["optim.name=lamb", "train.zero_stage=0"], V100)["optimizer"]
    assert lamb["type"] == "Lamb" and "torch_adam" not in lamb["params"]
    with pytest.raises(ConfigError, match="optim.name=lamb has no torch implementation: set optim.backend=deepspeed"):
        generated(["optim.name=lamb", "train.zero_stage=0", "optim.backend=torch"], V100)


ENGINE_SCRIPT = textwrap.dedent(
    """
    import json, logging, os, sys
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
    import torch
    from common.deepspeed_import import import_deepspeed
    deepspeed = import_deepspeed("AdamW")  # as a training rank does: no shm op build on the CPU, no Muon compile
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    deepspeed.init_distributed("gloo", verbose=False)
    config = json.loads(sys.argv[2])
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8)
    start = [p.detach().clone() for p in model.parameters()]
    engine = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)[0]
    grads = []
    for step in range(3):
        x = torch.randn(2, 16)
        loss = engine(x).pow(2).sum()
        engine.backward(loss)
        grads.append([p.grad.detach().clone() for p in engine.module.parameters()])
        engine.step()
    base = engine.optimizer.optimizer if hasattr(engine.optimizer, "optimizer") else engine.optimizer
    print("RESULT " + json.dumps({
        "class": type(base).__module__ + "." + type(base).__name__,
        "fused": base.defaults.get("fused"),
        "start": [p.tolist() for p in start],
        "grads": [[g.tolist() for g in gs] for gs in grads],
        "end": [p.detach().tolist() for p in engine.module.parameters()],
    }))
    """
)


def test_a_deepspeed_engine_built_from_the_gpu_config_runs_torch_fused_adamw_with_fusedadams_update(tmp_path):
    """ZeRO-0 (the gradients DeepSpeed hands the optimizer are exactly the module's) with the config generated for a
    V100, on the CPU: torch's fused AdamW runs there too."""
    ds = generated(["train.zero_stage=0", "train.global_batch_size=2", "train.micro_batch_size=2"], V100, 1)
    ds["fp16"] = {"enabled": False}  # fp16 is what auto gives a V100; DeepSpeed has no fp16 on the CPU
    ds["optimizer"]["params"]["lr"] = 1e-2
    ds["train_batch_size"], ds["gradient_accumulation_steps"] = 2, 1
    ds["gradient_clipping"] = 0.0
    script = tmp_path / "engine.py"
    script.write_text(ENGINE_SCRIPT)
    run = [sys.executable, str(script), str(free_port()), json.dumps(ds)]
    r = subprocess.run(run, cwd=REPO, env=base_env(), capture_output=True, text=True, timeout=300)
    lines = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stdout[-3000:] + r.stderr[-3000:]
    got = json.loads(lines[0].removeprefix("RESULT "))
    assert got["class"] == "torch.optim.adamw.AdamW" and got["fused"] is True
    p = ds["optimizer"]["params"]
    start = [torch.tensor(x) for x in got["start"]]
    grads = [[torch.tensor(g) for g in step] for step in got["grads"]]
    want = fused_adam_reference(start, grads, p["lr"], tuple(p["betas"]), p["eps"], p["weight_decay"], steps=3)
    for end, ref in zip(got["end"], want):
        assert torch.allclose(torch.tensor(end), ref, rtol=1e-6, atol=1e-6)
