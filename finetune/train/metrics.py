"""What the fine-tuning loop logs: TensorBoard scalars (train loss, learning rate, per-exit loss terms, ACL angles,
dev scores) on rank 0, and the per-batch ACL-Grad angle records that become RUN_DIR/acl_diagnostics.json."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..config import ObjectiveConfig
from .acl_grad import AngleRecord, ExitTerms
from .methods import Phase


class TrainMetrics:
    """The run's TensorBoard writer (rank 0 only; `open` makes it) and the angle records of every measured batch."""

    def __init__(self) -> None:
        self.writer = None
        self.angles: list[dict] = []

    def open(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run_dir / "tensorboard"))

    def close(self) -> None:
        """Flush the events to disk (also when the run is preempted or interrupted)."""
        if self.writer is not None:
            self.writer.close()

    def log_step(
        self, phase: Phase, step: int, global_step: int, terms: list[ExitTerms], record: AngleRecord | None, stats: dict
    ) -> None:
        if record is not None:
            self.angles.append(
                {
                    "phase": phase.name,
                    "step": step,
                    "global_step": global_step,
                    "angle": record.angle,
                    "per_exit": {str(k): v for k, v in record.per_exit.items()},
                    "dropped": record.dropped,
                    "num_exits": record.num_exits,
                }
            )
        if self.writer is None:
            return
        g = global_step
        self.writer.add_scalar(f"train/loss/{phase.name}", stats["loss"], g)
        self.writer.add_scalar("train/lr", stats["lr"], g)
        for t in terms:
            self.writer.add_scalar(f"train/task_loss/layer_{t.layer}", float(t.task.detach()), g)
            if t.contrastive is not None:
                self.writer.add_scalar(f"train/contrastive_loss/layer_{t.layer}", float(t.contrastive.detach()), g)
        if record is not None:
            if record.angle is not None:
                self.writer.add_scalar("acl/angle", record.angle, g)
            for layer, angle in record.per_exit.items():
                if angle is not None:
                    self.writer.add_scalar(f"acl/angle/layer_{layer}", angle, g)
            self.writer.add_scalar("acl/dropped", float(record.dropped_batch), g)

    def log_dev(self, phase: Phase, scores: dict[int, dict[str, float]], selection: float, global_step: int) -> None:
        if self.writer is None:
            return
        for layer, metrics in scores.items():
            for name, value in metrics.items():
                self.writer.add_scalar(f"dev/{name}/layer_{layer}", value, global_step)
        self.writer.add_scalar(f"dev/selection/{phase.name}", selection, global_step)

    def angle_summary(self, objective: ObjectiveConfig) -> dict:
        """Fraction of batches whose CE/contrastive angle exceeds 90°, ACL-Grad's drop rate, and the raw records."""
        measured = [r["angle"] for r in self.angles if r["angle"] is not None]
        pairs = sum(r["num_exits"] for r in self.angles)
        return {
            "scope": objective.acl_grad_scope,
            "granularity": objective.acl_grad_granularity,
            "threshold": objective.acl_grad_threshold,
            "acl_grad": objective.acl_grad,
            "batches": len(self.angles),
            "mean_angle": float(np.mean(measured)) if measured else None,
            "fraction_over_90": float(np.mean([a > 90.0 for a in measured])) if measured else None,
            "drop_rate": float(np.mean([bool(r["dropped"]) for r in self.angles])) if self.angles else None,
            "exit_drop_rate": sum(len(r["dropped"]) for r in self.angles) / pairs if pairs else None,
            "records": self.angles,
        }
