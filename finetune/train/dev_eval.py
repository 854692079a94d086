"""The fine-tuning loop's dev bookkeeping: each evaluation's per-exit scores and selection score (the mean main metric
over the exits the phase trains), the history dev_scores.json keeps, the phase's best weights (kept in memory and
restored at the phase's end), and early stopping (`early_stopping_patience` evaluations in a row without a better
selection score: the official ElasticBERT `--early_stop_steps`). The trainer runs the model; this class judges."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import torch

from ..tasks import TaskSpec
from .methods import Phase


@dataclass
class EvalResult:
    step: int
    scores: dict[int, dict[str, float]]
    selection: float

    def to_json(self) -> dict:
        return {"step": self.step, "scores": {str(k): v for k, v in self.scores.items()}, "selection": self.selection}

    @classmethod
    def from_json(cls, data: dict) -> EvalResult:
        return cls(data["step"], {int(k): v for k, v in data["scores"].items()}, data["selection"])


class DevTracker:
    """Dev evaluations of a run: history, the current phase's best (and its weights), early stopping."""

    def __init__(self, task: TaskSpec, patience: int | None, rank: int = 0) -> None:
        self.task, self.patience, self.rank = task, patience, rank
        self.history: list[dict] = []
        self.best: EvalResult | None = None
        self.best_phase: str | None = None
        self.best_state: dict[str, torch.Tensor] | None = None
        self.evals_without_improvement = 0
        self.stopped_early: list[dict] = []

    def start_phase(self) -> None:
        """Each phase selects its own best (2ST's stage 2 is judged on the exits it trains)."""
        self.best = None
        self.evals_without_improvement = 0

    def record(
        self, phase: Phase, step: int, global_step: int, scores: dict[int, dict[str, float]], model: torch.nn.Module
    ) -> EvalResult:
        """One evaluation's `scores` (exit → metrics): into the history, and the best so far (with a copy of
        `model`'s weights) when its selection score is higher."""
        main = self.task.main_metric
        selection = float(np.mean([scores[layer][main] for layer in phase.trained_exits]))
        result = EvalResult(step, scores, selection)
        self.history.append(
            {
                "phase": phase.name,
                "step": step,
                "global_step": global_step,
                "selection": selection,
                "exits": {str(k): v for k, v in scores.items()},
            }
        )
        if self.best is None or selection > self.best.selection:
            self.best = result
            self.best_phase = phase.name
            self.best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            self.evals_without_improvement = 0
        else:
            self.evals_without_improvement += 1
        return result

    def should_stop(self, phase: Phase, step: int, total: int) -> bool:
        """Early stopping: `early_stopping_patience` evaluations in a row without a better selection score."""
        patience = self.patience
        if patience is None or step == total or self.evals_without_improvement < patience:
            return False
        record = {"phase": phase.name, "step": step, "of": total, "patience": patience, "best_step": self.best.step}
        self.stopped_early.append(record)
        if self.rank == 0:
            print(
                f"{self.task.name} {phase.name}: stopped early at step {step}/{total}: {patience} evaluations "
                f"without a better dev score (best at step {self.best.step})",
                file=sys.stderr,
                flush=True,
            )
        return True

    def state(self) -> dict:
        """What a resume checkpoint's state.json keeps of the dev bookkeeping (the best weights go beside it)."""
        return {
            "history": self.history,
            "best": self.best.to_json() if self.best is not None else None,
            "best_phase": self.best_phase,
            "evals_without_improvement": self.evals_without_improvement,
            "stopped_early": self.stopped_early,
        }

    def load_state(self, state: dict, best_state: dict[str, torch.Tensor] | None) -> None:
        self.history, self.stopped_early = state["history"], state["stopped_early"]
        self.best = EvalResult.from_json(state["best"]) if state["best"] is not None else None
        if state["best_phase"] is not None:
            self.best_phase = state["best_phase"]
        if self.best is not None:
            self.best_state = best_state
        self.evals_without_improvement = state["evals_without_improvement"]

    def best_json(self) -> dict:
        """dev_scores.json's `best`: the phase, step, selection score and per-exit scores of the run's best."""
        best = self.best
        return {
            "phase": self.best_phase,
            "step": best.step if best else None,
            "selection": best.selection if best else None,
            "exits": {str(k): v for k, v in best.scores.items()} if best else {},
        }
