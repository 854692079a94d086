"""What only a GPU shows: the DeepSpeed bf16 and fp16 paths on NCCL (1 process), an exact save → load → continue,
and early-exit predictions that agree between the CPU and the GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]


def run_module(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, env=full, capture_output=True, text=True, timeout=timeout
    )


def train(corpus, out, precision: str, steps: int, stop_after: int | None = None, compiled: bool = False):
    sets = [
        f"train.compile={str(compiled).lower()}",
        f"data.packing={str(not compiled).lower()}",  # the compiled step's static shapes exclude packing
        f"data.corpora=[{{name: synthetic, path: {corpus}, weight: 1.0}}]",
        f"train.train_steps={steps}",
        f"train.precision={precision}",
        "checkpoint.interval=2",
        "model.vocab_size=null",
        "logging.tensorboard=false",
        "optim.warmup_steps=1",
    ]
    if stop_after:
        sets.append(f"train.stop_after_steps={stop_after}")
    args = [
        "pretrain",
        "train",
        "--config",
        "configs/tiny_cpu.yaml",
        "--output",
        str(out),
        "--ds-config",
        "ds_configs/zero1.json",
    ]
    for s in sets:
        args += ["--set", s]
    return run_module(*args, env={"DS_ACCELERATOR": "cuda" if torch.cuda.is_available() else "cpu"})


def losses(run_dir) -> dict[int, float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r["loss"] for r in records}


@pytest.mark.parametrize(("precision", "compiled"), [("bf16", False), ("fp16", False), ("bf16", True)])
def test_deepspeed_steps_train_and_resume_exactly(device, synthetic_corpus, tmp_path, precision, compiled):
    if device == "cpu" and precision == "fp16":
        pytest.skip("fp16 DeepSpeed does not run on the CPU (see ../shared/STACK.md); the GPU run checks it")
    if device == "cpu" and compiled:
        pytest.skip("train.compile on the CPU is tests/pretrain/test_compile.py's; here it costs CI minutes")
    whole = train(synthetic_corpus, tmp_path / "whole", precision, 6, compiled=compiled)
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-3000:]
    assert f"{precision}" in whole.stdout + whole.stderr  # the chosen precision is announced
    assert (f"{precision}, compiled" in whole.stdout + whole.stderr) is compiled  # the announced first line
    first = train(synthetic_corpus, tmp_path / "split", precision, 6, stop_after=3, compiled=compiled)
    assert first.returncode == 0, first.stderr[-3000:]
    second = train(synthetic_corpus, tmp_path / "split", precision, 6, compiled=compiled)
    assert second.returncode == 0, second.stderr[-3000:]
    a, b = losses(tmp_path / "whole"), losses(tmp_path / "split")
    assert sorted(a) == sorted(b) == list(range(1, 7))
    worst = max(abs(a[s] - b[s]) for s in a)
    assert worst <= 1e-3 * max(abs(v) for v in a.values()), f"resumed losses differ by {worst}: {a} vs {b}"
    assert a[6] < a[1]  # it learns


def test_early_exit_agrees_between_cpu_and_gpu(device):
    from elasticbert import ElasticBertConfig, ElasticBertForSequenceClassification
    from finetune.early_exit import make_rule, run_batch

    torch.manual_seed(0)
    cfg = ElasticBertConfig(
        vocab_size=500,
        hidden_size=64,
        num_hidden_layers=6,
        num_attention_heads=4,
        intermediate_size=128,
        num_labels=2,
        exit_layers=list(range(1, 7)),
        exit_type="mha",
        exit_mha_dim=16,
        exit_mha_heads=2,
    )
    model = ElasticBertForSequenceClassification(cfg).eval()
    with torch.no_grad():  # confident, spread-out exits (random heads are near-uniform: every entropy ≈ ln 2)
        for param in model.exits.parameters():
            param.normal_(0.0, 0.6)
    lengths = torch.randint(5, 40, (64,))
    ids = torch.randint(5, 500, (64, 40))
    mask = (torch.arange(40)[None] < lengths[:, None]).long()
    ids = ids * mask
    types = torch.zeros_like(ids)
    cpu = run_batch(model, ids, mask, types, make_rule("entropy", 0.3, 2))
    assert 0 < (cpu.exit_layers < 6).float().mean() < 1, "the threshold should let some samples exit early"
    gpu_model = model.to(device)
    gpu = run_batch(gpu_model, ids.to(device), mask.to(device), types.to(device), make_rule("entropy", 0.3, 2))
    same_exit = (cpu.exit_layers.cpu() == gpu.exit_layers.cpu()).float().mean()
    assert same_exit >= 0.95, f"only {same_exit:.0%} of samples exit at the same layer on CPU and {device}"
    agree = cpu.exit_layers.cpu() == gpu.exit_layers.cpu()
    torch.testing.assert_close(gpu.logits.cpu()[agree].float(), cpu.logits[agree].float(), atol=2e-3, rtol=1e-3)
