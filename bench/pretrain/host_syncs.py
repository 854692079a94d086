"""Count the host syncs of a training step, and where each comes from.

On a GPU every read of a device value from the host — `.item()`, `float(t)`, `int(t)`, `bool(t)` (an `if` on a
tensor), `.tolist()`, `.cpu()`, `.numpy()` — and every `torch.cuda.synchronize()` stops the host until the device
has finished all the work queued before it: the host can no longer queue the next kernels while the GPU runs, so the
step then costs the GPU's time plus the host's launch time. A CPU never waits at such a call, so the cost hides
there; the calls do not. `count_host_syncs()` wraps those calls (torch.Tensor's methods, torch.cuda.synchronize and
DeepSpeed's accelerator `synchronize`) and records each with the first frame outside torch that made it, per step:

    with count_host_syncs() as syncs:
        for _ in range(3):
            with syncs.step():
                trainer.optimizer_step(batches)
    print(syncs.report())

Each call is attributed to its origin: `trainer` (pretrain/, common/: the code this repository adds around the
model), `model` (elasticbert/: the model's own forward/backward, the same in a bare loop), `deepspeed`, `torch`
(torch's own Python code), `other` (this bench, tests). On a CPU every such call is counted, whether or not the
tensor would live on the GPU (a conservative count: a DataLoader's host tensor is no device sync there).

On a CUDA device `cuda_sync_debug=True` also turns on torch's sync debug mode, which reports every synchronizing CUDA
call made in C++ too (boolean-mask indexing, `nonzero`, blocking host<->device copies) — the ground truth the Python
wrappers cannot see; those are listed separately, as `cuda` records.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
TENSOR_METHODS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__", "__index__")
TORCH_DIR = str(Path(torch.__file__).resolve().parent)
THIS = str(Path(__file__).resolve())
ORIGINS = {"pretrain": "trainer", "common": "trainer", "elasticbert": "model", "finetune": "trainer"}


@dataclass(frozen=True)
class Sync:
    kind: str  # "Tensor.item", "cuda.synchronize", "accelerator.synchronize", "cuda" (sync debug mode)
    where: str  # file:line of the first frame outside torch (repository-relative for ours)
    origin: str  # trainer | model | deepspeed | torch | other


def _origin_and_place(filename: str, lineno: int) -> tuple[str, str]:
    path = Path(filename)
    parts = path.parts
    if "deepspeed" in parts:
        return "deepspeed", f"{'/'.join(parts[parts.index('deepspeed') :])}:{lineno}"
    if str(path).startswith(TORCH_DIR):
        return "torch", f"torch/{path.relative_to(TORCH_DIR)}:{lineno}"
    try:
        rel = path.resolve().relative_to(REPO)
    except ValueError:
        return "other", f"{filename}:{lineno}"
    return ORIGINS.get(rel.parts[0], "other"), f"{rel}:{lineno}"


def _caller() -> tuple[str, str]:
    """(origin, file:line) of the first frame outside this module, torch's tensor wrappers and `warnings`."""
    frame = inspect.currentframe()
    skip = (THIS, f"{TORCH_DIR}/_tensor.py", f"{TORCH_DIR}/overrides.py", f"{TORCH_DIR}/utils/_device.py")
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(skip) and not name.endswith(("/warnings.py", "<frozen importlib._bootstrap>")):
            return _origin_and_place(name, frame.f_lineno)
        frame = frame.f_back
    return "other", "?"


