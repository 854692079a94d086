"""Step and validation statistics as small named structures that cross the ranks in ONE all-reduce.

Each is a dataclass of float64 tensors on the engine's device (NCCL needs device tensors), summed there as the
micro-batches run: nothing is read on the host during a step. `all_reduce` packs the fields into one flat tensor,
sums it over the ranks and unpacks it into the same fields, so no code indexes a tensor by hand-computed offsets.
A step's sums are read once, at the step's end (`StepStats.reduce_and_read`: one collective, one device-to-host
read, the step's only host sync in the trainer's own code), and they carry with them everything the host must know
at that point: the preemption vote (every rank learns in the same all-reduce that some rank was signalled, and all
of them save the same step), and the loss and DeepSpeed's gradient norm, whose NaN/inf survives the sum, so a
non-finite step is seen by every rank at that very step (`guards.step_problem`). A new per-step figure is one more
field: summed on the device, read in the same transfer, `StepTotals.values[name]` on the host.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from .collation import sample_lengths

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

    def leave(self) -> None:
        """Leave the process group, joining gloo's threads while the interpreter lives: without it a rank can abort
        at exit ("terminate called without an active exception", pytorch#190489), failing a finished Slurm step (3 of
        20 2-rank runs; 0 of 30)."""
        if self.dist is not None and self.dist.is_initialized():
            self.dist.destroy_process_group()


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

    def reduce_to_host(self, dist: Any) -> dict[str, Any]:
        """Sum over all ranks (one collective) and read the result with ONE device-to-host transfer: each field as a
        Python float (shape ()) or list of floats."""
        flat = self.pack()
        dist.all_reduce(flat)
        values = flat.tolist()  # the one host sync
        out: dict[str, Any] = {}
        start = 0
        for f in dataclasses.fields(self):
            shape = getattr(self, f.name).shape
            size = shape.numel()
            out[f.name] = values[start] if shape == () else values[start : start + size]
            start += size
        return out


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
    samples: torch.Tensor  # () sequences (packed: several to a row)
    rows: torch.Tensor  # () rows the model ran (= samples unless packed)
    attended: torch.Tensor  # () Σ over samples of length²: the attention work on real tokens (MFU)
    data_wait_s: torch.Tensor  # () seconds spent waiting for batches
    comm_s: torch.Tensor  # () seconds in DeepSpeed's collectives (logging.comm_timing; else 0)
    preempt_votes: torch.Tensor  # () ranks that were signalled to save and stop
    grad_norm: torch.Tensor  # () DeepSpeed's global gradient norm (the same on every rank), left on the device
    grad_norm_ranks: torch.Tensor  # () ranks that had one (DeepSpeed gives none at ZeRO-0 fp32)

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
        lengths = sample_lengths(batch)  # packed: several samples to a row
        self.samples += lengths.numel()
        self.rows += batch["input_ids"].shape[0]
        self.attended += (lengths**2).sum()

    def vote_preemption(self, requested: bool) -> None:
        self.preempt_votes.fill_(1.0 if requested else 0.0)

    def set_grad_norm(self, norm: torch.Tensor | float | None) -> None:
        """DeepSpeed's global gradient norm after the step (`engine.get_global_grad_norm()`): a tensor (ZeRO 1-2)
        is copied on the device, never read here; a float (an fp16 overflow's inf) is filled in; None counts no
        rank."""
        if norm is None:
            return
        if isinstance(norm, torch.Tensor):
            self.grad_norm.copy_(norm.detach().reshape(()), non_blocking=True)
        else:
            self.grad_norm.fill_(float(norm))
        self.grad_norm_ranks.fill_(1.0)

    def reduce_and_read(self, dist: Any) -> StepTotals:
        """The step's end: every rank's sums, votes and norm, in one collective and one read (`reduce_to_host`)."""
        return StepTotals(self.reduce_to_host(dist))


@dataclass(frozen=True)
class StepTotals:
    """A step's sums over every rank, on the host: `values[field]` of `StepStats` as floats / lists of floats."""

    values: dict[str, Any]

    @property
    def preempted(self) -> bool:
        """Some rank was signalled."""
        return self.values["preempt_votes"] > 0

    @property
    def grad_norm(self) -> float | None:
        """DeepSpeed's global gradient norm (None when it gives none); NaN/inf stay as they are."""
        ranks = self.values["grad_norm_ranks"]
        return self.values["grad_norm"] / ranks if ranks else None

    def exit_means(self, micro_batches: int) -> dict[str, list[float]]:
        """Per active exit, the mean over `micro_batches` (accumulation × world size) of each per-exit figure."""
        return {name: [v / micro_batches for v in self.values[name]] for name in PER_EXIT}


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
