"""What stops a training run loudly instead of letting it waste compute or overwrite a good checkpoint: a non-finite
step, a peer rank that died, and (common.run_dir.RunWriteError) a write that failed. Each has its own exit code, so
a batch script never requeues them (slurm/common.sh requeues on 75 only) and an operator can tell them from bad
input (2).

Non-finite steps: the trainer *stops* (no rollback). After every optimizer step the all-reduced loss and DeepSpeed's
global gradient norm (identical on every rank, so every rank stops at the same step) must be finite; in fp16 a
gradient overflow that DeepSpeed skipped (the loss scaler's normal work) is not a failure, a non-finite loss is.
Nothing is saved after such a step, and the weights are checked once more before every save, so `latest` never
moves onto a state produced after a non-finite step. Rerunning the same command resumes from `latest` and, being
deterministic, meets the same step again: lower `optim.lr`, check the data, or resume from an older checkpoint.

A dead peer (a rank killed, OOM-killed, or its node lost): every other rank's next collective fails ("Connection
closed by peer" from gloo, an aborted communicator from NCCL). Each surviving rank says so in one line naming the
peer's address and the hosts at that address, and exits 5; the launcher's own report ("srun: error: NODE: task N:
Killed") names the rank that died, and slurm/common.sh repeats it. Without this, each of the 63 survivors of a
64-rank job printed its 70-line traceback: 1,140 lines for one killed rank of 16, measured.

A stale build lock: DeepSpeed builds some ops just in time (the CPU accelerator's shm collectives, FusedAdam on a
GPU without prebuilt ops) under torch's file baton, and a process that waits for the baton spins for as long as the
lock file exists. A build killed mid-way (a preempted or cancelled first job) leaves the file behind, and every
later job then hangs at start-up until its time limit: refused at start instead, naming the file.
"""

from __future__ import annotations

import math
import os
import re
import socket
import sys
import time
from pathlib import Path

from common.errors import EXIT_DIVERGED, EXIT_PEER_LOST, UserError


class TrainingDiverged(UserError):
    """A non-finite loss, gradient norm or weight: the run stopped without checkpointing it."""

    exit_code = EXIT_DIVERGED

    @classmethod
    def at(cls, problem: str, step: int, latest_file: Path, latest: str | None) -> TrainingDiverged:
        return cls(
            f"{problem} at step {step}: training stopped without saving; {latest_file} stays on "
            f"{latest or '(no checkpoint yet)'}, and nothing after a non-finite step is ever checkpointed. Lower "
            "optim.lr, check the data, or resume from an older checkpoint (rerunning resumes from latest and "
            "meets the same step again)"
        )


BUILD_LOCK_STALE_S = 15 * 60  # a build takes seconds to a few minutes; a baton this old has no builder left


class StaleBuildLock(UserError):
    """A torch extension build lock left by a killed build: the op's next load would wait for it forever."""


class PeerLost(UserError):
    """A collective failed because another rank of the job is gone; nothing after `latest` was saved."""

    exit_code = EXIT_PEER_LOST


# what gloo and NCCL say when the other end of a collective is gone (a closed socket, an aborted communicator)
PEER_GONE = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|remote process exited|"
    r"NCCL communicator was aborted|ncclRemoteError|Connection refused"
)
PEER_ADDRESS = re.compile(r"\[([0-9a-fA-F:.]+)\]:\d+")


def peer_lost(err: BaseException, where: str, hosts: list[str]) -> PeerLost | None:
    """`err` as a `PeerLost` when it is a collective's report of a vanished peer (else None). `where` says which
    rank saw it, when; `hosts` are the job's hosts by rank (to name the ones at the peer's address)."""
    text = str(err)
    if not isinstance(err, RuntimeError) or not PEER_GONE.search(text):
        return None
    first_line = text.strip().splitlines()[0].split(". This is typically")[0]  # gloo's advice line: not ours
    seen = ""
    match = PEER_ADDRESS.search(text)
    if match:  # the rank this one talked to: the dead one or a neighbour that already left because of it
        at = [h for h in dict.fromkeys(hosts) if _address_of(h) == match.group(1)]
        seen = f" (the connection to {match.group(1)}{' = ' + ', '.join(at) if at else ''} closed)"
    return PeerLost(
        f"{where}: a collective failed because another rank of the job is gone{seen}: {first_line[:200]}. "
        "The launcher's log names the rank that failed first (srun: 'error: NODE: task N: Killed'); nothing after "
        "checkpoints/latest was saved: submit the same job again to resume from it"
    )


def _address_of(host: str) -> str | None:
    try:
        return socket.gethostbyname(host)
    except OSError:
        return None


def step_problem(loss: float, grad_norm: float | None, step_skipped: bool, precision: str) -> str | None:
    """Why an optimizer step's result must not be trained on or saved, or None when it is sound."""
    if not math.isfinite(loss):
        return f"non-finite loss ({loss})"
    if grad_norm is not None and not math.isfinite(grad_norm):
        if precision == "fp16" and step_skipped:
            return None  # fp16 overflow: DeepSpeed skipped the update and lowered the loss scale
        return f"non-finite gradient norm ({grad_norm})"
    return None


def extension_build_root() -> Path:
    """Where torch builds JIT extensions (`torch.utils.cpp_extension._get_build_directory`'s rule, minus the
    accelerator suffix: every `py*_*` folder under the default root is scanned)."""
    explicit = os.environ.get("TORCH_EXTENSIONS_DIR")
    if explicit:
        return Path(explicit)
    from torch.utils.cpp_extension import get_default_build_root

    return Path(get_default_build_root())


def stale_build_locks(root: Path, now: float | None = None, max_age_s: float = BUILD_LOCK_STALE_S) -> list[Path]:
    """Build locks under `root` older than `max_age_s` (both layouts: `root/EXT/lock` under TORCH_EXTENSIONS_DIR,
    `root/pyXY_ACC/EXT/lock` under the default root)."""
    now = time.time() if now is None else now
    found = []
    for lock in [*root.glob("*/lock"), *root.glob(f"py{sys.version_info.major}{sys.version_info.minor}*/*/lock")]:
        try:
            age = now - lock.stat().st_mtime
        except OSError:  # released while we looked
            continue
        if age > max_age_s:
            found.append(lock)
    return sorted(set(found))


def refuse_stale_build_locks(root: Path | None = None) -> None:
    """Raise `StaleBuildLock` naming every stale lock (what to delete), before anything waits on one."""
    root = extension_build_root() if root is None else root
    locks = stale_build_locks(root)
    if locks:
        ages = ", ".join(f"{lock} ({(time.time() - lock.stat().st_mtime) / 60:.0f} min old)" for lock in locks)
        raise StaleBuildLock(
            f"stale torch extension build lock: {ages}. An interrupted DeepSpeed op build left it, and loading "
            f"that op would wait for it forever. If no build is running on this machine, delete it "
            f"(rm {' '.join(str(lock) for lock in locks)}) and rerun."
        )
