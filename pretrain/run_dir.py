"""The run directory (`train --output RUN`): created and proven writable by every rank before the process group
exists, and given the resolved configs that say exactly what ran.

RUN/
  config.yaml, ds_config.json   the resolved run config and the filled DeepSpeed config (rank 0, atomic writes)
  checkpoints/                  see pretrain.checkpoint
  metrics.jsonl, events.jsonl, eval.jsonl, tensorboard/   see pretrain.metrics
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from common.errors import UserError
from common.io import atomic_write_text

from .config import RunConfig, save_config


class RunDirError(UserError):
    """The run directory cannot be created or written."""


def prepare_run_dir(run_dir: Path, rank: int) -> None:
    """Create RUN/checkpoints and prove this rank can write there (shared filesystems differ per node)."""
    try:
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write_probe_{rank}_{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise RunDirError(f"run directory {run_dir} is not writable: {e.strerror or e}") from None


def write_resolved_configs(run_dir: Path, cfg: RunConfig, ds_config: dict[str, Any]) -> None:
    save_config(cfg, run_dir / "config.yaml")
    atomic_write_text(run_dir / "ds_config.json", json.dumps(ds_config, indent=2))
