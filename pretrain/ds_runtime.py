"""DeepSpeed inside a training rank: imported only once the cheap checks passed, quiet, and without two things it
loads that an ElasticBERT rank never uses. Both cost every rank of the job, so they show at 64 ranks:

- the compilation of DeepSpeed's Muon kernel: every ZeRO engine imports `deepspeed.runtime.zero.muon.muon_optimizer`
  (to ask whether the optimizer is Muon), and a module-level `torch.compile` there pulls in torch._inductor,
  functorch's partitioners and networkx: 42 MB of private memory and 1.0 CPU-s per rank measured here (2.7 GB and a
  minute of CPU over 64 ranks), for an optimizer we run only when the config names it (`optim.name: muon`). We
  import that module once with TorchDynamo off (`TORCHDYNAMO_DISABLE=1`, only for that import), so its decorator
  leaves the function as it is; nothing else is compiled in a pre-training rank.
- on the CPU accelerator, the shared-memory all-reduce op (`deepspeed_shm_comm`), JIT-compiled by the first rank
  (37 s here, while the others wait on torch's build lock, and a killed build leaves a lock every later start
  waits on) and loaded by every rank, although only DeepSpeed's inference all-reduce calls it. Training
  collectives go through torch.distributed (gloo) either way.

And when DeepSpeed does build an op on a GPU node (`optim.backend: deepspeed`: FusedAdam / FusedLamb, built by the
preflight once per node, loaded by the ranks), it builds for this node's own GPUs (`set_op_build_arch`): an image
that exports an arch list DeepSpeed 0.19.8 cannot parse (NVIDIA's Hopper images list "9.0a": its JIT builder does
`int("0a")` and stops with "invalid literal for int() with base 10: '0a'") or one that misses this GPU gets
`TORCH_CUDA_ARCH_LIST` from the capability instead ("9.0", "8.0", "7.0").
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import sys
import warnings
from types import ModuleType

MUON_MODULE = "deepspeed.runtime.zero.muon.muon_optimizer"
SHM_COMM_OP = "deepspeed_shm_comm"
ARCH_ENTRY = re.compile(r"^\d+\.\d+(\+PTX)?$")  # what DeepSpeed's JIT builder parses: 7.0, 9.0, 8.6+PTX


def quiet_deepspeed(device: str) -> None:
    """The accelerator DeepSpeed will pick (`device`: "cpu" or "cuda"), and its warnings and info lines off: they
    would be printed by every rank."""
    os.environ.setdefault("DS_ACCELERATOR", device)
    warnings.filterwarnings("ignore", message=r".*deprecated.*", category=FutureWarning)
    warnings.filterwarnings("ignore", message=r".*torch\.distributed.*deprecated.*")
    warnings.filterwarnings("ignore", category=UserWarning, module=r"deepspeed.*")
    for name in ("DeepSpeed", "deepspeed", "torch.distributed"):
        logging.getLogger(name).setLevel(logging.WARNING)


def import_deepspeed(optimizer: str) -> ModuleType:
    """`deepspeed` for a training rank whose DeepSpeed optimizer type is `optimizer`, after `quiet_deepspeed`."""
    import deepspeed

    if "muon" not in optimizer.lower() and MUON_MODULE not in sys.modules:
        before = os.environ.get("TORCHDYNAMO_DISABLE")
        os.environ["TORCHDYNAMO_DISABLE"] = "1"  # read by torch.compile when it decorates
        try:
            importlib.import_module(MUON_MODULE)
        finally:
            if before is None:
                del os.environ["TORCHDYNAMO_DISABLE"]
            else:
                os.environ["TORCHDYNAMO_DISABLE"] = before

    if os.environ.get("DS_ACCELERATOR") == "cpu":
        # the probe result DeepSpeed caches in the module and consults before building the op (comm/torch.py)
        deepspeed.ops.__compatible_ops__[SHM_COMM_OP] = False
    return deepspeed


def node_arch_list(capabilities: list[tuple[int, int]]) -> str:
    """TORCH_CUDA_ARCH_LIST for GPUs of these compute capabilities: "7.0", "8.0;9.0" (no "a" suffix)."""
    return ";".join(f"{major}.{minor}" for major, minor in sorted(set(capabilities)))


def set_op_build_arch(capabilities: list[tuple[int, int]] | None = None) -> tuple[str, str | None]:
    """Make DeepSpeed's op builds target this node's GPUs (`capabilities`, default: every visible one): keep a
    TORCH_CUDA_ARCH_LIST that DeepSpeed can parse and that covers them, else set it to theirs. Returns the list in
    force and a note naming the value it replaced (None when kept or unset)."""
    if capabilities is None:
        import torch

        capabilities = [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]
    own = node_arch_list(capabilities)
    current = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    entries = current.replace(" ", ";").split(";") if current else []
    parsable = bool(entries) and all(ARCH_ENTRY.match(e) for e in entries if e)
    covers = {e.split("+")[0] for e in entries} >= set(own.split(";"))
    if parsable and covers:
        return current, None
    os.environ["TORCH_CUDA_ARCH_LIST"] = own
    why = "that DeepSpeed cannot parse" if not parsable else "that misses this node's GPUs"
    return own, (f"TORCH_CUDA_ARCH_LIST={current!r} {why}: building for {own}" if current else None)
