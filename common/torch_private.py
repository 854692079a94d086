"""The library's only contact with private torch names, each behind a guard, so that a torch release that renames or
drops one costs a fallback (named in the docstring), never a crash. Everything else uses torch's public API: a
private name can vanish in any release, as `torch._C._cuda_getDriverVersion` did, crashing every GPU start before
the first step (issue 51). tests/common/test_no_private_torch.py holds every other library file to that (AST scan),
and every use here to a `try` that catches the name's absence.
"""

from __future__ import annotations

import torch


def raise_recompile_limit(at_least: int) -> bool:
    """TorchDynamo's recompile limit (per compiled function) up to `at_least`: torch has no public setting for it.
    Without it, a compiled model with more graphs than torch's default limit runs the extra ones eagerly (slower,
    not wrong). Returns whether it was set."""
    try:
        import torch._dynamo

        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, at_least)
    except (ImportError, AttributeError):
        return False
    return True


def mark_dynamic_size(tensor: torch.Tensor, dim: int) -> bool:
    """Tell TorchDynamo that `tensor`'s size `dim` varies from call to call, so a compiled graph takes it symbolic at
    its first compile (`torch._dynamo.maybe_mark_dynamic`: no public name in torch 2.13, and no error where the size
    ends up specialized). Without it a compiled model compiles once for the first size and again, dynamic, at the
    first call with another (slower to start, not wrong). Returns whether it was marked."""
    try:
        import torch._dynamo

        torch._dynamo.maybe_mark_dynamic(tensor, dim)
    except (ImportError, AttributeError):
        return False
    return True


def safe_softmax(scores: torch.Tensor, dim: int) -> torch.Tensor:
    """Softmax whose fully masked rows (all -inf) are zeros instead of NaN: aten's `_safe_softmax`, the op
    `F.scaled_dot_product_attention`'s CPU math path runs (so a written-out attention matches it); without it the
    same result from public ops."""
    try:
        op = torch.ops.aten._safe_softmax.default
    except (AttributeError, RuntimeError):
        probs = torch.softmax(scores, dim)
        return torch.where(torch.isneginf(scores).all(dim, keepdim=True), torch.zeros_like(probs), probs)
    return op(scores, dim)


def int8_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """int8 [M, K] @ int8 [K, N] -> int32 [M, N]: `torch._int_mm`, the int8 GEMM where fbgemm is not the quantized
    engine (ARM's qnnpack). Without it, the same exact integer product from public ops (int32 accumulation of int8
    values cannot overflow for K < 2**17), slower."""
    try:
        op = torch._int_mm
    except AttributeError:
        return a.to(torch.int32) @ b.to(torch.int32)
    return op(a, b)
