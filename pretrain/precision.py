"""Precision that fits the hardware, and the fp16 loss scaler's bookkeeping.

`train.precision`:
  auto  bf16 on a GPU with native bf16 (compute capability >= 8: A100, H100), fp16 with dynamic loss scaling on one
        without (V100: bf16 would be emulated, several times slower), fp32 on CPU (DeepSpeed has no fp16 there); a
        DeepSpeed JSON that enables bf16 or fp16 itself (`ds_configs/zero*_bf16.json`, `*_fp16.json`) pins it.
  bf16 | fp16 | fp32  exactly that (bf16 refused on a GPU without native bf16, fp16 refused on CPU).
The JSON's `bf16`/`fp16` sections are generated from the choice (`apply_precision`); the fp16 section keeps the
JSON's loss-scaling settings and gets DeepSpeed's dynamic scaling (`FP16_DYNAMIC`) where it has none.

fp16 steps whose gradients overflow are skipped by DeepSpeed, which then lowers the loss scale; `step_precision_record`
reads what happened (skipped or not, total skipped, current scale) for the step log and TensorBoard. DeepSpeed keeps
the scaler in its checkpoints (ZeRO 1-3: the `loss_scaler` object in the optimizer states, also carried through a
universal conversion; ZeRO-0: `cur_scale` and its counters) and restores it on load, so a resume continues with the
same scale; tests/pretrain/test_precision.py checks this with a real engine and a fake overflow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from common.torch_build import require_runnable_build

Precision = Literal["bf16", "fp16", "fp32"]
FP16_DYNAMIC: dict[str, Any] = {
    "loss_scale": 0,  # 0 = dynamic
    "initial_scale_power": 16,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1,
}


@dataclass(frozen=True)
class DeviceCaps:
    """What the precision choice needs to know about the device this rank trains on."""

    kind: Literal["cpu", "cuda"]
    name: str = "CPU"
    native_bf16: bool = False
    capability: str = ""
    notes: tuple[str, ...] = ()  # what the start-up could not check on this device (printed as notes)

    @classmethod
    def cpu(cls) -> DeviceCaps:
        return cls("cpu")

    @classmethod
    def detect(cls, local_rank: int = 0) -> DeviceCaps:
        """The GPU this rank will use (CUDA device `local_rank`), else the CPU. Native bf16 means compute capability
        >= 8 (ROCm GPUs all have it); bf16 that torch could only emulate does not count. Reads device properties
        only: no CUDA context is created. A torch without this GPU's kernels is refused here, on every rank, before
        anything starts (`common.torch_build`)."""
        import torch

        notes = require_runnable_build(local_rank)

        if not torch.cuda.is_available():
            return cls.cpu()
        props = torch.cuda.get_device_properties(local_rank % torch.cuda.device_count())
        native = bool(torch.version.hip) or props.major >= 8
        return cls("cuda", props.name, native, f"{props.major}.{props.minor}", notes)

    def describe(self) -> str:
        if self.kind == "cpu":
            return "CPU"
        cc = f", compute capability {self.capability}" if self.capability else ""
        return f"{self.name} ({'native bf16' if self.native_bf16 else 'no native bf16'}{cc})"


@dataclass(frozen=True)
class PrecisionChoice:
    precision: Precision
    reason: str


def _json_choice(ds: dict[str, Any]) -> Precision | None:
    for section in ("bf16", "fp16"):
        if ds.get(section, {}).get("enabled") is True:
            return section  # type: ignore[return-value]
    return None


def choose_precision(requested: str, ds: dict[str, Any], caps: DeviceCaps) -> PrecisionChoice:
    """The precision a run trains in, and why (printed in the first log lines)."""
    if requested != "auto":
        return PrecisionChoice(requested, f"train.precision={requested}")  # type: ignore[arg-type]
    pinned = _json_choice(ds)
    if pinned is not None:
        return PrecisionChoice(pinned, f"the DeepSpeed JSON enables {pinned}")
    if caps.kind == "cpu":
        return PrecisionChoice("fp32", "auto: CPU (DeepSpeed has no fp16 there; train.precision=bf16 for bf16)")
    if caps.native_bf16:
        return PrecisionChoice("bf16", f"auto: {caps.describe()}")
    return PrecisionChoice("fp16", f"auto: {caps.describe()}: fp16 with dynamic loss scaling")


def precision_problems(choice: PrecisionChoice, caps: DeviceCaps) -> list[str]:
    if choice.precision == "fp16" and caps.kind == "cpu":
        return [
            "fp16 is not supported by DeepSpeed on CPU ('Type fp16 is not supported on your device'): "
            "use ds_configs/cpu_fp32.json, or bf16 (train.precision=bf16)"
        ]
    if choice.precision == "bf16" and caps.kind == "cuda" and not caps.native_bf16:
        return [
            f"bf16 requested ({choice.reason}) but {caps.describe()} would only emulate it: use "
            "train.precision=auto (fp16 with dynamic loss scaling there) or train.precision=fp16"
        ]
    return []


def apply_precision(ds: dict[str, Any], precision: Precision) -> None:
    """Write the `bf16` / `fp16` sections of a DeepSpeed config for `precision` (in place).

    bf16: `check_grad_overflow` off unless the JSON sets it. DeepSpeed's default reads an overflow flag and the
    norm's validity on the host every step (two host syncs in ZeRO 1-2's step) to skip a non-finite step; here a
    non-finite loss or gradient norm stops the run at that step and nothing after it is ever saved (pretrain.guards),
    so the skip would add nothing but the syncs. fp16 keeps its check: the loss scaler needs it on the host."""
    ds["bf16"] = {**ds.get("bf16", {}), "enabled": precision == "bf16"}
    if precision == "bf16" and ds["bf16"].get("check_grad_overflow", "auto") == "auto":
        ds["bf16"]["check_grad_overflow"] = False
    fp16 = {**ds.get("fp16", {}), "enabled": precision == "fp16"}
    if precision == "fp16":
        fp16 = {**FP16_DYNAMIC, **{k: v for k, v in fp16.items() if v != "auto"}}
    ds["fp16"] = fp16


def precision_of(ds: dict[str, Any]) -> Precision:
    """The precision a filled DeepSpeed config trains in."""
    return _json_choice(ds) or "fp32"


def describe_precision(choice: PrecisionChoice, ds: dict[str, Any]) -> str:
    """One line for the start of the log: what, why, and the fp16 scaler's start."""
    text = f"{choice.precision} ({choice.reason})"
    if choice.precision == "fp16":
        fp16 = ds.get("fp16", {})
        if fp16.get("loss_scale", 0) == 0:
            text += (
                f"; dynamic loss scale from 2^{fp16.get('initial_scale_power')}, x2 after "
                f"{fp16.get('loss_scale_window')} clean steps, /2 after {fp16.get('hysteresis')} overflows, "
                f"min {fp16.get('min_loss_scale')}"
            )
        else:
            text += f"; static loss scale {fp16.get('loss_scale')}"
    return text


def step_precision_record(engine: Any, precision: str) -> dict[str, Any]:
    """After an optimizer step: was it skipped (fp16 overflow), how many were skipped so far (DeepSpeed keeps the
    count in its checkpoints), and the fp16 loss scale now (None in bf16 / fp32)."""
    applied = engine.was_step_applied() if hasattr(engine, "was_step_applied") else True
    scale = getattr(engine.optimizer, "loss_scale", None) if precision == "fp16" else None
    return {
        "step_skipped": not applied,
        "skipped_steps": int(getattr(engine, "skipped_steps", 0)),
        "loss_scale": float(scale) if scale is not None else None,
    }
