"""Exit thresholds for the early-exit tests that compare two runs of the engine."""

import torch


def threshold_in_widest_gap(values: torch.Tensor, min_gap: float = 0.0) -> float:
    """A threshold in the widest gap among the middle half of `values`: far from every observed value, so that the
    float noise between two runs (padded and unpadded, batched and alone, torch and ONNX Runtime) cannot flip a
    decision, with samples on both sides; `min_gap`: the gap must be wider. Rounded to 6 decimals (it travels through
    JSON and command lines)."""
    v = torch.sort(values.flatten().float()).values
    lo, hi = len(v) // 4, 3 * len(v) // 4
    gaps = v[lo + 1 : hi + 1] - v[lo:hi]
    i = lo + int(gaps.argmax())
    assert v[i + 1] - v[i] > min_gap, "no usable gap between observed values"
    return round(float(v[i] + v[i + 1]) / 2, 6)
