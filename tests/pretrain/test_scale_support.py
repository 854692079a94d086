"""What a rank reports about itself at scale (start-up phases, memory), the one-line report of a lost peer, and the
DeepSpeed set-up that keeps a CPU rank small: fast, in-process or one subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.errors import EXIT_PEER_LOST
from pretrain.guards import PeerLost, peer_lost
from pretrain.rank_report import (
    CommTimer,
    StartupClock,
    host_memory_mb,
    process_start_time,
    summarize_memory,
    summarize_startup,
)

REPO = Path(__file__).resolve().parents[2]
GLOO_CLOSED = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:60648. This is typically caused by a remote worker crashing. Check the logs of the remote worker."
)


def test_startup_summary_names_the_last_rank_of_each_phase_and_the_longest_phase():
    marks = [
        {"process": 100.0, "imported": 104.0, "rendezvous": 110.0},
        {"process": 101.0, "imported": 109.0, "rendezvous": 110.5},
        {"process": 100.5, "imported": 105.0},  # skipped a phase: left out of the summary
    ]
    out = summarize_startup(marks, ["a", "b", "c"])
    assert list(out) == ["process", "imported"]
    assert out["process"] == {"s": 1.0, "rank": 1, "host": "b", "took_s": 0.0}
    assert out["imported"] == {"s": 9.0, "rank": 1, "host": "b", "took_s": 8.0}
    full = summarize_startup(marks[:2], ["a", "b"])
    assert full["rendezvous"] == {"s": 10.5, "rank": 1, "host": "b", "took_s": 6.0}


def test_this_process_reports_its_start_and_memory():
    before = time.time()
    clock = StartupClock()
    assert before - 24 * 3600 < clock.marks["process"] <= clock.marks["imported"] + 0.05
    assert process_start_time() == pytest.approx(clock.marks["process"], abs=0.05)
    clock.mark("rendezvous")
    with pytest.raises(AssertionError):
        clock.mark("no-such-phase")
    mem = host_memory_mb()
    assert mem["peak_rss"] >= mem["rss"] > mem["anon"] > 0


def test_memory_summary_over_ranks():
    per_rank = [{"peak_rss": 300.0}, {"peak_rss": 420.5}, {"peak_rss": 310.0}]
    assert summarize_memory(per_rank, ["n1", "n1", "n2"]) == {
        "peak_rss_mb_max": 420.5,
        "peak_rss_mb_mean": 343.5,
        "peak_rss_mb_min": 300.0,
        "rank": 1,
        "host": "n1",
    }
    assert summarize_memory([{"peak_rss": 1.0}, {}], ["a", "b"]) == {}  # a rank without /proc: no claim
    assert CommTimer(False).take() is None


def test_a_collective_that_lost_its_peer_becomes_one_line_with_its_own_exit_code():
    err = peer_lost(RuntimeError(GLOO_CLOSED), "rank 3 on n2, step 6", ["n1", "localhost"])
    assert isinstance(err, PeerLost) and err.exit_code == EXIT_PEER_LOST == 5
    text = str(err)
    assert text.startswith("rank 3 on n2, step 6: a collective failed because another rank of the job is gone")
    assert "(the connection to 127.0.0.1 = localhost closed)" in text and "Connection closed by peer" in text
    assert "typically caused" not in text and "\n" not in text and "resume" in text
    nccl = peer_lost(RuntimeError("NCCL communicator was aborted on rank 2."), "rank 0", [])
    assert nccl is not None and "the connection to" not in str(nccl)  # no address to name
    # anything else is not ours to rename: a real bug keeps its traceback
    assert peer_lost(RuntimeError("mat1 and mat2 shapes cannot be multiplied"), "rank 0", []) is None
    assert peer_lost(ValueError("Connection closed by peer"), "rank 0", []) is None


def test_deepspeed_in_a_cpu_rank_builds_no_op_and_compiles_nothing():
    """import_deepspeed: the shm collective op is never built or loaded (no JIT compile, no torch_extensions
    lock), and DeepSpeed's Muon kernel module is imported with TorchDynamo off, so networkx and functorch's
    partitioners stay out of the process (42 MB per rank measured) and the kernel is the plain function."""
    code = """
import json, os, sys
from common.deepspeed_import import MUON_MODULE, import_deepspeed, quiet_deepspeed
quiet_deepspeed("cpu")
ds = import_deepspeed("AdamW")
from deepspeed.comm.torch import build_shm_op
from deepspeed.runtime.zero.muon import original_muon
print(json.dumps({
    "shm_op": build_shm_op() is not None,
    "networkx": "networkx" in sys.modules,
    "partitioners": "torch._functorch.partitioners" in sys.modules,
    "muon": MUON_MODULE in sys.modules,
    "plain_kernel": type(original_muon.zeropower_via_newtonschulz5).__name__ == "function",
    "dynamo_env": os.environ.get("TORCHDYNAMO_DISABLE"),
}))
"""
    env = {k: v for k, v in os.environ.items() if k not in ("DS_ACCELERATOR", "TORCHDYNAMO_DISABLE")}
    env["TORCH_EXTENSIONS_DIR"] = "/nonexistent/eb-test-no-builds"
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {
        "shm_op": False,
        "networkx": False,
        "partitioners": False,
        "muon": True,
        "plain_kernel": True,
        "dynamo_env": None,
    }
    assert not Path("/nonexistent/eb-test-no-builds").exists()


def test_a_rank_that_lost_its_peer_leaves_without_the_interpreter_teardown():
    """gloo closes a rank's sockets only when its process ends, and its neighbours learn of the dead peer from
    that: `python -m pretrain` leaves at once after exit code 5 (no atexit, no module teardown), and only then."""
    code = """
import atexit, sys
from pretrain.__main__ import _exit
atexit.register(lambda: print("teardown ran", flush=True))
print("error line", flush=True)
_exit(int(sys.argv[1]))
"""
    for rc, teardown in ((EXIT_PEER_LOST, False), (2, True), (0, True)):
        r = subprocess.run([sys.executable, "-c", code, str(rc)], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert r.returncode == rc and "error line" in r.stdout, r.stderr
        assert ("teardown ran" in r.stdout) is teardown, (rc, r.stdout)


def test_a_rank_ahead_of_rank_0_leaves_nothing_a_late_rank_takes_for_a_strangers(tmp_path):
    """The ranks of a job start at different speeds, and each checks the run directory as it starts (`--output`'s
    rule: a run never writes over files no run of it made, `common.outputs`). Before the process group forms, a rank
    other than 0 must make nothing there: rank 0 lists the run's files first, and a `checkpoints/` made by a rank
    ahead of it is, to a rank checking at that moment, a folder of the run's names that no list names (seen in the
    16-rank Slurm test: rank 14 refused its own job's directory, "holds checkpoints, which no run of pretrain wrote
    there"). Rank 0's own, made after its list, is the run's."""
    from common.outputs import check_output
    from common.run_dir import prepare_run_dir
    from pretrain.checkpointer import Checkpointer
    from pretrain.cli import RUN_OUTPUT

    run = tmp_path / "run"
    prepare_run_dir(run, rank=1)
    Checkpointer(run, rank=1, world=16, keep_last=2, verify_checksums=True)
    assert sorted(p.name for p in run.iterdir()) == []  # rank 1, ahead of rank 0, made nothing there
    check_output(run, RUN_OUTPUT)
    prepare_run_dir(run, rank=0)
    Checkpointer(run, rank=0, world=16, keep_last=2, verify_checksums=True)
    check_output(run, RUN_OUTPUT)
    assert (run / "checkpoints").is_dir()
