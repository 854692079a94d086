"""Stand-in for `python -m pretrain train` (and `python -m finetune train`) in the Slurm tests.

It checks the CLI/env contract of the launch scripts and plays the preemption protocol, without torch:
  first start (SLURM_RESTART_COUNT unset/0 and no marker): write `ready.rank<R>`, wait for SIGUSR1/SIGTERM, then write
  `preempted.rank<R>` and exit 75 (EX_TEMPFAIL: "saved a checkpoint because of preemption, please requeue");
  a restart (SLURM_RESTART_COUNT >= 1 or the marker present): write `done.rank<R>`, exit 0.
STANDIN_MODE=exit:N makes it exit N at once instead. Every start appends a JSON line to <output>/starts.jsonl
(`--output`: the run directory of pretrain, the output directory of finetune). `preflight` (pretrain's per-node check)
records its call in <output>/preflight.jsonl and passes, or fails on the node STANDIN_PREFLIGHT=fail:NODE_RANK names.
"""

import argparse
import json
import os
import signal
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser(prog="standin_trainer")
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--config")
    t.add_argument("--output")  # both contracts: pretrain's run directory, finetune's output directory
    t.add_argument("--ds-config")
    t.add_argument("--set", action="append", default=[])
    t.add_argument("--task")  # finetune contract
    t.add_argument("--seed", type=int)
    t.add_argument("--model")
    t.add_argument("--data-dir")
    f = sub.add_parser("preflight")  # pretrain's per-node check: record who ran it, with what, where
    f.add_argument("--config")
    f.add_argument("--output")
    f.add_argument("--ds-config")
    f.add_argument("--set", action="append", default=[])
    a, rest = p.parse_known_args()
    if a.cmd == "preflight":
        return preflight(a)
    run_dir = a.output
    if not run_dir:
        p.error("--output is required (pretrain's run directory, finetune's output directory)")
    os.makedirs(run_dir, exist_ok=True)
    env = {
        k: os.environ.get(k)
        for k in (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "NODE_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
            "SLURM_JOB_ID",
            "SLURM_RESTART_COUNT",
            "SLURM_ARRAY_TASK_ID",
            "DS_ACCELERATOR",
            "OMP_NUM_THREADS",
            "VIRTUAL_ENV",
        )
    }
    rank = int(env["RANK"])
    rec = {
        "argv": sys.argv[1:],
        "args": vars(a),
        "rest": rest,
        "env": env,
        "cwd": os.getcwd(),
        "python": sys.executable,
        "time": time.time(),
    }
    with open(os.path.join(run_dir, "starts.jsonl"), "a") as f:
        f.write(json.dumps(rec) + "\n")

    mode = os.environ.get("STANDIN_MODE", "preempt")
    if mode.startswith("exit:"):
        return int(mode.split(":", 1)[1])
    marker = os.path.join(run_dir, f"preempted.rank{rank}")
    if int(env["SLURM_RESTART_COUNT"] or 0) >= 1 or os.path.exists(marker):
        open(os.path.join(run_dir, f"done.rank{rank}"), "w").close()
        return 0

    got = []
    for s in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(s, lambda num, _frame: got.append(num))
    open(os.path.join(run_dir, f"ready.rank{rank}"), "w").close()
    deadline = time.time() + float(os.environ.get("STANDIN_WAIT_S", "120"))
    while not got and time.time() < deadline:
        time.sleep(0.1)
    if not got:
        print(f"rank {rank}: no signal within the deadline", flush=True)
        return 3
    with open(marker, "w") as f:  # "the checkpoint"
        f.write(signal.Signals(got[0]).name)
    print(f"rank {rank}: got {signal.Signals(got[0]).name}, saved, exiting 75", flush=True)
    return 75


def preflight(a: argparse.Namespace) -> int:
    """Append this node's call to <output>/preflight.jsonl; STANDIN_PREFLIGHT=fail:NODE_RANK fails that node."""
    os.makedirs(a.output, exist_ok=True)
    keys = ("NODE_RANK", "EB_NUM_NODES", "EB_TASKS_PER_NODE", "SLURM_JOB_ID", "SLURM_RESTART_COUNT")
    rec = {"host": os.uname().nodename, "argv": sys.argv[1:], **{k: os.environ.get(k) for k in keys}}
    with open(os.path.join(a.output, "preflight.jsonl"), "a") as f:
        f.write(json.dumps(rec) + "\n")
    if os.environ.get("STANDIN_PREFLIGHT") == f"fail:{os.environ.get('NODE_RANK')}":
        print(f"preflight {rec['host']}: FAILED: data: standin failure", flush=True)
        return 2
    print(f"preflight {rec['host']}: ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
