"""`python -m pretrain preflight` on one node (the Slurm job of several nodes: tests/slurm/test_preflight.py): it
passes on a good node in seconds and names what is wrong on a bad one — the GPUs against the tasks, the torch build,
the data, a full or read-only run directory, a missing nvcc for DeepSpeed's fused ops — and node 0's verdict names
the first failed node, a node that never reported, or what differs between nodes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from faults import small_tmpfs
from pretrain_testlib import REPO, TINY, base_env

from common.dist import free_port
from common.torch_build import BuildCheck
from pretrain import preflight
from pretrain.config import load_config


def run_preflight(data: Path, run_dir: Path, *sets: str, **env: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pretrain", "preflight", "--config", str(TINY), "--output", str(run_dir)]
    for s in (f"data.corpora.0.path={data}", *sets):
        cmd += ["--set", s]
    full_env = {**base_env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), **env}
    return subprocess.run(cmd, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=180)


def test_a_good_node_passes_in_seconds(prepared_gutenberg, tmp_path):
    start = time.monotonic()
    r = run_preflight(prepared_gutenberg, tmp_path / "run")
    took = time.monotonic() - start
    assert r.returncode == 0, r.stdout + r.stderr
    line, verdict = r.stdout.strip().splitlines()
    assert line.startswith(f"preflight {os.uname().nodename}: ok in ")
    for part in ("gpus: no GPU (CPU node)", "precision: fp32 (auto: CPU", "data: gutenberg: 0.", "run dir: "):
        assert part in line
    assert verdict.startswith("preflight ok: 1 node(s) agree")
    assert not list((tmp_path / "run").iterdir())  # the write probe is gone
    assert took < 30, f"{took:.0f} s"


def test_a_bad_node_says_what_and_exits_2(prepared_gutenberg, tmp_path):
    r = run_preflight(tmp_path / "nowhere", tmp_path / "run")
    assert r.returncode == 2
    assert f"data: {tmp_path / 'nowhere'}: prepared corpus directory not found" in r.stdout
    assert r.stdout.strip().splitlines()[-1].startswith(f"preflight FAILED on {os.uname().nodename} (node 0): data:")
    assert "Traceback" not in r.stdout + r.stderr


def test_a_full_or_read_only_run_directory_is_named(prepared_gutenberg, tmp_path):
    cfg = load_config(TINY, [f"data.corpora.0.path={prepared_gutenberg}"])
    with small_tmpfs(tmp_path / "full", size="64k") as full:
        with pytest.raises(ValueError, match=r"full: 0\.00 GiB free, two checkpoints need 0\.0\d GiB"):
            preflight.check_run_dir(full, cfg)
    with small_tmpfs(tmp_path / "ro", read_only=True) as ro:
        with pytest.raises(OSError, match="Read-only file system"):
            preflight.check_run_dir(ro, cfg)


def test_two_checkpoints_are_estimated_from_the_model_size(prepared_gutenberg):
    """16 bytes per parameter (the base ZeRO-1 checkpoint measured 1879 MB for its 123 M parameters)."""
    base = load_config(REPO / "configs/elasticbert_base.yaml", [f"data.corpora.0.path={prepared_gutenberg}"])
    base.model.init_from = None
    n = preflight.parameter_count(base, 30522)
    assert 120e6 < n < 126e6, n
    large = load_config(REPO / "configs/elasticbert_large.yaml", [f"data.corpora.0.path={prepared_gutenberg}"])
    large.model.init_from = None
    assert 380e6 < preflight.parameter_count(large, 30522) < 390e6


def test_the_estimate_counts_the_built_models_parameters(prepared_gutenberg):
    """The analytic count (no model built, no transformers import) equals the pre-training model's parameters."""
    from pretrain.model_setup import model_from_scratch

    for sets in ([], ["model.hidden_size=48", "model.num_hidden_layers=3", "model.intermediate_size=96"]):
        cfg = load_config(TINY, [f"data.corpora.0.path={prepared_gutenberg}", *sets])
        built = sum(p.numel() for p in model_from_scratch(cfg.model, 1000).parameters())
        assert preflight.parameter_count(cfg, 1000) == built, sets


