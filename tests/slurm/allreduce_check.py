"""Run under slurm/common.sh's eb_srun: a real torch.distributed gloo all_reduce using the env contract
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). Writes OUT_DIR/rank<R>.json, with the host it ran on
and the address that host name resolves to there (what gloo binds to)."""

import datetime
import json
import os
import socket
import sys

import torch
import torch.distributed as dist


def main() -> int:
    out_dir = sys.argv[1]
    env = {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(
        {
            k: os.environ.get(k)
            for k in (
                "LOCAL_WORLD_SIZE",
                "NODE_RANK",
                "SLURM_PROCID",
                "OMP_NUM_THREADS",
                "DS_ACCELERATOR",
                "SLURM_JOB_ID",
            )
        }
    )
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)  # sum over ranks: world * (world + 1) / 2
    gathered = [None] * world
    dist.all_gather_object(gathered, rank)
    dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        host = socket.gethostname()
        json.dump(
            {
                "env": env,
                "rank": rank,
                "world": world,
                "sum": t.item(),
                "gathered": gathered,
                "host": host,
                "host_addr": socket.gethostbyname(host),
            },
            f,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
