"""Model FLOPs utilisation: useful training FLOP/s (elasticbert.flops' count for the active exits) over the peak of
the devices. The peak is `logging.peak_tflops` when set, else a table of GPU peaks, else (CPU) a matmul measured
in this process."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from elasticbert import ElasticBertConfig
from elasticbert.flops import training_flops_per_token

# Dense bf16/fp16 tensor-core peaks per device (TFLOP/s), matched by substring of the CUDA device name.
GPU_PEAK_TFLOPS = {"A100": 312.0, "H100": 989.0, "H200": 989.0, "V100": 125.0, "A10": 125.0, "L40": 181.0}


def measure_peak_flops(dtype: torch.dtype, n: int = 1024, reps: int = 4) -> float:
    """Matmul FLOP/s of this process on CPU (its threads): the MFU denominator when no peak is configured."""
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    a @ b
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - t0)


def peak_flops(configured_tflops: float | None, device: str, precision: str) -> float | None:
    """FLOP/s of one device: configured, from the GPU table (None for an unknown GPU), or measured on CPU."""
    if configured_tflops:
        return configured_tflops * 1e12
    if device == "cuda":
        name = torch.cuda.get_device_name()
        for key, tf in GPU_PEAK_TFLOPS.items():
            if key in name:
                return tf * 1e12 if precision != "fp32" else tf * 1e12 / 16  # tf32-less fp32 is far lower
        return None
    return measure_peak_flops(torch.bfloat16 if precision == "bf16" else torch.float32)


def model_flops_utilization(
    model_config: ElasticBertConfig,
    active_exits: Sequence[int],
    tokens: float,
    masked: float,
    samples: int,
    seconds: float,
    peak_per_device: float,
    world_size: int,
    attended: float | None = None,
) -> float:
    """MFU of one optimizer step that trained `active_exits` on `tokens` real tokens (`masked` of them MLM
    targets) in `samples` sequences, taking `seconds` on `world_size` devices. Only real tokens count: padding, and
    the attention between packed samples that the mask forbids, are not useful work. `attended` = Σ over samples of
    length² (the step's attention work); None: every sample taken at the mean length."""
    if not tokens:
        return 0.0
    length = attended / tokens if attended else tokens / samples
    per_token = training_flops_per_token(
        model_config, active_exits, max(length, 1.0), masked / tokens, sequences_per_token=samples / tokens
    )
    return per_token * tokens / seconds / (peak_per_device * world_size)
