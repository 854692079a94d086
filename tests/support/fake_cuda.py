"""A CUDA device faked on a CPU machine, so the library's GPU-only lines run in CI.

`fake_cuda(monkeypatch, tmp_path, "h200")` patches torch.cuda's public functions (is_available, device_count,
get_device_properties / name / capability, get_arch_list, is_bf16_supported, set_device, current_device,
synchronize, nccl.version, the CUDA RNG states, and streams and CUDA graphs: `FakeGraph` runs its capture
eagerly and only counts replays), torch.version.cuda / hip, and puts a stub `nvidia-smi` first on PATH
that reports the GPUs' capability and the driver (what `common.torch_build` reads). Everything above them — the
build check, `DeviceCaps.detect`, the precision choice, the DeepSpeed config, the preflight, the trainer's set-up —
runs as it would on that GPU; no kernel does (the CPU has none), so a test stops before the first one.

GPUS holds the three generations the users meet: a V100 (7.0, no bf16, only in torch's CUDA 12.6 build), an A100
(8.0) and an H200 (9.0), each with the arch list of the torch build `make install` picks for it.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

# torch.cuda.get_arch_list() of the pinned torch's builds (RELEASE.md matrix; tests/common/test_torch_build.py)
CU126_ARCHES = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
CU130_ARCHES = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"]


@dataclass(frozen=True)
class Gpu:
    name: str
    capability: tuple[int, int]
    memory_gib: int
    sms: int
    torch_cuda: str  # the build make install picks for it
    arch_list: tuple[str, ...]
    driver: str


GPUS = {
    "v100": Gpu("Tesla V100-SXM2-32GB", (7, 0), 32, 80, "12.6", tuple(CU126_ARCHES), "535.104.05"),
    "a100": Gpu("NVIDIA A100-SXM4-80GB", (8, 0), 80, 108, "13.0", tuple(CU130_ARCHES), "580.65.06"),
    "h200": Gpu("NVIDIA H200", (9, 0), 141, 132, "13.0", tuple(CU130_ARCHES), "580.95.05"),
}


@dataclass
class FakeCuda:
    gpu: Gpu
    count: int
    bin_dir: Path
    set_device_calls: list[int] = field(default_factory=list)
    rng_states: list[torch.Tensor] | None = None

    def smi(self, driver: str | None = "same", script: str | None = None) -> None:
        """Rewrite the stub `nvidia-smi`: another driver version, a failing one (`script`), or none (driver=None)."""
        smi = self.bin_dir / "nvidia-smi"
        smi.unlink(missing_ok=True)
        if driver is None and script is None:
            return
        driver = self.gpu.driver if driver == "same" else driver
        cap = ".".join(map(str, self.gpu.capability))
        body = script or (
            'case "$*" in\n'
            f"  *compute_cap*) for i in $(seq {self.count}); do echo '{cap}, {driver}'; done ;;\n"
            f"  *driver_version*) for i in $(seq {self.count}); do echo '{driver}'; done ;;\n"
            "  *) echo 'NVIDIA-SMI stub'; exit 0 ;;\n"
            "esac\n"
        )
        smi.write_text(f"#!/bin/sh\n{body}")
        smi.chmod(smi.stat().st_mode | stat.S_IXUSR)


class FakeStream:
    def wait_stream(self, other: Any) -> None:
        return None


class FakeGraph:
    """A CUDA graph that records nothing: what ran inside `torch.cuda.graph(...)` ran once, eagerly (on the CPU's
    kernels), and `replay` only counts — so a fake capture's outputs are those of the inputs loaded at capture."""

    def __init__(self) -> None:
        self.captured, self.replays = False, 0

    def replay(self) -> None:
        assert self.captured, "replay of a graph never captured"
        self.replays += 1


@contextlib.contextmanager
def fake_graph_capture(graph: FakeGraph, pool: Any = None, stream: Any = None) -> Any:
    yield
    graph.captured = True


def fake_cuda(monkeypatch: Any, tmp_path: Path, kind: str, count: int = 8) -> FakeCuda:
    """Fake `count` GPUs of `kind` (a key of GPUS) for the rest of the test (monkeypatch undoes it)."""
    gpu = GPUS[kind]
    bin_dir = tmp_path / f"fake_cuda_bin_{kind}"
    bin_dir.mkdir(parents=True, exist_ok=True)
    fake = FakeCuda(gpu, count, bin_dir)
    fake.smi()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")

    def props(device: Any = None) -> SimpleNamespace:
        major, minor = gpu.capability
        return SimpleNamespace(
            name=gpu.name,
            major=major,
            minor=minor,
            total_memory=gpu.memory_gib * 2**30,
            multi_processor_count=gpu.sms,
        )

    cuda = torch.cuda
    patches = {
        "is_available": lambda: True,
        "device_count": lambda: count,
        "get_device_properties": props,
        "get_device_name": lambda device=None: gpu.name,
        "get_device_capability": lambda device=None: gpu.capability,
        "get_arch_list": lambda: list(gpu.arch_list),
        "is_bf16_supported": lambda including_emulation=True: gpu.capability >= (8, 0),
        "set_device": fake.set_device_calls.append,
        "current_device": lambda: fake.set_device_calls[-1] if fake.set_device_calls else 0,
        "synchronize": lambda device=None: None,
        "get_rng_state_all": lambda: [torch.zeros(16, dtype=torch.uint8) + i for i in range(count)],
        "set_rng_state_all": lambda states: setattr(fake, "rng_states", list(states)),
    }
    patches.update(  # what a CUDA graph's capture calls (elasticbert.layer_runner.GraphedLayers)
        {
            "Stream": FakeStream,
            "current_stream": lambda device=None: FakeStream(),
            "stream": lambda stream: contextlib.nullcontext(stream),
            "CUDAGraph": FakeGraph,
            "graph": fake_graph_capture,
            "graph_pool_handle": lambda: ("fake pool",),
        }
    )
    for name, value in patches.items():
        monkeypatch.setattr(cuda, name, value)
    monkeypatch.setattr(cuda.nccl, "version", lambda: (2, 27, 7))
    monkeypatch.setattr(torch.version, "cuda", gpu.torch_cuda)
    monkeypatch.setattr(torch.version, "hip", None)
    return fake
