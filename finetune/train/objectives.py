"""Loss terms of one exit: CE/MSE, Hinton KD, SCL (Gunel et al.), ACL-Embed and ACL-CL.

Supervised contrastive loss on L2-normalised items z with labels y and temperature τ (DESIGN.md, "Fine-tuning"):

    L = −Σ_i 1/|P(i)| Σ_{p∈P(i)} log( exp(z_i·z_p/τ) / Σ_{a≠i} exp(z_i·z_a/τ) ),   P(i) = {p ≠ i : y_p = y_i}

Anchors with no positive (a class present once) contribute nothing. `reduction="sum"` is the formula (Gunel et al.
sum over the batch); "mean" averages over the anchors that have positives.
- SCL: the items are the exit representations (N items).
- ACL-Embed: plus the K label embeddings (rows of the exit classifier's weight), item k labelled k (N + K items).
- ACL-CL: plus the frozen teacher exit's representations and label embeddings, detached (2N + 2K items).

`exit_terms` assembles them for one training step: each trained exit's task term (with KD from the teacher for
students) and its contrastive term, as `cfg.objective` says.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from elasticbert import ElasticBertForSequenceClassification
from elasticbert.modeling import upcast

from ..config import FinetuneConfig
from ..model import exit_parameters, label_embeddings
from .acl_grad import ExitTerms
from .methods import Phase, exit_weights

ExitOutputs = dict[int, tuple[torch.Tensor, torch.Tensor]]  # layer -> (representation h^e, logits)


def supervised_contrastive(
    items: torch.Tensor, labels: torch.Tensor, tau: float, reduction: str = "sum", normalise: bool = True
) -> torch.Tensor:
    """The SCL formula above on [M, d] items; differentiable; 0 (graph kept) when no anchor has a positive."""
    z = upcast(items)
    if normalise:
        z = F.normalize(z, dim=-1)
    m = z.shape[0]
    eye = torch.eye(m, dtype=torch.bool, device=z.device)
    sim = (z @ z.T / tau).masked_fill(eye, float("-inf"))
    log_prob = sim - torch.logsumexp(sim, dim=1, keepdim=True)
    positives = (labels[:, None] == labels[None, :]) & ~eye
    count = positives.sum(dim=1)
    per_anchor = -log_prob.masked_fill(~positives, 0.0).sum(dim=1) / count.clamp(min=1)
    valid = count > 0
    if not bool(valid.any()):
        return z.sum() * 0.0
    if reduction == "sum":
        return per_anchor[valid].sum()
    if reduction == "mean":
        return per_anchor[valid].mean()
    raise ValueError(f"reduction must be 'sum' or 'mean', not {reduction!r}")


def class_items(num_labels: int, device: torch.device) -> torch.Tensor:
    """Labels of the K label-embedding items: class k for row k."""
    return torch.arange(num_labels, device=device)


def scl_loss(reps: torch.Tensor, labels: torch.Tensor, tau: float, reduction: str = "sum") -> torch.Tensor:
    """CE+SCL's contrastive term (Gunel et al.): the batch's exit representations only."""
    return supervised_contrastive(reps, labels, tau, reduction)


def acl_embed_loss(
    reps: torch.Tensor, labels: torch.Tensor, label_emb: torch.Tensor, tau: float, reduction: str = "sum"
) -> torch.Tensor:
    """ACL-Embed: the batch augmented with the K (normalised) label embeddings, labelled 0..K-1."""
    items = torch.cat([F.normalize(upcast(reps), dim=-1), F.normalize(upcast(label_emb), dim=-1)])
    item_labels = torch.cat([labels, class_items(label_emb.shape[0], labels.device)])
    return supervised_contrastive(items, item_labels, tau, reduction, normalise=False)


def acl_cl_loss(
    reps: torch.Tensor,
    labels: torch.Tensor,
    label_emb: torch.Tensor,
    teacher_reps: torch.Tensor,
    teacher_label_emb: torch.Tensor,
    tau: float,
    reduction: str = "sum",
) -> torch.Tensor:
    """ACL-CL: student items (trainable) plus the teacher exit's items (detached: they receive no gradient)."""
    k = label_emb.shape[0]
    cls = class_items(k, labels.device)
    items = torch.cat(
        [
            F.normalize(upcast(reps), dim=-1),
            F.normalize(upcast(label_emb), dim=-1),
            F.normalize(upcast(teacher_reps.detach()), dim=-1),
            F.normalize(upcast(teacher_label_emb.detach()), dim=-1),
        ]
    )
    item_labels = torch.cat([labels, cls, labels, cls])
    return supervised_contrastive(items, item_labels, tau, reduction, normalise=False)


def task_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """CE for classification, MSE for regression (one output)."""
    if logits.shape[-1] == 1:
        return F.mse_loss(upcast(logits.squeeze(-1)), labels.to(torch.float32))
    return F.cross_entropy(upcast(logits), labels)


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Hinton KD: T² · KL(softmax(t/T) ‖ softmax(s/T)), batch mean; regression: MSE to the teacher's output."""
    teacher = upcast(teacher_logits.detach())
    student = upcast(student_logits)
    if student.shape[-1] == 1:
        return F.mse_loss(student, teacher)
    t = temperature
    return F.kl_div(
        F.log_softmax(student / t, dim=-1), F.log_softmax(teacher / t, dim=-1), reduction="batchmean", log_target=True
    ) * (t * t)


def exit_terms(
    model: ElasticBertForSequenceClassification,
    cfg: FinetuneConfig,
    phase: Phase,
    step: int,
    outputs: ExitOutputs,
    labels: torch.Tensor,
) -> list[ExitTerms]:
    """Each trained exit's task term ((1−β)·CE + β·KD for students) and contrastive term (per `cfg.objective`)."""
    obj = cfg.objective
    exits = phase.exits_at(step)
    weights = exit_weights(exits, cfg.method.jt_weights)
    kd_weight = obj.kd_weight if obj.kd_weight is not None else (0.5 if phase.freeze_backbone else 0.0)
    teacher = phase.teacher
    terms = []
    for layer in exits:
        rep, logits = outputs[layer]
        task = task_loss(logits, labels)
        student = teacher is not None and layer != teacher
        if student and kd_weight > 0:
            task = (1.0 - kd_weight) * task + kd_weight * kd_loss(logits, outputs[teacher][1], obj.kd_temperature)
        contrastive = None
        if obj.name == "ce+scl":
            contrastive = scl_loss(rep, labels, obj.tau, obj.contrastive_reduction)
        elif obj.name == "acl" or (obj.name == "acl-cl" and not student):
            embeddings = label_embeddings(model, layer)
            contrastive = acl_embed_loss(rep, labels, embeddings, obj.tau, obj.contrastive_reduction)
        elif obj.name == "acl-cl":
            contrastive = acl_cl_loss(
                rep,
                labels,
                label_embeddings(model, layer),
                outputs[teacher][0],
                label_embeddings(model, teacher),
                obj.tau,
                obj.contrastive_reduction,
            )
        terms.append(ExitTerms(layer, weights[layer], task, contrastive, rep, exit_parameters(model, layer)))
    return terms
