"""The resume checkpoint of `finetune train`: what a preempted run saves (`common.preemption`: SIGTERM / SIGUSR1 ->
a flag -> agreed by the ranks at the next step boundary -> save -> exit 75) and the same command reads back to
finish exactly as an uninterrupted run would have: the same final weights and dev scores, bit for bit.

    RUN/resume/latest                the committed tag, written last (atomically): a save cut short is never read
    RUN/resume/TAG/                  TAG = PHASE-stepNNNNNN (the phase's optimizer steps done)
        state.json                   where the run stands: phase, step, the config, the dev history, the best score
        model.safetensors            the weights at the step boundary
        best.safetensors             the phase's best weights so far (once it has evaluated)
        trainer.pt                   optimizer + schedule state (a run without DeepSpeed)
        ds/                          DeepSpeed's model, optimizer and schedule files (a run with --ds-config)
        rng_rank{R}.pt               each rank's random states (torch CPU and CUDA, Python, NumPy): dropout resumes
        checksums.json               sealed after every other file; verified before anything is loaded

The data order needs no file: it is a function of (seed, epoch), and the phase's step says where in it the run was.
Every file is written through `common.io` (temporary + rename) and read back with `safetensors` or
`torch.load(weights_only=True)` after its checksum matched (DeepSpeed reads its own `ds/` files, checked the same
way). `finish` removes RUN/resume once best/ and dev_scores.json are committed.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from common.config import stored_tree
from common.errors import UserError
from common.integrity import seal, verify_directory
from common.io import atomic_path, atomic_write_json, atomic_write_text, read_object
from common.resume import changed_keys
from common.run_dir import RunWriteError, describe_write_error

from ..config import FinetuneConfig

RESUME = "resume"
LATEST = "latest"
STATE = "state.json"
MODEL = "model.safetensors"
BEST = "best.safetensors"
TRAINER = "trainer.pt"
DEEPSPEED = "ds"
DS_TAG = "state"
FORMAT = 1
# Settings that do not change a number of the run: a resume may change them.
IGNORED_KEYS = ("train.progress",)
WRITE_ERRORS = (OSError, RuntimeError, SafetensorError)
# What state.json must hold (and of which type) before anything reads it.
STATE_KEYS = {"format": int, "config": dict, "phase": str, "phase_index": int, "step": int, "phase_steps": int}
STATE_KEYS |= {"world_size": int}


class ResumeError(UserError):
    """A resume checkpoint that cannot be used: written under another config or world size, damaged, or unreadable."""


def rng_file(rank: int) -> str:
    return f"rng_rank{rank}.pt"


def resume_dir(run_dir: Path) -> Path:
    return Path(run_dir) / RESUME


def tag_for(phase: str, step: int) -> str:
    return f"{phase}-step{step:06d}"


@dataclass(frozen=True)
class ResumePoint:
    """A committed resume checkpoint: its directory and its state.json."""

    dir: Path
    state: dict[str, Any]

    @property
    def tag(self) -> str:
        return self.dir.name

    @property
    def where(self) -> str:
        """Where the run stands, for the messages: `phase stage2, step 12 of 40`."""
        s = self.state
        return f"phase {s['phase']}, step {s['step']} of {s['phase_steps']}"


# ------------------------------------------------------------------------------------------------ finding, checking
def find_resume_point(run_dir: Path) -> ResumePoint | None:
    """The checkpoint RUN/resume/latest names, or None when there is none (a run never preempted, or one whose save
    was cut short before it committed). Reads two small files: cheap enough before anything is loaded."""
    root = resume_dir(run_dir)
    latest = root / LATEST
    if not latest.is_file():
        return None
    hint = "the resume checkpoint is damaged; pass --overwrite to discard it and start the run over"
    try:
        tag = latest.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as err:
        raise ResumeError(f"{latest}: cannot read it ({err}); {hint}") from None
    if not tag or "/" in tag or tag.startswith(".") or not (root / tag).is_dir():
        raise ResumeError(f"{latest} names {tag!r}, which is not a checkpoint in {root}; {hint}")
    state = read_object(root / tag / STATE, ResumeError, "a resume state object", hint=hint)
    wrong = [k for k, kind in STATE_KEYS.items() if not isinstance(state.get(k), kind) or isinstance(state[k], bool)]
    if wrong or state["format"] != FORMAT:
        raise ResumeError(
            f"{root / tag / STATE}: not a resume state of format {FORMAT} (missing or wrong: {', '.join(wrong)}); "
            f"{hint}"
        )
    return ResumePoint(root / tag, state)


def check_resume_point(point: ResumePoint, config: dict[str, Any], world_size: int) -> None:
    """Refuse (ResumeError, one message naming the keys or the file) a checkpoint written under another config or
    world size, or one whose files do not match their checksums: resuming it would not give the run it claims to."""
    stored = stored_tree(point.state["config"], FinetuneConfig)  # a run preempted under keys renamed since
    diffs = changed_keys(stored, config, IGNORED_KEYS)
    fix = "rerun with the settings it was started with, pass --overwrite to discard it and start over, or use another "
    fix += "--output"
    if diffs:
        shown = "; ".join(diffs[:12]) + (f"; ... {len(diffs) - 12} more" if len(diffs) > 12 else "")
        raise ResumeError(
            f"{point.dir.parent.parent}: holds a preempted run ({point.where}) started with other settings: {shown}. "
            f"A resume must use the same ones: {fix}"
        )
    if point.state["world_size"] != world_size:
        raise ResumeError(
            f"{point.dir.parent.parent}: holds a preempted run ({point.where}) of {point.state['world_size']} "
            f"process(es); this one has {world_size} (the data order depends on it): {fix}"
        )
    problems = (
        verify_directory(point.dir)
        if (point.dir / "checksums.json").is_file()
        else [f"{point.dir / 'checksums.json'} is missing"]
    )
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ResumeError(
            f"resume checkpoint {point.dir} is damaged: {problems[0]}{more}. Nothing was loaded; pass --overwrite to "
            "discard it and start the run over"
        )


# ---------------------------------------------------------------------------------------------------------- ranks
class Ranks:
    """The collectives the checkpoint needs, over the ranks of a DeepSpeed run (a no-op for one process)."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world

    @property
    def dist(self) -> Any:
        if self.world == 1:
            return None
        import torch.distributed as dist

        return dist if dist.is_available() and dist.is_initialized() else None

    def any(self, flag: bool, device: torch.device) -> bool:
        """True on every rank when `flag` is True on any: the preemption vote."""
        dist = self.dist
        if dist is None:
            return flag
        vote = torch.tensor([1.0 if flag else 0.0], device=device)
        dist.all_reduce(vote, op=dist.ReduceOp.MAX)
        return bool(vote.item() > 0)

    def gather(self, obj: Any) -> list[Any]:
        dist = self.dist
        if dist is None:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.dist is not None:
            self.dist.barrier()


