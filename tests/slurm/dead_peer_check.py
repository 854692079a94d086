"""Run under slurm/common.sh's eb_srun: rank 0 waits in the torch.distributed rendezvous (gloo, a long timeout) for
rank 1, which only writes OUT_DIR/rank1.pid and sleeps until the test kills it with SIGKILL. Rank 0 is then
waiting outside any collective that could notice the death: only srun (--wait=EB_STEP_WAIT) can end the step."""

import datetime
import os
import sys
import time

import torch.distributed as dist


def main() -> int:
    out_dir = sys.argv[1]
    rank = int(os.environ["RANK"])
    if rank != 0:
        with open(os.path.join(out_dir, f"rank{rank}.pid"), "w") as f:
            f.write(str(os.getpid()))
        time.sleep(600)
        return 0
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=600))
    return 0


if __name__ == "__main__":
    sys.exit(main())
