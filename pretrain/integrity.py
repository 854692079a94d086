"""What pre-training adds to `common.integrity` (the checksums of every directory we write): the errors a checkpoint
that passed verification may still raise when DeepSpeed or torch loads it, and the non-finite-weight check of a state
dict (a checkpoint saved from a diverged run)."""

from __future__ import annotations

import pickle
import zipfile
from collections.abc import Mapping
from typing import Any

# What DeepSpeed / torch raise on a checkpoint that passed verification but still cannot be read (another DeepSpeed
# version, a hand-edited file): caught where checkpoints are loaded and reported with the directory's name.
LOAD_ERRORS = (RuntimeError, OSError, EOFError, KeyError, ValueError, AssertionError, pickle.UnpicklingError)
LOAD_ERRORS += (zipfile.BadZipFile,)


def nonfinite_tensors(state: Mapping[str, Any], limit: int = 5) -> tuple[int, list[str]]:
    """(number of tensors with a NaN/inf, the first `limit` names) of a state dict."""
    import torch

    bad = [k for k, v in state.items() if isinstance(v, torch.Tensor) and v.is_floating_point() and not _finite(v)]
    return len(bad), bad[:limit]


def _finite(t: Any) -> bool:
    import torch

    return bool(torch.isfinite(t).all()) if t.numel() else True
