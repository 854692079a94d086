"""The one rank/world resolver: rank, world size and master address from whichever launcher started us (torchrun,
deepspeed, srun, or none). Pre-training and fine-tuning both read it; nothing else looks at RANK/WORLD_SIZE.

torchrun and the deepspeed launcher export RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT. Under `srun`
(one task per process) only SLURM_* exist: we derive the same variables from SLURM_PROCID, SLURM_NTASKS,
SLURM_LOCALID and the first host of SLURM_JOB_NODELIST, so the process-group init is identical everywhere.
A single process with no launcher gets rank 0 of 1 on a free local port.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    launcher: str


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand a Slurm hostlist such as 'gpu[01-03,07],login1' into host names (no `scontrol` needed)."""
    hosts: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", nodelist):
        m = re.match(r"^(.*?)\[([^\]]*)\](.*)$", part)
        if not m:
            hosts.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for r in ranges.split(","):
            if "-" in r:
                lo, hi = r.split("-", 1)
                width = len(lo)
                hosts.extend(f"{prefix}{i:0{width}d}{suffix}" for i in range(int(lo), int(hi) + 1))
            else:
                hosts.append(f"{prefix}{r}{suffix}")
    return hosts


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def resolve_env(environ: Mapping[str, str] | None = None, export: bool | None = None) -> DistEnv:
    """Work out the distributed environment. With no `environ` it reads os.environ and, unless `export=False`,
    writes the result back there (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT: what torch.distributed reads)."""
    env = os.environ if environ is None else environ
    if export is None:
        export = environ is None
    if "RANK" in env and "WORLD_SIZE" in env:
        launcher = "deepspeed" if "CROSS_RANK" in env or "DS_LAUNCHER" in env else "torchrun"
        if (env.get("SLURM_PROCID"), env.get("SLURM_NTASKS")) == (env["RANK"], env["WORLD_SIZE"]):
            launcher = "srun"  # one task per rank, RANK/WORLD_SIZE exported from Slurm's (slurm/common.sh)
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        local = int(env.get("LOCAL_RANK", rank))
        addr = env.get("MASTER_ADDR", "127.0.0.1")
        port = int(env.get("MASTER_PORT", "29500"))
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        launcher = "srun"
        rank, world = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
        local = int(env.get("SLURM_LOCALID", "0"))
        nodes = expand_nodelist(env.get("SLURM_JOB_NODELIST", env.get("SLURM_NODELIST", "127.0.0.1")))
        addr = env.get("MASTER_ADDR") or (nodes[0] if nodes else "127.0.0.1")
        # Same port on every task without talking to each other: derived from the job id.
        port = int(env.get("MASTER_PORT") or 20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000)
    else:
        launcher = "none"
        rank, world, local = 0, 1, 0
        addr = env.get("MASTER_ADDR", "127.0.0.1")
        port = int(env.get("MASTER_PORT") or free_port())
    if export:
        os.environ.update(
            {
                "RANK": str(rank),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(local),
                "MASTER_ADDR": addr,
                "MASTER_PORT": str(port),
            }
        )
    return DistEnv(rank, world, local, addr, port, launcher)


def stop_with_launcher(env: DistEnv, sig: int = signal.SIGTERM) -> bool:
    """Have the kernel send `sig` to this worker when its launcher (torchrun, the DeepSpeed launcher: its parent)
    dies, so a killed launcher does not leave its workers training unsupervised (Linux `PR_SET_PDEATHSIG`; srun's
    tasks are Slurm's to stop). True when armed. With the trainer's preemption handler installed, the signal means
    "save at the next step boundary and exit"."""
    if env.launcher not in ("torchrun", "deepspeed") or not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if os.getppid() == 1:  # the launcher died before the request: act as the kernel would have
        os.kill(os.getpid(), sig)
    return True
