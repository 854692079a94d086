"""DeepSpeed's op builds on a GPU node, aimed at this node's GPUs. (How a rank imports DeepSpeed, quiet and without
what it never uses, is `common.deepspeed_import`, shared with fine-tuning.)

When DeepSpeed does build an op on a GPU node (`optim.backend: deepspeed`: FusedAdam / FusedLamb, built by the
preflight once per node, loaded by the ranks), it builds for this node's own GPUs (`set_op_build_arch`): an image
that exports an arch list DeepSpeed 0.19.8 cannot parse (NVIDIA's Hopper images list "9.0a": its JIT builder does
`int("0a")` and stops with "invalid literal for int() with base 10: '0a'") or one that misses this GPU gets
`TORCH_CUDA_ARCH_LIST` from the capability instead ("9.0", "8.0", "7.0").
"""

from __future__ import annotations

import os
import re

ARCH_ENTRY = re.compile(r"^\d+\.\d+(\+PTX)?$")  # what DeepSpeed's JIT builder parses: 7.0, 9.0, 8.6+PTX


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
