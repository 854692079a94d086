"""Dynamic early exit at inference: exit rules, a batched engine, FLOPs per sample, sweeps, Pareto plots and the
`early-exit` command.

Why batched the way it is: at every exit the samples whose rule fires *leave the batch* (their hidden states, mask rows
and rule state are index-selected away) and the padded length of what remains is cut to its longest survivor. The
work done per layer is therefore proportional to the samples still running, so FLOPs saved by exiting early become
wall time saved, at batch 1 and at batch 32 alike. Batches are length-sorted (right padding is required) so that the
trim is effective and little time goes to padding.

Rules (one threshold τ each, swept to trace a score/FLOPs curve):
- ``entropy``  (DeeBERT): exit when the entropy of the exit's softmax (nats) < τ.
- ``maxprob``: exit when the largest class probability ≥ τ.
- ``patience`` (PABEE): exit when the prediction is unchanged over τ = k consecutive exits (k further exits agree
  with the first); regression: |Δ| < δ counts as unchanged. k = 0 exits at the first exit.
- ``pcee`` (PCEE-BERT): exit after k consecutive exits (``--patience``) whose normalised entropy H / ln K < τ.
- ``lte`` (BERxiT learning-to-exit): one Linear(d, 1) + sigmoid shared by all exits reads the exit's representation
  (the pooled [CLS] for linear exits, h^e for MHA exits) and predicts that exit's error (0/1 for classification,
  tanh|ŷ − y| for regression; BERxiT's certainty is 1 − this). Exit when predicted error < τ. Trained here with the
  backbone and exits frozen (`train_lte_head`).
The last exit always takes the samples still running.

FLOPs per sample come from `elasticbert.flops.sample_flops` (ELUE conventions) with the sample's real length, its
exit layer and every exit head it ran - the same function as static truncation uses - plus 2·d per LTE head call.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from elasticbert import ElasticBertForSequenceClassification, load_pretrained
from elasticbert.flops import sample_flops
from elasticbert.modeling import attention_mask_for_sdpa

from .data import encode_examples, load_tokenizer, subsample
from .tasks import Example, TaskSpec, get_task, load_split

STRATEGIES = ("entropy", "maxprob", "patience", "pcee", "lte")
CLASSIFICATION_ONLY = ("entropy", "maxprob", "pcee")
RESULT_FORMAT = "elasticbert-early-exit/1"
DEFAULT_DATA_DIR = os.environ.get("GLUE_DIR", "../shared/data/glue")


# ------------------------------------------------------------------------------------------------------- exit rules


class ExitRule:
    """Decides, exit by exit, which samples of a batch stop. Holds per-sample state for one batch at a time.

    `start(b)` begins a batch; `decide(position, representation, logits)` is called at the exits in order (position =
    0-based index among the exits run) and returns a bool [b] mask of samples that exit now; `keep(index)` is called
    with the survivors' row indices so that per-sample state follows the shrinking batch.
    """

    name = "rule"

    def __init__(self, threshold: float) -> None:
        self.threshold = float(threshold)

    def start(self, batch_size: int) -> None:
        pass

    def decide(self, position: int, representation: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def keep(self, index: torch.Tensor) -> None:
        pass

    def params(self) -> dict[str, float]:
        """What identifies the operating point (written to the result JSON)."""
        return {"threshold": self.threshold}


def entropy_nats(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) in nats, per row."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


class EntropyRule(ExitRule):
    """DeeBERT: a confident exit has low entropy."""

    name = "entropy"

    def decide(self, position: int, representation: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return entropy_nats(logits) < self.threshold


class MaxProbRule(ExitRule):
    """Exit when the top class probability reaches τ."""

    name = "maxprob"

    def decide(self, position: int, representation: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return torch.softmax(logits.float(), dim=-1).amax(-1) >= self.threshold


class _CountingRule(ExitRule):
    """Shared state for the rules that count consecutive exits: a counter per sample (and the last prediction)."""

    def __init__(self, threshold: float) -> None:
        super().__init__(threshold)
        self.count: torch.Tensor | None = None
        self.previous: torch.Tensor | None = None

    def start(self, batch_size: int) -> None:
        self.count = torch.zeros(batch_size, dtype=torch.long)
        self.previous = None

    def keep(self, index: torch.Tensor) -> None:
        self.count = self.count[index]
        if self.previous is not None:
            self.previous = self.previous[index]


class PatienceRule(_CountingRule):
    """PABEE: exit once the prediction has stayed the same for k consecutive exits (regression: |Δ| < δ)."""

    name = "patience"

    def __init__(self, patience: int, regression: bool = False, delta: float = 0.1) -> None:
        if patience < 0 or int(patience) != patience:
            raise ValueError(f"patience must be a non-negative integer, got {patience}")
        super().__init__(int(patience))
        self.patience = int(patience)
        self.regression = regression
        self.delta = float(delta)

    def decide(self, position: int, representation: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        current = logits[:, 0].float() if self.regression else logits.argmax(-1)
        if self.previous is not None:
            same = (current - self.previous).abs() < self.delta if self.regression else current == self.previous
            self.count = torch.where(same, self.count + 1, torch.zeros_like(self.count))
        self.previous = current
        return self.count >= self.patience

    def params(self) -> dict[str, float]:
        out: dict[str, float] = {"threshold": float(self.patience)}
        if self.regression:
            out["delta"] = self.delta
        return out


class PCEERule(_CountingRule):
    """PCEE-BERT: exit after k consecutive exits whose normalised entropy H / ln K is below τ."""

    name = "pcee"

    def __init__(self, threshold: float, patience: int = 2) -> None:
        super().__init__(threshold)
        if patience < 0:
            raise ValueError(f"PCEE patience must be >= 0, got {patience}")
        self.patience = int(patience)

    def decide(self, position: int, representation: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        normalised = entropy_nats(logits) / math.log(logits.shape[-1])
        confident = normalised < self.threshold
        self.count = torch.where(confident, self.count + 1, torch.zeros_like(self.count))
        return self.count >= self.patience

    def params(self) -> dict[str, float]:
        return {"threshold": self.threshold, "patience": float(self.patience)}


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
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, str(path), metadata=meta)

    @classmethod
    def load(cls, path: str | Path) -> LearnedExitHead:
        from safetensors import safe_open

        state = load_file(str(path))
        head = cls(state["linear.weight"].shape[1])
        head.load_state_dict(state)
        with safe_open(str(path), framework="pt") as fh:
            head.suggested_thresholds = json.loads((fh.metadata() or {}).get("suggested_thresholds", "[]"))
        return head.eval()


class LearnedExitRule(ExitRule):
    """BERxiT LTE: exit when the shared head predicts an error below τ."""

    name = "lte"

    def __init__(self, threshold: float, head: LearnedExitHead) -> None:
        super().__init__(threshold)
        self.head = head.eval()

    def decide(self, position: int, representation: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return self.head(representation) < self.threshold


class StaticRule(ExitRule):
    """Never fires: every sample runs to the last exit it is given (static truncation when that is one exit)."""

    name = "static"

    def __init__(self) -> None:
        super().__init__(float("nan"))

    def decide(self, position: int, representation: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return torch.zeros(logits.shape[0], dtype=torch.bool)


def make_rule(
    strategy: str,
    threshold: float,
    num_labels: int,
    patience: int = 2,
    delta: float = 0.1,
    lte_head: LearnedExitHead | None = None,
) -> ExitRule:
    """An exit rule by name; for `patience` the threshold is k. Rejects rules that do not apply to regression."""
    regression = num_labels == 1
    if strategy in CLASSIFICATION_ONLY and regression:
        raise ValueError(f"strategy {strategy!r} needs class probabilities; for regression use 'patience' or 'lte'")
    if strategy == "entropy":
        return EntropyRule(threshold)
    if strategy == "maxprob":
        return MaxProbRule(threshold)
    if strategy == "patience":
        if threshold != int(threshold):
            raise ValueError(f"patience thresholds are whole numbers of exits, got {threshold}")
        return PatienceRule(int(threshold), regression=regression, delta=delta)
    if strategy == "pcee":
        return PCEERule(threshold, patience=patience)
    if strategy == "lte":
        if lte_head is None:
            raise ValueError("strategy 'lte' needs a trained LearnedExitHead (see train_lte_head / --lte-head)")
        return LearnedExitRule(threshold, lte_head)
    raise ValueError(f"unknown strategy {strategy!r}; expected one of {STRATEGIES}")


def default_sweep(strategy: str, num_labels: int, num_exits: int) -> list[float]:
    """Thresholds that span 'exit almost everything early' to 'almost never exit' for each rule."""
    if strategy == "entropy":
        top = math.log(max(num_labels, 2))
        return [round(top * f, 4) for f in (0.05, 0.1, 0.2, 0.3, 0.45, 0.6, 0.8)]
    if strategy == "maxprob":
        return [0.995, 0.98, 0.95, 0.9, 0.85, 0.8, 0.7]
    if strategy == "patience":
        return [float(k) for k in range(num_exits)]
    if strategy == "pcee":
        return [0.05, 0.1, 0.2, 0.3, 0.45, 0.6, 0.8]
    if strategy == "lte":  # a fixed grid; `sweep` prefers the head's own quantiles (its outputs cluster tightly)
        return [0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.45]
    raise ValueError(f"unknown strategy {strategy!r}")


# ----------------------------------------------------------------------------------------------------------- engine


@dataclass
class EarlyExitResult:
    """Per-sample outputs, in input order: logits at the exit taken, exit layer, real length, exit heads run."""

    logits: torch.Tensor  # [N, K]
    exit_layers: torch.Tensor  # [N]
    lengths: torch.Tensor  # [N]
    exits_evaluated: torch.Tensor  # [N], number of exit heads run (a prefix of the exits used)
    exits: tuple[int, ...] = ()  # the exits the run could use, in order

    @property
    def predictions(self) -> torch.Tensor:
        """Class ids, or the regression value when there is one output."""
        return self.logits[:, 0] if self.logits.shape[-1] == 1 else self.logits.argmax(-1)

    def trace(self, i: int) -> tuple[int, ...]:
        """The exit heads sample i ran (layers), in order."""
        return self.exits[: int(self.exits_evaluated[i])]

    @staticmethod
    def concat(parts: Sequence[EarlyExitResult]) -> EarlyExitResult:
        return EarlyExitResult(
            logits=torch.cat([p.logits for p in parts]),
            exit_layers=torch.cat([p.exit_layers for p in parts]),
            lengths=torch.cat([p.lengths for p in parts]),
            exits_evaluated=torch.cat([p.exits_evaluated for p in parts]),
            exits=parts[0].exits,
        )

    def reorder(self, order: torch.Tensor) -> EarlyExitResult:
        return EarlyExitResult(
            self.logits[order], self.exit_layers[order], self.lengths[order], self.exits_evaluated[order], self.exits
        )


def _check_right_padded(attention_mask: torch.Tensor, lengths: torch.Tensor) -> None:
    if bool(attention_mask.all()):
        return
    positions = torch.arange(attention_mask.shape[1])
    if not torch.equal(attention_mask.bool(), positions[None, :] < lengths[:, None]):
        raise ValueError("early exit needs right-padded inputs (attention_mask = ones then zeros per row)")


def run_batch(
    model: ElasticBertForSequenceClassification,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    token_type_ids: torch.Tensor | None,
    rule: ExitRule,
    exit_layers: Sequence[int] | None = None,
) -> EarlyExitResult:
    """Early-exit inference on one batch. Samples whose rule fires leave the batch; the rest continue, trimmed to
    their longest real length. `exit_layers` restricts which exits run (default: all the model has)."""
    if model.training:
        raise ValueError("run_batch needs model.eval() (dropout would make exits random)")
    exits = tuple(sorted(set(exit_layers))) if exit_layers is not None else model.exit_layers
    unknown = sorted(set(exits) - set(model.exit_layers))
    if unknown:
        raise ValueError(f"layers {unknown} have no exit; this model's exits are {list(model.exit_layers)}")
    batch = input_ids.shape[0]
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    lengths = attention_mask.sum(1)
    _check_right_padded(attention_mask, lengths)
    longest = int(lengths.max())
    input_ids, attention_mask = input_ids[:, :longest], attention_mask[:, :longest]
    if token_type_ids is not None:
        token_type_ids = token_type_ids[:, :longest]

    out_logits = torch.empty(batch, model.config.num_labels)
    out_layer = torch.empty(batch, dtype=torch.long)
    out_count = torch.empty(batch, dtype=torch.long)
    active = torch.arange(batch)
    active_lengths = lengths
    rule.start(batch)
    base = model.elasticbert
    exit_set, last = set(exits), exits[-1]
    with torch.inference_mode():
        hidden = base.embeddings(input_ids, token_type_ids)
        sdpa_mask = attention_mask_for_sdpa(attention_mask)
        position = 0
        for index in range(last):
            hidden = base.encoder.run_layer(index, hidden, sdpa_mask)
            layer = index + 1
            if layer not in exit_set:
                continue
            # no padding left (always so at batch 1): the exit needs no mask, which saves the MHA exit a mask op
            exit_mask = attention_mask if sdpa_mask is not None else None
            representation, logits = model.classify(layer, hidden, exit_mask)
            position += 1
            if layer == last:
                out_logits[active], out_layer[active], out_count[active] = logits.float(), layer, position
                break
            fire = rule.decide(position - 1, representation, logits)
            if active.numel() == 1:  # batch-1 fast path: no index bookkeeping
                if bool(fire):
                    out_logits[active], out_layer[active], out_count[active] = logits.float(), layer, position
                    break
                continue
            fired = int(fire.sum())
            if fired == 0:
                continue
            if fired == active.numel():
                out_logits[active], out_layer[active], out_count[active] = logits.float(), layer, position
                break
            leaving = fire.nonzero().squeeze(1)
            out_logits[active[leaving]] = logits[leaving].float()
            out_layer[active[leaving]] = layer
            out_count[active[leaving]] = position
            survivors = (~fire).nonzero().squeeze(1)
            active, active_lengths = active[survivors], active_lengths[survivors]
            rule.keep(survivors)
            longest = int(active_lengths.max())
            hidden = hidden[survivors, :longest]
            attention_mask = attention_mask[survivors, :longest]
            sdpa_mask = attention_mask_for_sdpa(attention_mask)
    return EarlyExitResult(out_logits, out_layer, lengths, out_count, exits)


# ------------------------------------------------------------------------------------------------------------- data


@dataclass
class EncodedSplit:
    """A tokenised split held as padded tensors (right padding), plus real lengths, labels and submission ids."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor
    labels: torch.Tensor | None
    index: torch.Tensor
    lengths: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.lengths = self.attention_mask.sum(1)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @classmethod
    def from_examples(cls, tokenizer: object, examples: Sequence[Example], max_length: int) -> EncodedSplit:
        enc = encode_examples(tokenizer, examples, max_length)
        return cls(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"], enc.get("labels"), enc["index"])

    def batches(
        self, batch_size: int, sort_by_length: bool = True
    ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """(positions, input_ids, attention_mask, token_type_ids) per batch, each trimmed to its longest row.
        Length-sorted (longest first) unless told otherwise, so that batches carry little padding."""
        order = torch.argsort(self.lengths, descending=True, stable=True) if sort_by_length else torch.arange(len(self))
        out = []
        for start in range(0, len(self), batch_size):
            rows = order[start : start + batch_size]
            longest = int(self.lengths[rows].max())
            out.append(
                (
                    rows,
                    self.input_ids[rows, :longest].contiguous(),
                    self.attention_mask[rows, :longest].contiguous(),
                    self.token_type_ids[rows, :longest].contiguous(),
                )
            )
        return out


def run_dataset(
    model: ElasticBertForSequenceClassification,
    batches: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]],
    rule: ExitRule,
    exit_layers: Sequence[int] | None = None,
) -> tuple[EarlyExitResult, float]:
    """Early exit over pre-built batches; returns per-sample results in dataset order and the wall time (seconds) of
    the model work alone (tokenisation and batching happen before the clock starts)."""
    parts, positions = [], []
    start = time.perf_counter()
    for rows, ids, mask, types in batches:
        parts.append(run_batch(model, ids, mask, types, rule, exit_layers))
        positions.append(rows)
    elapsed = time.perf_counter() - start
    merged = EarlyExitResult.concat(parts)
    order = torch.argsort(torch.cat(positions))
    return merged.reorder(order), elapsed