# ---------------------------------------------------------------------------------------------------------- saving
def rng_states() -> dict[str, Any]:
    """This process's random states, as tensors and plain values (`torch.load(weights_only=True)` reads them)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": random.getstate(),
        "numpy": (name, torch.from_numpy(np.asarray(keys, dtype=np.int64)), pos, has_gauss, cached),
    }


def set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))


def save_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """A state dict as safetensors (own contiguous copies: shared storage is refused by the format)."""
    copies = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in tensors.items()}
    with atomic_path(path) as tmp:
        save_file(copies, str(tmp))


def save_torch(path: Path, obj: Any) -> None:
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


@dataclass
class Snapshot:
    """What one save writes; `state` (JSON), `model`, `best` and `trainer` are rank 0's, `engine` saves on all."""

    tag: str
    state: dict[str, Any]
    model: dict[str, torch.Tensor]
    best: dict[str, torch.Tensor] | None
    trainer: dict[str, Any] | None  # optimizer + scheduler state dicts (no DeepSpeed)
    engine: Any = None


def save_resume_point(run_dir: Path, snap: Snapshot, ranks: Ranks) -> Path:
    """Write checkpoint `snap.tag` on every rank, seal it and move RUN/resume/latest to it; the older ones go.
    A failed write on any rank raises RunWriteError on all (exit 4), `latest` unchanged and the new tag removed."""
    root = resume_dir(run_dir)
    tag_dir = root / snap.tag
    if ranks.rank == 0:
        discard_uncommitted(root)
        tag_dir.mkdir(parents=True)
    ranks.barrier()
    error = _write_files(tag_dir, snap, ranks.rank)
    errors = [e for e in ranks.gather(error) if e]
    if not errors and ranks.rank == 0:
        try:
            seal(tag_dir)
            atomic_write_text(root / LATEST, snap.tag + "\n")
        except OSError as err:
            errors = [f"rank 0: {describe_write_error(err)}"]
    errors = [e for part in ranks.gather(errors) for e in part]
    if errors:
        if ranks.rank == 0:
            shutil.rmtree(tag_dir, ignore_errors=True)
        stays = read_latest(root)
        raise RunWriteError(
            f"the resume checkpoint {tag_dir} could not be written: {'; '.join(errors[:4])}. {root / LATEST} stays on "
            f"{stays or '(none: a rerun starts over)'}; free space or fix the filesystem"
        )
    if ranks.rank == 0:
        discard_uncommitted(root)
    ranks.barrier()
    return tag_dir


