"""Step and validation statistics as small named structures that cross the ranks in ONE all-reduce.

Each is a dataclass of float64 tensors on the engine's device (one host sync per step; NCCL needs device tensors).
`all_reduce` packs the fields into one flat tensor, sums it over the ranks and unpacks it into the same fields, so
no code indexes a tensor by hand-computed offsets. A step's sums carry the preemption vote with them: every rank
learns in the same all-reduce that some rank was signalled, and all of them save the same step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

T = TypeVar("T", bound="_Reducible")


class Group:
    """The process group as the trainer's components use it: this rank, the world size, and the few collectives they
    agree through. With one process every call is local (no process group needed)."""

    def __init__(self, rank: int, world: int, dist: Any = None) -> None:
        self.rank, self.world, self.dist = rank, world, dist

    def all_gather(self, obj: Any) -> list[Any]:
        """`obj` of every rank (how the ranks agree on a failure only some of them saw)."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        self.dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if self.world == 1:
            return obj
        box = [obj]
        self.dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.world > 1:
            self.dist.barrier()

    def all_reduce(self, tensor: torch.Tensor) -> None:
        """Sum `tensor` over the ranks, in place."""
        if self.world > 1:
            self.dist.all_reduce(tensor)


PER_EXIT = ("mlm_loss", "sop_loss", "mlm_accuracy", "sop_accuracy")


class _Reducible:
    """Mixin of the dataclasses below: every field is a float64 tensor."""

    def pack(self) -> torch.Tensor:
        return torch.cat([getattr(self, f.name).reshape(-1) for f in dataclasses.fields(self)])

    def unpack(self: T, flat: torch.Tensor) -> T:
        """A new instance with the fields of `self`'s shapes read back from `flat` (e.g. after a reduction)."""
        shapes = [getattr(self, f.name).shape for f in dataclasses.fields(self)]
        parts = torch.split(flat, [s.numel() for s in shapes])
        return type(self)(**{f.name: p.reshape(s) for f, p, s in zip(dataclasses.fields(self), parts, shapes)})

    def all_reduce(self: T, dist: Any) -> T:
        """Sum over all ranks (one collective), returned on the CPU."""
        flat = self.pack()
        dist.all_reduce(flat)
        return self.unpack(flat.cpu())


def _zeros(shape: tuple[int, ...], device: torch.device | str) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.float64, device=device)


@dataclass
class StepStats(_Reducible):
    """Sums over the micro-batches of one optimizer step (this rank's, or every rank's after `all_reduce`)."""

    loss: torch.Tensor  # () micro-batch losses
    mlm_loss: torch.Tensor  # (k,) per active exit: micro-batch means
    sop_loss: torch.Tensor
    mlm_accuracy: torch.Tensor
    sop_accuracy: torch.Tensor
    tokens: torch.Tensor  # () real (non-padding) tokens
    masked: torch.Tensor  # () MLM targets
    padded: torch.Tensor  # () tokens including padding
    data_wait_s: torch.Tensor  # () seconds spent waiting for batches
    comm_s: torch.Tensor  # () seconds in DeepSpeed's collectives (logging.comm_timing; else 0)
    preempt_votes: torch.Tensor  # () ranks that were signalled to save and stop

    @classmethod
    def zeros(cls, num_exits: int, device: torch.device | str) -> StepStats:
        return cls(
            **{f.name: _zeros((num_exits,) if f.name in PER_EXIT else (), device) for f in dataclasses.fields(cls)}
        )

    def add_micro_batch(self, out: Any, batch: dict[str, torch.Tensor]) -> None:
        """Accumulate one micro-batch's model output (`ElasticBertForPreTraining`) and token counts."""
        self.loss += out.loss.detach().double()
        self.mlm_loss += out.mlm_loss.double()
        self.sop_loss += out.sop_loss.double()
        self.mlm_accuracy += out.mlm_accuracy.double()
        self.sop_accuracy += out.sop_accuracy.double()
        self.tokens += batch["attention_mask"].sum()
        self.masked += (batch["mlm_labels"] != -100).sum()
        self.padded += batch["input_ids"].numel()

    def vote_preemption(self, requested: bool) -> None:
        self.preempt_votes.fill_(1.0 if requested else 0.0)

    @property
    def preempted(self) -> bool:
        """After `all_reduce`: some rank was signalled."""
        return bool(self.preempt_votes > 0)

    def exit_means(self, micro_batches: int) -> dict[str, list[float]]:
        """Per active exit, the mean over `micro_batches` (accumulation × world size) of each per-exit figure."""
        return {name: (getattr(self, name) / micro_batches).tolist() for name in PER_EXIT}


@dataclass
class EvalSums(_Reducible):
    """Validation sums over this rank's (then every rank's) batches, for every exit of the model."""

    mlm_loss: torch.Tensor  # (L,) MLM loss × masked tokens
    mlm_correct: torch.Tensor  # (L,) MLM accuracy × masked tokens
    sop_loss: torch.Tensor  # (L,) SOP loss × samples
    sop_correct: torch.Tensor  # (L,) SOP accuracy × samples
    masked: torch.Tensor  # () masked tokens
    samples: torch.Tensor  # () samples

    @classmethod
    def zeros(cls, num_exits: int, device: torch.device | str) -> EvalSums:
        return cls(
            **{
                f.name: _zeros(() if f.name in ("masked", "samples") else (num_exits,), device)
                for f in dataclasses.fields(cls)
            }
        )

    def add_batch(self, out: Any, batch: dict[str, torch.Tensor]) -> None:
        """MLM figures weighted by masked tokens, SOP figures by samples (so the means are over tokens / samples)."""
        nm = (batch["mlm_labels"] != -100).sum().double()
        b = float(batch["input_ids"].shape[0])
        self.mlm_loss += out.mlm_loss.double() * nm
        self.mlm_correct += out.mlm_accuracy.double() * nm
        self.sop_loss += out.sop_loss.double() * b
        self.sop_correct += out.sop_accuracy.double() * b
        self.masked += nm
        self.samples += b

    def means(self) -> dict[str, Any]:
        """Per-exit means: MLM over masked tokens, SOP over samples (after `all_reduce`)."""
        nm, b = float(self.masked), float(self.samples)
        return {
            "samples": int(b),
            "mlm_loss": (self.mlm_loss / max(nm, 1)).tolist(),
            "mlm_accuracy": (self.mlm_correct / max(nm, 1)).tolist(),
            "sop_loss": (self.sop_loss / b).tolist(),
            "sop_accuracy": (self.sop_correct / b).tolist(),
        }