def run_full_model(
    model: ElasticBertForSequenceClassification,
    batches: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]],
    layer: int | None = None,
) -> tuple[torch.Tensor, float]:
    """The reference a speed-up is measured against: the model's own forward, truncated at one exit (default: the
    last), on the same batches. Returns logits in dataset order and wall time."""
    layer = layer or model.exit_layers[-1]
    outputs, positions = [], []
    start = time.perf_counter()
    with torch.inference_mode():
        for rows, ids, mask, types in batches:
            outputs.append(model(ids, attention_mask=mask, token_type_ids=types, exit_layers=[layer]).logits[0])
            positions.append(rows)
    elapsed = time.perf_counter() - start
    order = torch.argsort(torch.cat(positions))
    return torch.cat(outputs).float()[order], elapsed


# ------------------------------------------------------------------------------------------------------------ FLOPs


def per_sample_flops(
    config: object, result: EarlyExitResult, lte_in_features: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(total, matmul) FLOPs per sample: `sample_flops` with the real length, exit layer and the exit heads run, plus
    2·d for each LTE head call. `matmul` is what a matmul-level counter (FlopCounterMode) sees."""
    total = np.empty(len(result.lengths))
    matmul = np.empty(len(result.lengths))
    for i, (length, layer) in enumerate(zip(result.lengths.tolist(), result.exit_layers.tolist())):
        trace = result.trace(i)
        flops = sample_flops(config, int(length), int(layer), exits_evaluated=trace)
        lte_calls = len(trace) - 1 if trace and trace[-1] == result.exits[-1] else len(trace)
        extra = 2 * lte_in_features * lte_calls  # the last exit takes everyone without asking the head
        total[i], matmul[i] = flops.total + extra, flops.matmul + extra
    return total, matmul


def static_flops(config: object, lengths: torch.Tensor, layer: int) -> np.ndarray:
    """Per-sample FLOPs of static truncation at `layer` (one exit head): the ELUE per-exit baseline points."""
    return np.array([sample_flops(config, int(n), layer).total for n in lengths.tolist()])


# ---------------------------------------------------------------------------------------------------- LTE training


def exit_features(
    model: ElasticBertForSequenceClassification, split: EncodedSplit, batch_size: int = 64
) -> tuple[torch.Tensor, torch.Tensor]:
    """Representations [N, E, d] and logits [N, E, K] at every exit (one full forward per batch)."""
    reps, logits, rows = [], [], []
    with torch.no_grad():
        for positions, ids, mask, types in split.batches(batch_size):  # length-sorted: little padding
            out = model(ids, attention_mask=mask, token_type_ids=types)
            reps.append(torch.stack(out.representations, dim=1).float())
            logits.append(torch.stack(out.logits, dim=1).float())
            rows.append(positions)
    order = torch.argsort(torch.cat(rows))
    return torch.cat(reps)[order], torch.cat(logits)[order]


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
        raise ValueError("LTE training needs a labelled split")
    model.eval()
    reps, logits = exit_features(model, split)
    targets = exit_errors(logits, split.labels)
    features = reps.reshape(-1, reps.shape[-1])
    targets = targets.reshape(-1)
    generator = torch.Generator().manual_seed(seed)
    head = LearnedExitHead(features.shape[-1])
    with torch.no_grad():  # start at the base rate: the bias alone predicts the mean error
        rate = targets.mean().clamp(1e-3, 1 - 1e-3)
        head.linear.weight.zero_()
        head.linear.bias.fill_(float(torch.logit(rate)))
    optimiser = torch.optim.Adam(head.parameters(), lr=lr)
    with torch.no_grad():
        initial = float(F.mse_loss(head(features), targets))
    for _ in range(epochs):
        order = torch.randperm(len(targets), generator=generator)
        for start in range(0, len(targets), batch_size):
            rows = order[start : start + batch_size]
            loss = F.mse_loss(head(features[rows]), targets[rows])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    head.eval()
    with torch.no_grad():
        predicted = head(features)
        final = float(F.mse_loss(predicted, targets))
        per_exit = targets.view(reps.shape[0], -1).mean(0).tolist()
        asked = predicted.view(reps.shape[0], -1)[:, :-1].flatten()  # the last exit never asks the head
        if asked.numel():
            levels = torch.tensor([0.05, 0.15, 0.3, 0.45, 0.6, 0.75, 0.9])
            head.suggested_thresholds = [round(float(q), 4) for q in torch.quantile(asked, levels)]
    stats = {"samples": float(reps.shape[0]), "initial_mse": initial, "final_mse": final}
    stats.update({f"error_rate_exit{layer}": e for layer, e in zip(model.exit_layers, per_exit)})
    return head, stats


# ----------------------------------------------------------------------------------------------- operating points


def exit_histogram(result: EarlyExitResult) -> dict[str, int]:
    """Samples per exit layer (every exit listed, zeros included)."""
    counts = torch.bincount(result.exit_layers, minlength=max(result.exits) + 1)
    return {str(layer): int(counts[layer]) for layer in result.exits}


def score_predictions(task: TaskSpec, predictions: torch.Tensor, labels: torch.Tensor | None) -> dict[str, float]:
    """The task's metrics in percent (with `score`), or {} for an unlabelled split."""
    if labels is None:
        return {}
    return task.compute_metrics(predictions.numpy(), labels.numpy())


@dataclass
class Reference:
    """The full model on the same batches: FLOPs and wall time every speed-up is relative to."""

    mean_flops: float
    wall_time_s: float
    metrics: dict[str, float]


def measure_reference(
    model: ElasticBertForSequenceClassification,
    split: EncodedSplit,
    task: TaskSpec,
    batches: Sequence,
    repeats: int = 1,
) -> Reference:
    last = model.exit_layers[-1]
    times = []
    for _ in range(max(repeats, 1)):
        logits, elapsed = run_full_model(model, batches, last)
        times.append(elapsed)
    preds = logits[:, 0] if logits.shape[-1] == 1 else logits.argmax(-1)
    return Reference(
        mean_flops=float(static_flops(model.config, split.lengths, last).mean()),
        wall_time_s=min(times),
        metrics=score_predictions(task, preds, split.labels),
    )


def evaluate_point(
    model: ElasticBertForSequenceClassification,
    split: EncodedSplit,
    task: TaskSpec,
    rule: ExitRule,
    batches: Sequence,
    reference: Reference,
    repeats: int = 1,
    lte_in_features: int = 0,
) -> tuple[dict, EarlyExitResult]:
    """One operating point: score, mean FLOPs, FLOPs and wall-time speed-ups against `reference`, exit histogram."""
    times = []
    result = None
    for _ in range(max(repeats, 1)):
        result, elapsed = run_dataset(model, batches, rule)
        times.append(elapsed)
    total, _ = per_sample_flops(model.config, result, lte_in_features)
    metrics = score_predictions(task, result.predictions, split.labels)
    mean_flops = float(total.mean())
    wall = min(times)
    point = {
        **rule.params(),
        "score": metrics.get("score"),
        "metrics": metrics,
        "mean_flops": mean_flops,
        "wall_time_s": wall,
        "mean_exit_layer": float(result.exit_layers.float().mean()),
        "exit_histogram": exit_histogram(result),
    }
    add_speedups(point, reference)
    return point, result


def add_speedups(point: dict, reference: Reference) -> dict:
    """FLOPs and wall-time speed-ups of one point against the full model, and wall ÷ FLOPs (1 = FLOPs saved are time
    saved)."""
    point["flops_speedup"] = reference.mean_flops / point["mean_flops"]
    point["wall_speedup"] = reference.wall_time_s / point["wall_time_s"]
    point["speedup_ratio"] = point["wall_speedup"] / point["flops_speedup"]
    return point


def static_curve(
    model: ElasticBertForSequenceClassification,
    split: EncodedSplit,
    task: TaskSpec,
    batches: Sequence,
    reference: Reference,
    repeats: int = 1,
) -> list[dict]:
    """Static truncation at every exit (each exit alone): the per-layer curve and the ELUE baseline's form."""
    points = []
    for layer in model.exit_layers:
        times = []
        for _ in range(max(repeats, 1)):
            logits, elapsed = run_full_model(model, batches, layer)
            times.append(elapsed)
        preds = logits[:, 0] if logits.shape[-1] == 1 else logits.argmax(-1)
        metrics = score_predictions(task, preds, split.labels)
        mean_flops = float(static_flops(model.config, split.lengths, layer).mean())
        point = {"layer": layer, "score": metrics.get("score"), "metrics": metrics, "mean_flops": mean_flops}
        points.append(add_speedups({**point, "wall_time_s": min(times)}, reference))
    return points


def write_samples(path: Path, split: EncodedSplit, result: EarlyExitResult, flops: np.ndarray) -> None:
    """Per-sample record of one operating point: id, prediction, label, exit layer, real length, FLOPs, exits run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    preds = result.predictions.tolist()
    labels = split.labels.tolist() if split.labels is not None else [""] * len(preds)
    with path.open("w", encoding="utf-8") as fh:
        fh.write("index\tprediction\tlabel\texit_layer\tlength\tflops\texits_run\n")
        for i, (idx, pred, label) in enumerate(zip(split.index.tolist(), preds, labels)):
            trace = ",".join(str(layer) for layer in result.trace(i))
            fh.write(
                f"{idx}\t{pred}\t{label}\t{int(result.exit_layers[i])}\t{int(result.lengths[i])}\t"
                f"{flops[i]:.0f}\t{trace}\n"
            )


# ------------------------------------------------------------------------------------------------------------ plots


def plot_pareto(results: dict, path: str | Path) -> Path:
    """Left: score vs mean FLOPs for every strategy (static per-layer curve dashed, for reference). Right: the static
    per-layer curve (score and measured wall-time speed-up per exit layer)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    static = results.get("static", [])
    scale = 1e6
    if static:
        left.plot(
            [p["mean_flops"] / scale for p in static],
            [p["score"] for p in static],
            "k--o",
            label="static (per exit layer)",
            markersize=4,
        )
    markers = dict(zip(STRATEGIES, "sD^vP"))
    for name, entry in results.get("strategies", {}).items():
        pts = sorted(entry["points"], key=lambda p: p["mean_flops"])
        left.plot(
            [p["mean_flops"] / scale for p in pts],
            [p["score"] for p in pts],
            marker=markers.get(name, "o"),
            label=name,
            markersize=4,
        )
    metric = results.get("metric_name", "score")
    left.set_xlabel("mean FLOPs per sample (M, ELUE conventions)")
    left.set_ylabel(f"{results.get('task', '')} {results.get('split', '')} {metric}")
    left.set_title("Early exit: score vs FLOPs")
    left.grid(alpha=0.3)
    left.legend(fontsize=8)
    if static:
        layers = [p["layer"] for p in static]
        right.plot(layers, [p["score"] for p in static], "k-o", markersize=4)
        right.set_xlabel("exit layer (static truncation)")
        right.set_ylabel(metric)
        right.set_title("Static per-layer curve")
        right.grid(alpha=0.3)
        twin = right.twinx()
        twin.plot(layers, [p["wall_speedup"] for p in static], "g:s", markersize=3, label="wall speed-up")
        twin.plot(layers, [p["flops_speedup"] for p in static], "b:^", markersize=3, label="FLOPs speed-up")
        twin.set_ylabel("speed-up vs full model")
        twin.legend(fontsize=8, loc="upper right")
    fig.suptitle(f"{results.get('model', '')}  (batch {results.get('batch_size')})", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# -------------------------------------------------------------------------------------------------------- the sweep


def load_model(path: str | Path) -> ElasticBertForSequenceClassification:
    """A fine-tuned multi-exit classifier from any layout `load_pretrained` reads, in eval mode."""
    model, _ = load_pretrained(ElasticBertForSequenceClassification, path)
    return model.eval()


def parse_thresholds(text: str | None) -> list[float] | None:
    if not text:
        return None
    try:
        return [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"--sweep takes comma-separated numbers, got {text!r}") from None


def resolve_strategies(text: str, num_labels: int) -> list[str]:
    names = list(STRATEGIES) if text == "all" else [s.strip() for s in text.split(",") if s.strip()]
    for name in names:
        if name not in STRATEGIES:
            raise ValueError(f"unknown strategy {name!r}; expected one of {', '.join(STRATEGIES)} or 'all'")
    if num_labels == 1:
        skipped = [n for n in names if n in CLASSIFICATION_ONLY]
        names = [n for n in names if n not in CLASSIFICATION_ONLY]
        if skipped and text != "all":
            raise ValueError(f"strategies {skipped} need class probabilities; this task is regression")
    return names


@dataclass
class SweepConfig:
    """Everything a sweep needs besides the model and data (mirrors the CLI)."""

    strategies: list[str]
    thresholds: dict[str, list[float]] = field(default_factory=dict)
    batch_size: int = 32
    repeats: int = 1
    patience: int = 2
    delta: float = 0.1
    lte_head: LearnedExitHead | None = None
    samples_dir: Path | None = None


def sweep(
    model: ElasticBertForSequenceClassification,
    split: EncodedSplit,
    task: TaskSpec,
    config: SweepConfig,
    log: Callable[[str], None] = print,
) -> dict:
    """The static curve, the full-model reference and every strategy's operating points, as one JSON-able dict."""
    batches = split.batches(config.batch_size)
    run_full_model(model, batches)  # warm-up: the first pass over each batch shape is slower (allocation, kernels)
    reference = measure_reference(model, split, task, batches, config.repeats)
    static = static_curve(model, split, task, batches, reference, config.repeats)
    log(f"full model: score {reference.metrics.get('score')} mean FLOPs {reference.mean_flops:.4g}")
    strategies: dict[str, dict] = {}
    lte_dim = config.lte_head.linear.in_features if config.lte_head is not None else 0
    for name in config.strategies:
        thresholds = config.thresholds.get(name)
        if not thresholds and name == "lte" and config.lte_head is not None:
            thresholds = config.lte_head.suggested_thresholds
        thresholds = thresholds or default_sweep(name, model.config.num_labels, len(model.exit_layers))
        points = []
        for tau in thresholds:
            rule = make_rule(
                name, tau, model.config.num_labels, config.patience, config.delta, lte_head=config.lte_head
            )
            point, result = evaluate_point(
                model, split, task, rule, batches, reference, config.repeats, lte_dim if name == "lte" else 0
            )
            points.append(point)
            if config.samples_dir is not None:
                flops, _ = per_sample_flops(model.config, result, lte_dim if name == "lte" else 0)
                write_samples(config.samples_dir / f"{name}_{tau:g}.tsv", split, result, flops)
            score = "n/a" if point["score"] is None else f"{point['score']:.2f}"
            log(
                f"{name:8s} tau={tau:<7g} score={score}"
                f" FLOPs x{point['flops_speedup']:.2f} wall x{point['wall_speedup']:.2f} (provisional)"
                f" hist {point['exit_histogram']}"
            )
        strategies[name] = {"params": {"patience": config.patience, "delta": config.delta}, "points": points}
    # The reference time is the fastest of: runs before the sweep, one after it, and static truncation at the last
    # exit (the same computation). On a shared machine this keeps load drift from inflating the speed-ups.
    reference.wall_time_s = min(reference.wall_time_s, static[-1]["wall_time_s"], run_full_model(model, batches)[1])
    for point in static + [p for entry in strategies.values() for p in entry["points"]]:
        add_speedups(point, reference)
    return {
        "format": RESULT_FORMAT,
        "task": task.name,
        "metric_name": "+".join(task.metrics),
        "num_samples": len(split),
        "batch_size": config.batch_size,
        "exit_layers": list(model.exit_layers),
        "exit_type": model.config.exit_type,
        "threads": torch.get_num_threads(),
        "full_model": {
            "layer": model.exit_layers[-1],
            "score": reference.metrics.get("score"),
            "metrics": reference.metrics,
            "mean_flops": reference.mean_flops,
            "wall_time_s": reference.wall_time_s,
        },
        "static": static,
        "strategies": strategies,
    }


def summary_table(results: dict) -> str:
    """The operating points with their final speed-ups (after the reference time is settled)."""
    full = results["full_model"]
    lines = [
        f"full model (exit {full['layer']}): score {full['score']:.2f}  mean FLOPs {full['mean_flops'] / 1e6:.1f}M  "
        f"wall {full['wall_time_s']:.2f}s",
        f"{'strategy':9s} {'tau':>7s} {'score':>6s} {'MFLOPs':>7s} {'FLOPs x':>7s} {'wall x':>6s} {'ratio':>5s} "
        "exit histogram",
    ]
    rows = [("static", p["layer"], p) for p in results["static"]]
    rows += [(name, p["threshold"], p) for name, e in results["strategies"].items() for p in e["points"]]
    for name, tau, p in rows:
        hist = " ".join(f"{v}" for v in p["exit_histogram"].values()) if "exit_histogram" in p else ""
        score = f"{p['score']:6.2f}" if p["score"] is not None else "   n/a"
        lines.append(
            f"{name:9s} {tau:>7g} {score} {p['mean_flops'] / 1e6:>7.1f} {p['flops_speedup']:>7.2f} "
            f"{p['wall_speedup']:>6.2f} {p['wall_speedup'] / p['flops_speedup']:>5.2f} {hist}"
        )
    return "\n".join(lines)


def merge_results(previous: dict, current: dict) -> dict:
    """Keep strategies of an earlier run of the same model/task/split/batch size that this run did not redo, so one
    plot can show every strategy even when each was swept separately. (Kept points keep the wall speed-ups measured
    against their own run's reference; FLOPs speed-ups are exact either way.)"""
    keys = ("model", "task", "split", "batch_size", "num_samples")
    if previous.get("format") != RESULT_FORMAT or any(previous.get(k) != current.get(k) for k in keys):
        return current
    merged = dict(current)
    merged["strategies"] = {**previous.get("strategies", {}), **current["strategies"]}
    return merged


# -------------------------------------------------------------------------------------------------------------- CLI


def add_subparser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `early-exit` on the `python -m finetune` command line."""
    p = subparsers.add_parser(
        "early-exit",
        help="sweep early-exit rules on a fine-tuned multi-exit model: score, FLOPs, speed-ups, Pareto plot",
        description="Run dynamic early exit over a GLUE/ELUE split for one or more strategies and thresholds; write "
        "JSON (+ per-sample TSVs) and a Pareto PNG. Speed-ups are against the full model's own forward on the same "
        "batches. Wall times here are single passes (--repeats to repeat); on a shared machine use "
        "bench/early_exit.py, which pairs reference and early exit batch by batch, for the wall/FLOPs ratio.",
    )
    p.add_argument("--model", required=True, help="fine-tuned multi-exit model directory")
    p.add_argument("--task", required=True, help="task name, e.g. SST-2, MRPC, STS-B, elue/SNLI")
    p.add_argument("--strategy", default="all", help=f"comma list of {', '.join(STRATEGIES)}, or 'all'")
    p.add_argument("--sweep", default=None, help="thresholds τ1,τ2,... (one strategy; patience: k values)")
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="GLUE/ELUE tree (default $GLUE_DIR or %(default)s)")
    p.add_argument("--split", default="dev")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--limit", type=int, default=None, help="seeded random subset of the split (small CPU runs)")
    p.add_argument("--patience", type=int, default=2, help="PCEE: consecutive confident exits needed")
    p.add_argument("--delta", type=float, default=0.1, help="PABEE regression: |Δ| below this counts as unchanged")
    p.add_argument("--repeats", type=int, default=1, help="timing repeats (the minimum wall time is kept)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--out", default=None, help="output directory (default runs/early_exit/<task>)")
    p.add_argument("--no-merge", action="store_true", help="overwrite, do not keep other strategies of an earlier run")
    p.add_argument("--lte-head", default=None, help="LTE head file (.safetensors); trained and saved here if absent")
    p.add_argument("--train-lte", action="store_true", help="(re)train the LTE head even if --lte-head exists")
    p.add_argument("--lte-split", default="train")
    p.add_argument("--lte-samples", type=int, default=4000, help="train rows used to fit the LTE head")
    p.add_argument("--lte-epochs", type=int, default=30)
    p.add_argument(
        "--write-submission",
        default=None,
        metavar="DIR",
        help="also run the test split at every operating point and write ELUE-style files under DIR",
    )
    p.set_defaults(func=main)
    return p


def _lte_head_for(
    args: argparse.Namespace,
    model: ElasticBertForSequenceClassification,
    task: TaskSpec,
    out: Path,
    tokenizer: object,
    log: Callable[[str], None],
) -> tuple[LearnedExitHead, Path]:
    path = Path(args.lte_head) if args.lte_head else out / f"lte_head_{task.name.replace('/', '_')}.safetensors"
    if path.is_file() and not args.train_lte:
        log(f"LTE head: loaded {path}")
        return LearnedExitHead.load(path), path
    examples = subsample(load_split(task, args.data_dir, args.lte_split), args.lte_samples, seed=1)
    train = EncodedSplit.from_examples(tokenizer, examples, args.max_length)
    start = time.perf_counter()
    head, stats = train_lte_head(model, train, epochs=args.lte_epochs)
    head.save(path, {"task": task.name, "model": str(args.model), "split": args.lte_split})
    log(
        f"LTE head: trained on {len(train)} {args.lte_split} rows in {time.perf_counter() - start:.1f}s "
        f"(MSE {stats['initial_mse']:.4f} -> {stats['final_mse']:.4f}), saved {path}"
    )
    return head, path


def main(args: argparse.Namespace) -> int:
    """`python -m finetune early-exit ...`"""
    if args.threads:
        torch.set_num_threads(args.threads)
    task = get_task(args.task)
    model = load_model(args.model)
    if model.config.num_labels != task.num_labels:
        raise SystemExit(f"{args.model} has {model.config.num_labels} labels; task {task.name} needs {task.num_labels}")
    tokenizer = load_tokenizer(args.model)
    out = Path(args.out or Path("runs") / "early_exit" / task.name.replace("/", "_"))
    out.mkdir(parents=True, exist_ok=True)
    strategies = resolve_strategies(args.strategy, task.num_labels)
    thresholds = parse_thresholds(args.sweep)
    if thresholds is not None and len(strategies) != 1:
        raise SystemExit("--sweep needs exactly one --strategy (each strategy has its own threshold scale)")
    examples = subsample(load_split(task, args.data_dir, args.split), args.limit)
    split = EncodedSplit.from_examples(tokenizer, examples, args.max_length)
    head, head_path = (None, None)
    if "lte" in strategies:
        head, head_path = _lte_head_for(args, model, task, out, tokenizer, print)
    config = SweepConfig(
        strategies=strategies,
        thresholds={strategies[0]: thresholds} if thresholds else {},
        batch_size=args.batch_size,
        repeats=args.repeats,
        patience=args.patience,
        delta=args.delta,
        lte_head=head,
        samples_dir=out / "samples",
    )
    results = sweep(model, split, task, config)
    results.update(
        model=str(args.model),
        split=args.split,
        data_dir=str(args.data_dir),
        max_length=args.max_length,
        limit=args.limit,
        lte_head=str(head_path) if head_path else None,
    )
    stem = f"early_exit_{task.name.replace('/', '_')}_{args.split}_bs{args.batch_size}"
    json_path = out / f"{stem}.json"
    if json_path.is_file() and not args.no_merge:
        results = merge_results(json.loads(json_path.read_text()), results)
    json_path.write_text(json.dumps(results, indent=1))
    print(summary_table(results))
    png = plot_pareto(results, out / f"{stem}.png")
    print(f"wrote {json_path} and {png}")
    if args.write_submission:
        from .elue import write_submissions_for_results

        written = write_submissions_for_results(results, args.write_submission, model=model, lte_head=head)
        print(f"wrote {len(written)} submission directories under {args.write_submission}")
    return 0
