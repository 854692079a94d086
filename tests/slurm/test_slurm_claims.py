"""One writer per output across two hosts that share the file system (issue 59, part 1): Slurm jobs on two nodes of
the local cluster (ebnode1, ebnode2: their own host names and network, the same files; see local_cluster.sh) run the
real `finetune predict` into one `--output`.

A claim's liveness is its flock, which a pid cannot give across hosts: the job on ebnode1 holds the output while its
input streams; the job on ebnode2 is refused in one line naming the output, ebnode1 and the holder's pid and command;
once the first job's predict is killed (SIGKILL on ebnode1: no clean-up, as on a crashed node), a third job on ebnode2
takes over the dead holder's claim with a note naming it, and writes the output."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from tiny_models import saved_classifier

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ON = {
    node: ["--partition=multi", f"--nodelist={node}", "--nodes=1", "--ntasks=1", "--cpus-per-task=1", "--time=5"]
    for node in ("ebnode1", "ebnode2")
}


def predict_job(tmp_path: Path, name: str, command: str) -> Path:
    script = tmp_path / f"{name}.sh"
    script.write_text(f"#!/bin/bash\nset -eo pipefail\ncd {REPO}\n{command}\n")
    return script


@pytest.mark.timeout(300)
def test_an_output_claimed_on_one_host_is_refused_on_another_and_taken_over_when_its_holder_dies(
    slurm_cluster, multi_nodes, tmp_path
):
    model = saved_classifier(tmp_path / "sst2" / "best", "SST-2")
    out = tmp_path / "shared" / "conc.jsonl"
    small = tmp_path / "small.txt"
    small.write_text("a dull film\n")
    python = f"{REPO}/.venv/bin/python" if (REPO / ".venv").is_dir() else "python"
    predict = f"{python} -m finetune predict --model {model} --output {out} --no-progress"
    env = slurm_cluster.env(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")

    holder_log = tmp_path / "holder.out"
    holder = predict_job(tmp_path, "holder", f"sleep 300 | {predict} --input -")  # a stream that stays open
    holder_id = slurm_cluster.sbatch(*ON["ebnode1"], f"--output={holder_log}", str(holder), env=env)
    slurm_cluster.wait_until(
        "the holder to read its stream",
        lambda: "; rule:" in holder_log.read_text() if holder_log.exists() else False,
        timeout=180,
        job_id=holder_id,
    )
    claim = json.loads((tmp_path / "shared" / ".conc.jsonl.claim" / "0").read_text())
    assert claim["host"] == "ebnode1" and claim["slurm_job_id"] == holder_id

    refused_log = tmp_path / "refused.out"
    refused = predict_job(tmp_path, "refused", f"{predict} --input {small}")
    refused_id = slurm_cluster.sbatch(*ON["ebnode2"], f"--output={refused_log}", str(refused), env=env)
    record = slurm_cluster.wait_state(refused_id, "FAILED", timeout=180)
    assert record["NodeList"] == "ebnode2" and record["ExitCode"] == "2:0"
    lines = [line for line in refused_log.read_text().splitlines() if line.startswith("finetune: error: ")]
    assert len(lines) == 1 and "Traceback" not in refused_log.read_text(), refused_log.read_text()
    assert f"--output {out} is being written by another process: pid {claim['pid']} on host ebnode1" in lines[0]
    assert f"(python -m finetune predict --model {model}" in lines[0] and f"Slurm job {holder_id})" in lines[0]
    assert not out.exists()

    assert claim["pid"] in slurm_cluster.node_processes("ebnode1")  # the holder runs on ebnode1...
    os.kill(claim["pid"], signal.SIGKILL)  # ...and dies there without a word, as on a crashed node
    deadline = time.monotonic() + 30
    while claim["pid"] in slurm_cluster.node_processes("ebnode1") and time.monotonic() < deadline:
        time.sleep(0.1)
    slurm_cluster.run("scancel", holder_id)
    assert (tmp_path / "shared" / ".conc.jsonl.claim" / "0").is_file()

    taker_log = tmp_path / "taker.out"
    taker = predict_job(tmp_path, "taker", f"{predict} --input {small}")
    taker_id = slurm_cluster.sbatch(*ON["ebnode2"], f"--output={taker_log}", str(taker), env=env)
    slurm_cluster.wait_state(taker_id, "COMPLETED", timeout=180)
    said = taker_log.read_text()
    assert f"finetune: note: --output {out}: taking over the claim of pid {claim['pid']} on host ebnode1" in said
    assert [json.loads(line)["label"] for line in out.read_text().splitlines()] != []
    assert sorted(os.listdir(out.parent)) == ["conc.jsonl"]  # the taker gave the claim back
