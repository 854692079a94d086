"""BERxiT's learning-to-exit (LTE) head: its features, the errors it learns, its training, its file.

One Linear(d, 1) + sigmoid shared by all exits reads the exit's representation (the pooled [CLS] for linear exits,
h^e for MHA exits) and predicts that exit's error (0/1 for classification, tanh|ŷ − y| for regression; BERxiT's
certainty is 1 − this). The `lte` rule exits when the predicted error is below τ. Trained here with the backbone and
exits frozen: the backbone runs once per training sample, then a few epochs fit the head on the cached features.
The engine counts 2·d FLOPs per head call.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from common.io import atomic_path, make_dirs
from elasticbert import ElasticBertForSequenceClassification

from ...data import EncodedSplit, forward_in_order
from ...model import exit_logits
from ...tasks import DataError

THRESHOLD_QUANTILES = (0.05, 0.15, 0.3, 0.45, 0.6, 0.75, 0.9)  # of the head's predictions: its default sweep


class LearnedExitHead(nn.Module):
    """BERxiT's learning-to-exit module: one Linear(d, 1) + sigmoid shared by all exits; outputs predicted error."""

    def __init__(self, in_features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, 1)
        self.suggested_thresholds: list[float] = []  # quantiles of its predictions on the rows it was fitted on

    def forward(self, representation: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.linear(representation.float())).squeeze(-1)

    def save(self, path: str | Path, metadata: dict[str, str] | None = None) -> None:
        meta = {
            "in_features": str(self.linear.in_features),
            "suggested_thresholds": json.dumps(self.suggested_thresholds),
            **(metadata or {}),
        }
        make_dirs(Path(path).parent)
        with atomic_path(path) as tmp:
            save_file({k: v.contiguous() for k, v in self.state_dict().items()}, str(tmp), metadata=meta)

    @classmethod
    def load(cls, path: str | Path) -> LearnedExitHead:
        if not Path(path).is_file():
            raise DataError(f"{path}: no LTE head file (train one with `early-exit --train-lte`)")
        try:
            state = load_file(str(path))
            head = cls(state["linear.weight"].shape[1])
            head.load_state_dict(state)
            with safe_open(str(path), framework="pt") as fh:
                head.suggested_thresholds = json.loads((fh.metadata() or {}).get("suggested_thresholds", "[]"))
        except (SafetensorError, OSError, KeyError, IndexError, RuntimeError, ValueError) as err:
            raise DataError(
                f"{path}: not a readable LTE head ({type(err).__name__}: {err}); retrain it with "
                "`early-exit --train-lte`"
            ) from None
        return head.eval()


def exit_features(
    model: ElasticBertForSequenceClassification, split: EncodedSplit, batch_size: int = 64
) -> tuple[torch.Tensor, torch.Tensor]:
    """Representations [N, E, d] and logits [N, E, K] at every exit (one full forward per batch), in split order."""

    def forward(ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = model(ids, attention_mask=mask, token_type_ids=types, exit_layers=model.exit_layers)
        return torch.stack(out.representations, dim=1).float(), torch.stack(exit_logits(out), dim=1).float()

    batches = split.batches(batch_size, device=model.device)  # length-sorted: little padding
    with torch.no_grad():
        (reps, logits), _ = forward_in_order(forward, batches)  # back on the CPU, where the head is fitted
    return reps, logits


def exit_errors(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per (sample, exit) error the LTE head learns: 1[wrong] for classes, tanh|ŷ − y| for regression."""
    if logits.shape[-1] == 1:
        return torch.tanh((logits[..., 0] - labels[:, None].float()).abs())
    return (logits.argmax(-1) != labels[:, None]).float()


def train_lte_head(
    model: ElasticBertForSequenceClassification,
    split: EncodedSplit,
    epochs: int = 30,
    lr: float = 1e-2,
    batch_size: int = 256,
    seed: int = 0,
) -> tuple[LearnedExitHead, dict[str, float]]:
    """Fit the shared LTE head on a frozen fine-tuned model: features once, then a few epochs of MSE (as BERxiT)
    between the head's sigmoid and each exit's observed error. Cheap: the backbone runs once per sample."""
    if split.labels is None:
        raise DataError("LTE training needs a labelled split")
    model.eval()
    reps, logits = exit_features(model, split)
    targets = exit_errors(logits, split.labels)
    features = reps.reshape(-1, reps.shape[-1])
    targets = targets.reshape(-1)
    head = _head_at_base_rate(features.shape[-1], targets)
    with torch.no_grad():
        initial = float(F.mse_loss(head(features), targets))
    _fit(head, features, targets, epochs, lr, batch_size, seed)
    head.eval()
    with torch.no_grad():
        predicted = head(features)
        final = float(F.mse_loss(predicted, targets))
        per_exit = targets.view(reps.shape[0], -1).mean(0).tolist()
        asked = predicted.view(reps.shape[0], -1)[:, :-1].flatten()  # the last exit never asks the head
        if asked.numel():
            levels = torch.tensor(THRESHOLD_QUANTILES)
            head.suggested_thresholds = [round(float(q), 4) for q in torch.quantile(asked, levels)]
    stats = {"samples": float(reps.shape[0]), "initial_mse": initial, "final_mse": final}
    stats.update({f"error_rate_exit{layer}": e for layer, e in zip(model.exit_layers, per_exit)})
    return head, stats


def _head_at_base_rate(in_features: int, targets: torch.Tensor) -> LearnedExitHead:
    """A head whose bias alone predicts the mean error (weights zero): the fit starts from the base rate."""
    head = LearnedExitHead(in_features)
    with torch.no_grad():
        rate = targets.mean().clamp(1e-3, 1 - 1e-3)
        head.linear.weight.zero_()
        head.linear.bias.fill_(float(torch.logit(rate)))
    return head


def _fit(
    head: LearnedExitHead,
    features: torch.Tensor,
    targets: torch.Tensor,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
) -> None:
    """Adam on the MSE between the head's output and the observed errors, seeded shuffles per epoch."""
    generator = torch.Generator().manual_seed(seed)
    optimiser = torch.optim.Adam(head.parameters(), lr=lr)
    for _ in range(epochs):
        order = torch.randperm(len(targets), generator=generator)
        for start in range(0, len(targets), batch_size):
            rows = order[start : start + batch_size]
            loss = F.mse_loss(head(features[rows]), targets[rows])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