def _write_files(tag_dir: Path, snap: Snapshot, rank: int) -> str | None:
    """This rank's files of the checkpoint; the error as one line, or None."""
    try:
        save_torch(tag_dir / rng_file(rank), rng_states())
        if snap.engine is not None:
            snap.engine.save_checkpoint(str(tag_dir / DEEPSPEED), tag=DS_TAG, client_state={}, save_latest=False)
        if rank == 0:
            save_tensors(tag_dir / MODEL, snap.model)
            if snap.best is not None:
                save_tensors(tag_dir / BEST, snap.best)
            if snap.trainer is not None:
                save_torch(tag_dir / TRAINER, snap.trainer)
            atomic_write_json(tag_dir / STATE, snap.state)  # last: a tag without it is an unfinished save
    except WRITE_ERRORS as err:
        return f"rank {rank}: {describe_write_error(err)}"
    return None


def read_latest(root: Path) -> str | None:
    try:
        return (root / LATEST).read_text(encoding="utf-8").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def discard_uncommitted(root: Path) -> list[Path]:
    """Remove every entry of RUN/resume but `latest` and the tag it names: older checkpoints, a save cut short."""
    keep = {LATEST, read_latest(root)}
    removed = []
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        if path.name not in keep:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def finish(run_dir: Path) -> None:
    """The run's results are committed: its resume checkpoint has nothing left to give."""
    shutil.rmtree(resume_dir(run_dir), ignore_errors=True)


# --------------------------------------------------------------------------------------------------------- loading
def _load_error(point: ResumePoint, name: str, err: BaseException) -> ResumeError:
    return ResumeError(
        f"resume checkpoint {point.dir}: cannot read {name} ({type(err).__name__}: {str(err)[:300]}); pass "
        "--overwrite to discard it and start the run over"
    )


def load_tensors(point: ResumePoint, name: str) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(point.dir / name))
    except (OSError, SafetensorError) as err:
        raise _load_error(point, name, err) from None


def load_torch(point: ResumePoint, name: str) -> Any:
    try:
        return torch.load(point.dir / name, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError) as err:  # the unpickler's refusals are RuntimeErrors
        raise _load_error(point, name, err) from None


def load_weights(point: ResumePoint, model: torch.nn.Module) -> None:
    """The weights at the step boundary, into `model` (every key: the same model is built from the same config)."""
    model.load_state_dict(load_tensors(point, MODEL))


def load_training_state(point: ResumePoint, optimizer: Any, scheduler: Any, engine: Any, rank: int) -> None:
    """Optimizer and schedule (DeepSpeed's files under an engine), then this rank's random states: last, so that
    nothing after them draws a number the uninterrupted run did not."""
    if engine is not None:
        try:
            path, _ = engine.load_checkpoint(str(point.dir / DEEPSPEED), tag=DS_TAG)
        except (OSError, RuntimeError, KeyError, ValueError) as err:
            raise _load_error(point, DEEPSPEED, err) from None
        if path is None:
            raise _load_error(point, DEEPSPEED, FileNotFoundError("no DeepSpeed model states"))
    else:
        saved = load_torch(point, TRAINER)
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
    set_rng_states(load_torch(point, rng_file(rank)))


def load_best(point: ResumePoint) -> dict[str, torch.Tensor] | None:
    return load_tensors(point, BEST) if (point.dir / BEST).is_file() else None


def state_json(**fields: Any) -> dict[str, Any]:
    """state.json's content: `fields` checked to survive JSON as they are (a float round-trips exactly)."""
    state = {"format": FORMAT, **fields}
    json.dumps(state)
    return state
