"""DeepSpeed inside a training rank of either trainer: quiet, and without two things it loads that our ranks never
use. Both cost every rank of a job, so they show at 64 ranks:

- the compilation of DeepSpeed's Muon kernel: every ZeRO engine imports `deepspeed.runtime.zero.muon.muon_optimizer`
  (to ask whether the optimizer is Muon), and a module-level `torch.compile` there pulls in torch._inductor,
  functorch's partitioners and networkx: 42 MB of private memory and 1.0 CPU-s per rank measured here (2.7 GB and a
  minute of CPU over 64 ranks), for an optimizer we run only when the config names it (`optim.name: muon`). We
  import that module once with TorchDynamo off (`TORCHDYNAMO_DISABLE=1`, only for that import), so its decorator
  leaves the function as it is.
- on the CPU accelerator, the shared-memory all-reduce op (`deepspeed_shm_comm`), JIT-compiled by the first rank
  (37 s and 60 CPU-s here, while the others wait on torch's build lock, and a killed build leaves a lock every later
  start waits on) and loaded by every rank, although only DeepSpeed's inference all-reduce calls it. Training
  collectives go through torch.distributed (gloo) either way, in pre-training and in fine-tuning.

Pre-training (`pretrain.startup`) and fine-tuning (`finetune.train.methods.deepspeed_engine`) both import DeepSpeed
through `import_deepspeed`.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import warnings
from types import ModuleType

MUON_MODULE = "deepspeed.runtime.zero.muon.muon_optimizer"
SHM_COMM_OP = "deepspeed_shm_comm"


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
    """`deepspeed` for a training rank whose optimizer type is `optimizer` (the DeepSpeed JSON's, or the class name
    of the optimizer the trainer builds itself), without the Muon compile and, on the CPU accelerator, the shm op."""
    import deepspeed
    from deepspeed.accelerator import get_accelerator

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

    if get_accelerator().device_name() == "cpu":
        # the probe result DeepSpeed caches in the module and consults before building the op (comm/torch.py)
        deepspeed.ops.__compatible_ops__[SHM_COMM_OP] = False
    return deepspeed