@dataclass
class SyncCounter:
    """The syncs recorded so far, per step (`step()` opens one; calls outside any step go to `outside`)."""

    steps: list[list[Sync]] = field(default_factory=list)
    outside: list[Sync] = field(default_factory=list)
    device_truth: bool = False  # CUDA's sync debug mode is on: count its reports ("cuda"), not the Python calls
    _current: list[Sync] | None = None
    _depth: int = 0

    def record(self, kind: str, origin_place: tuple[str, str] | None = None) -> None:
        origin, where = origin_place or _caller()
        (self._current if self._current is not None else self.outside).append(Sync(kind, where, origin))

    @contextlib.contextmanager
    def step(self) -> Iterator[list[Sync]]:
        self._current = []
        try:
            yield self._current
        finally:
            self.steps.append(self._current)
            self._current = None

    def counted(self, sync: Sync) -> bool:
        """Whether `sync` counts: CUDA's own reports when the debug mode is on (a Python read of a host tensor is
        no device sync there), else every wrapped Python call (the CPU's conservative count)."""
        return (sync.kind == "cuda") is self.device_truth

    def per_step(self, origin: str | None = None) -> list[int]:
        return [
            sum(1 for s in step if (origin is None or s.origin == origin) and self.counted(s)) for step in self.steps
        ]

    @property
    def how(self) -> str:
        return "CUDA sync debug mode" if self.device_truth else "Python calls that read the device (CPU count)"

    def sources(self, steps: slice = slice(None)) -> Counter[Sync]:
        """How often each (kind, place, origin) occurred over `steps`."""
        return Counter(s for step in self.steps[steps] for s in step)

    def report(self, skip: int = 0) -> str:
        """Per-step counts by origin, then every source with its count per step (steps from `skip` on)."""
        steps = self.steps[skip:]
        if not steps:
            return "no steps counted"
        lines = [f"host syncs per optimizer step (mean over {len(steps)} step(s); {self.how}):"]
        for origin in ("trainer", "model", "deepspeed", "torch", "other"):
            counts = [sum(1 for s in step if s.origin == origin and self.counted(s)) for step in steps]
            if any(counts):
                lines.append(f"  {origin:9s} {sum(counts) / len(counts):5.2f}  (per step: {counts})")
        for sync, n in sorted(self.sources(slice(skip, None)).items(), key=lambda kv: (kv[0].origin, kv[0].where)):
            lines.append(f"    {sync.origin:9s} {n / len(steps):5.2f}/step  {sync.kind:24s} {sync.where}")
        return "\n".join(lines)


def _wrap(counter: SyncCounter, kind: str, original: Any) -> Any:
    def counted(*args: Any, **kwargs: Any) -> Any:
        if counter._depth == 0:
            counter.record(kind)
        counter._depth += 1
        try:
            return original(*args, **kwargs)
        finally:
            counter._depth -= 1

    counted.__name__ = getattr(original, "__name__", kind)
    return counted


@contextlib.contextmanager
def count_host_syncs(cuda_sync_debug: bool = True) -> Iterator[SyncCounter]:
    """Count the host syncs made inside the block (see the module's docstring); everything is restored after."""
    counter = SyncCounter()
    patched: list[tuple[Any, str, Any]] = []  # (owner, name, its own attribute before, or None when inherited)

    def patch(owner: Any, name: str, kind: str) -> None:
        patched.append((owner, name, vars(owner).get(name)))
        setattr(owner, name, _wrap(counter, kind, getattr(owner, name)))

    for name in TENSOR_METHODS:
        patch(torch.Tensor, name, f"Tensor.{name}")
    patch(torch.cuda, "synchronize", "cuda.synchronize")
    accelerator = _deepspeed_accelerator()
    if accelerator is not None:
        patch(type(accelerator), "synchronize", "accelerator.synchronize")
    debug = cuda_sync_debug and torch.cuda.is_available()
    with warnings.catch_warnings():
        if debug:
            warnings.simplefilter("always")
            shown = warnings.showwarning

            def on_warning(message: Any, category: Any, filename: str, lineno: int, *rest: Any) -> None:
                if "synchronizing CUDA operation" in str(message):
                    counter.record("cuda", _caller())
                else:
                    shown(message, category, filename, lineno, *rest)

            warnings.showwarning = on_warning
            torch.cuda.set_sync_debug_mode("warn")
            counter.device_truth = True
        try:
            yield counter
        finally:
            if debug:
                torch.cuda.set_sync_debug_mode("default")
            for owner, name, own in reversed(patched):
                if own is None:
                    delattr(owner, name)
                else:
                    setattr(owner, name, own)


def _deepspeed_accelerator() -> Any:
    """DeepSpeed's accelerator object when DeepSpeed is importable (its `synchronize` is what its timers call)."""
    try:
        from deepspeed.accelerator import get_accelerator
    except ImportError:
        return None
    return get_accelerator()