def test_a_node_check_imports_no_transformers(prepared_gutenberg, tmp_path):
    """transformers' import is two thirds of a node's check (and every node of a job pays it before any rank
    starts): a from-scratch config's check must not need it."""
    code = (
        "import sys; from pathlib import Path; from pretrain import preflight; "
        "from pretrain.config import load_config; "
        f"cfg = load_config({str(TINY)!r}, ['data.corpora.0.path={prepared_gutenberg}']); "
        f"r = preflight.check_node(cfg, Path({str(tmp_path / 'run')!r}), None, 1, 1); "
        "assert not r.failed, r.line(); print(sorted(m for m in sys.modules if m.split('.')[0] == 'transformers'))"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=base_env(), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout[:300]


def test_fused_ops_without_nvcc_are_refused_with_the_fix(prepared_gutenberg, monkeypatch):
    cfg = load_config(TINY, [f"data.corpora.0.path={prepared_gutenberg}", "optim.backend=deepspeed"])
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setattr(preflight.shutil, "which", lambda name: None)
    with pytest.raises(ValueError, match=r"builds DeepSpeed's fused_adam op with nvcc, and this node has none"):
        preflight.check_fused_ops(cfg)
    default = load_config(TINY, [f"data.corpora.0.path={prepared_gutenberg}"])
    assert preflight.check_fused_ops(default)[0] == "torch (no op to build)"


def test_gpus_must_match_the_tasks_and_the_build_must_cover_them(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    monkeypatch.setattr(preflight, "running_build_check", lambda rank: BuildCheck())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "Tesla V100-SXM2-32GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (7, 0))
    with pytest.raises(ValueError, match=r"4 GPU\(s\) visible but 8 task\(s\) per node"):
        preflight.check_gpus(8)
    assert preflight.check_gpus(4)[0] == "4 x Tesla V100-SXM2-32GB (sm 7.0), arch list covers them"
    unknown = BuildCheck(None, ("the NVIDIA driver version is unknown",))
    monkeypatch.setattr(preflight, "running_build_check", lambda rank: unknown)
    assert preflight.check_gpus(4)[0].endswith("covers them; note: the NVIDIA driver version is unknown")
    no_kernels = BuildCheck("torch 2.13.0 (CUDA 13.0) has no kernels")
    monkeypatch.setattr(preflight, "running_build_check", lambda rank: no_kernels)
    with pytest.raises(ValueError, match="has no kernels"):
        preflight.check_gpus(4)


def report(host: str, rank: int, failed: list[str] | None = None, **alike: str) -> dict:
    base = {"torch": "2.13.0+cu126", "cuda": "12.6", "nccl": "2.21.5", "code": "abc+src:1", "config": "f00"}
    return {"host": host, "node_rank": rank, "failed": failed or [], "alike": {**base, **alike}, "seconds": 4.0}


def test_the_verdict_names_the_first_failed_node_a_silent_node_or_what_differs():
    ok, line = preflight.verdict([report("n1", 0), report("n2", 1)], 2)
    assert ok and line == "preflight ok: 2 node(s) agree (slowest node 4.0 s)"
    ok, line = preflight.verdict([report("n1", 0), report("n2", 1, ["data: /d/manifest.json: missing"])], 2)
    assert not ok and line == "preflight FAILED on n2 (node 1): data: /d/manifest.json: missing"
    ok, line = preflight.verdict([report("n1", 0), None, report("n3", 2)], 3)
    assert not ok and "node(s) 1 of 3 sent no report" in line
    mixed = [report("n1", 0), report("n2", 1, nccl="2.18.1"), report("n3", 2, code="abd+src:2")]
    ok, line = preflight.verdict(mixed, 3)
    assert not ok
    assert "code differs across nodes: abc+src:1 on n1, n2; abd+src:2 on n3" in line
    assert "nccl differs across nodes: 2.21.5 on n1, n3; 2.18.1 on n2" in line
