"""What only a GPU shows: the DeepSpeed bf16 and fp16 paths on NCCL (1 process) at ElasticBERT-base size (seq 128,
micro-batch 32, accumulation 2, bert-base vocabulary), train -> resume through the CLI exactly, the export loads, and
early-exit predictions agree between the CPU and the GPU. On the CPU (EB_CHECK_DEVICE=cpu) the same at the tiny
config, bf16 only (DeepSpeed has no fp16 there).

Every selected training run is launched at once (a session fixture): the uninterrupted run and the first half of the
split one of each precision together, then the second halves, so the whole check costs two process lifetimes, not
six or nine (one GPU holds them all; each run is one rank of its own process group)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]
STEPS, STOP = 6, 3
RUNS = [  # (precision, compiled): the parametrization of the resume test, by mode
    pytest.param("bf16", False, id="bf16-False"),
    pytest.param("fp16", False, id="fp16-False"),
    pytest.param("bf16", True, id="bf16-True", marks=pytest.mark.gpu_full),
]


def train_args(corpus: Path, out: Path, precision: str, compiled: bool, device: str, stop: int | None) -> list[str]:
    """`python -m pretrain train` arguments: ElasticBERT-base size on a GPU, the tiny config on the CPU."""
    sets = [
        f"train.compile={str(compiled).lower()}",
        f"data.packing={str(not compiled).lower()}",  # the compiled step's static shapes exclude packing
        f"data.corpora=[{{name: synthetic, path: {corpus}, weight: 1.0}}]",
        f"train.train_steps={STEPS}",
        f"train.precision={precision}",
        "train.ds_config=ds_configs/zero1.json",
        "checkpoint.interval=3",  # saves at 3 (where the split run stops) and 6
        "logging.tensorboard=false",
        "logging.progress=false",
        "optim.warmup_steps=1",
        "eval.interval=0",
    ]
    if device == "cuda":  # the users' layout per rank: micro-batch 32, accumulation 2, seq 128
        config = "configs/elasticbert_base_scratch.yaml"
        sets += ["data.max_length=128", "train.micro_batch_size=32", "train.global_batch_size=64"]
        sets += ["model.vocab_size=30522", "data.num_workers=2", "data.verify=false"]
    else:
        config = "configs/tiny_cpu.yaml"
        sets += ["model.vocab_size=null"]
    if stop:
        sets.append(f"train.stop_after_steps={stop}")
    return ["pretrain", "train", "--config", config, "--output", str(out), *[a for s in sets for a in ("--set", s)]]


def launch(args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "DS_ACCELERATOR": "cuda" if torch.cuda.is_available() else "cpu"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    with open(log, "wb") as f:
        return subprocess.Popen([sys.executable, "-m", *args], cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)


def finished(procs: dict[str, tuple[subprocess.Popen, Path]], timeout: float = 900) -> dict[str, dict[str, Any]]:
    out = {}
    for name, (proc, log) in procs.items():
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = -9
        out[name] = {"code": code, "log": log.read_text(errors="replace")}
    return out


@pytest.fixture(scope="session")
def trained(request, device, synthetic_corpus, tmp_path_factory) -> dict[tuple[str, bool], dict[str, Any]]:
    """For every (precision, compiled) the session selected: the whole run and the split one, run concurrently."""
    wanted = set()
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if item.originalname == "test_deepspeed_steps_train_and_resume_exactly" and callspec is not None:
            wanted.add((callspec.params["precision"], callspec.params["compiled"]))
        elif item.originalname == "test_the_export_loads":
            wanted.add(("bf16", False))
    if device == "cpu":
        wanted = {w for w in wanted if w == ("bf16", False)}  # no fp16 DeepSpeed on a CPU; compile is test_compile's
    root = tmp_path_factory.mktemp("runs")

    def args(run: tuple[str, bool], part: str, stop: int | None) -> tuple[list[str], Path]:
        name = f"{run[0]}{'-compiled' if run[1] else ''}"
        return train_args(
            synthetic_corpus, root / name / part, run[0], run[1], device, stop
        ), root / f"{name}.{part}.log"

    first = {}
    for run in wanted:
        for part, stop in (("whole", None), ("split", STOP)):
            cmd, log = args(run, part, stop)
            first[(run, part)] = (launch(cmd, log), log)
    results = finished(first)
    second = {}
    for run in wanted:
        if results[(run, "split")]["code"] == 0:
            cmd, log = args(run, "split", None)
            second[(run, "resumed")] = (launch(cmd, log.with_suffix(".resumed.log")), log.with_suffix(".resumed.log"))
    results.update(finished(second))
    out = {}
    for run in wanted:
        name = f"{run[0]}{'-compiled' if run[1] else ''}"
        out[run] = {part: results.get((run, part)) for part in ("whole", "split", "resumed")}
        out[run]["dirs"] = {part: root / name / part for part in ("whole", "split")}
    return out


def records(run_dir: Path) -> dict[int, dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    by_step: dict[int, dict[str, Any]] = {}
    for r in (json.loads(line) for line in lines if line.strip()):
        by_step[r["step"]] = r  # a resumed run re-logs nothing before its checkpoint; the latest record wins
    return by_step


@pytest.mark.parametrize(("precision", "compiled"), RUNS)
def test_deepspeed_steps_train_and_resume_exactly(device, trained, precision, compiled):
    if device == "cpu" and precision == "fp16":
        pytest.skip("fp16 DeepSpeed does not run on the CPU (see ../shared/STACK.md); the GPU run checks it")
    if device == "cpu" and compiled:
        pytest.skip("train.compile on the CPU is tests/pretrain/test_compile.py's; here it costs CI minutes")
    run = trained[(precision, compiled)]
    for part in ("whole", "split", "resumed"):
        assert run[part] is not None and run[part]["code"] == 0, f"{part}: {(run[part] or {}).get('log', '')[-4000:]}"
    log = run["whole"]["log"]
    assert f"ZeRO-1, {precision}{', compiled' if compiled else ''}\n" in log  # the announced first line
    a, b = records(run["dirs"]["whole"]), records(run["dirs"]["split"])
    assert sorted(a) == sorted(b) == list(range(1, STEPS + 1))
    worst = max(abs(a[s]["loss"] - b[s]["loss"]) for s in a)
    assert worst <= 1e-3 * max(abs(r["loss"]) for r in a.values()), f"resumed losses differ by {worst}"
    assert a[STEPS]["loss"] < a[1]["loss"]  # it learns
    assert [a[s]["samples_digest"] for s in a] == [b[s]["samples_digest"] for s in b]  # the same data, resumed
    if precision == "fp16":  # the dynamic loss scaler at work, recorded every step (2^16 at the start)
        scales = [a[s]["loss_scale"] for s in sorted(a)]
        assert all(0 < x <= 65536.0 for x in scales) and a[STEPS]["skipped_steps"] < STEPS, scales


def test_the_export_loads(device, trained, tmp_path):
    from elasticbert import ElasticBertForPreTraining, load_pretrained

    run = trained[("bf16", False)]
    assert run["whole"]["code"] == 0, run["whole"]["log"][-3000:]
    out = tmp_path / "export"
    cmd = [sys.executable, "-m", "pretrain", "export", "--checkpoint", str(run["dirs"]["whole"] / "checkpoints")]
    done = subprocess.run([*cmd, "--output", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    model, _ = load_pretrained(ElasticBertForPreTraining, out)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    ids = torch.randint(200, 1000, (2, 16))
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True).hidden_states
    assert len(hidden) == model.config.num_hidden_layers + 1 and torch.isfinite(hidden[-1]).all()


def test_early_exit_agrees_between_cpu_and_gpu(device):
    from elasticbert import ElasticBertConfig, ElasticBertForSequenceClassification
    from finetune.serve.early_exit import make_rule, run_batch

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
