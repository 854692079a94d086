"""The trainer's checkpoint component: what to resume from, checked before the process group exists; the ranks'
agreement on its integrity; the universal conversion when the world size changed; loading it into the engine; and
the commit protocol of a save (the layout and the protocol's steps are `pretrain.checkpoint`'s).

A save, on every rank: a leftover of the same tag removed (rank 0) -> DeepSpeed's files -> export files and
client_state.json (rank 0) -> every rank hashes its share of the files -> checksums.json, `latest`, pruning (rank
0). A failed write on any rank is agreed by all before `latest` moves (`RunWriteError`, exit 4); weights that hold
NaN/inf are never saved (`TrainingDiverged`, exit 3).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from common.errors import describe_os_error, os_error_of
from common.integrity import hash_files, list_files, share_of, verify_share, write_checksums
from common.io import atomic_path, atomic_write_text
from common.run_dir import RunDirError, RunWriteError

from .checkpoint import (
    CLIENT_STATE,
    LATEST,
    ResumeError,
    ResumePoint,
    check_architecture,
    check_compatible,
    commit_latest,
    convert_to_universal,
    discard_uncommitted,
    find_resume_point,
    integrity_refusal,
    needs_universal,
    older_hint,
    prune,
    read_latest,
    tag_for,
)
from .integrity import LOAD_ERRORS
from .stats import Group


class Checkpointer:
    """RUN/checkpoints of one trainer: `find` (before the process group), then `agree`, `load`, `save`."""

    def __init__(self, run_dir: Path, rank: int, world: int, keep_last: int, verify_checksums: bool) -> None:
        self.dir = Path(run_dir) / "checkpoints"
        # Rank 0 only: before the process group no other rank writes in the run directory. Rank 0 lists the run's
        # files there first (`common.run_dir.prepare_run_dir`), and every rank checks the directory as it starts
        # (`common.outputs`): a `checkpoints` made by a rank ahead of rank 0 is, to a rank checking at that moment,
        # a folder of the run's names that no list names, and the job refused itself (seen with 16 ranks). The
        # others write only after the process group forms, which rank 0 joins after its list.
        if rank == 0:
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise RunDirError(f"cannot create {self.dir}: {e.strerror or e}") from None
        self.rank, self.world = rank, world
        self.keep_last = keep_last
        self.verify_checksums = verify_checksums
        self.point: ResumePoint | None = None
        self.config_diffs: list[str] = []
        self.load_tag: str | None = None
        self._problems: list[str] = []

    # ------------------------------------------------------------------------------------ before the process group
    def find(self, config_hash: str, config: dict[str, Any], force_resume: bool) -> ResumePoint | None:
        """The checkpoint `latest` names, if any: compatible with this config (or forced), and this rank's share of
        its files verified (a single process refuses here; several agree in `agree`)."""
        self.point = find_resume_point(self.dir)
        if self.point is not None:
            self.config_diffs = check_compatible(self.point, config_hash, config, force_resume)
            self._problems = verify_share(self.dir / self.point.tag, self.rank, self.world, self.verify_checksums)
            if self.world == 1 and self._problems:
                raise integrity_refusal(self.dir, self.point.tag, self._problems)
        return self.point

    # --------------------------------------------------------------------------------------- with the process group
    def agree(self, group: Group) -> None:
        """Refuse, on every rank, a checkpoint some rank found damaged."""
        problems = [p for rank_problems in group.all_gather(self._problems) for p in rank_problems]
        if problems:
            raise integrity_refusal(self.dir, self.point.tag, problems)

    def prepare_load(self, group: Group, model_config: Any, zero_stage: int, ds_cfg: dict[str, Any]) -> str | None:
        """The tag DeepSpeed will load, once the checkpoint's weight shapes are known to fit `model_config`:
        `latest`'s, or its universal conversion when the world size or ZeRO stage changed (rank 0 converts, the
        others wait; `ds_cfg` is told to load it as universal)."""
        if self.point is None:
            return None
        check_architecture(self.dir, self.point.tag, model_config)
        self.load_tag = self.point.tag
        if needs_universal(self.point.state, self.world, zero_stage):
            universal = f"{self.point.tag}_universal"
            self.load_tag = convert_to_universal(self.dir, self.point.tag) if self.rank == 0 else universal
            group.barrier()
            ds_cfg.setdefault("checkpoint", {})["load_universal"] = True
        return self.load_tag

    def load(self, engine: Any, group: Group) -> tuple[int, int]:
        """DeepSpeed's model/optimizer state into the engine; returns (step, consumed_samples), (0, 0) when new."""
        if self.point is None:
            return 0, 0
        path, client, error = None, None, None
        try:
            path, client = engine.load_checkpoint(str(self.dir), tag=self.load_tag, load_lr_scheduler_states=False)
        except LOAD_ERRORS as e:
            error = f"rank {self.rank}: {type(e).__name__}: {str(e)[:500]}"
        errors = [e for e in group.all_gather(error) if e]
        if errors or path is None:
            raise ResumeError(
                f"DeepSpeed could not load checkpoint {self.dir / self.load_tag}: "
                f"{errors[0] if errors else 'no model states found'}{older_hint(self.dir, self.point.tag)}"
            )
        step = self.point.step
        if client and int(client.get("step", step)) != step:
            raise ResumeError(f"{self.load_tag}: client state step {client.get('step')} != {step}")
        if self.load_tag != self.point.tag:
            engine._config.load_universal_checkpoint = False  # later saves are ordinary, for the new world
        return step, self.point.consumed_samples

    # ---------------------------------------------------------------------------------------------------- saving
    def committed(self, step: int) -> bool:
        """`latest` names this step's checkpoint already (its files are never rewritten)."""
        return read_latest(self.dir) == tag_for(step)

    def save(
        self,
        engine: Any,
        group: Group,
        state: dict[str, Any],
        config: dict[str, Any],
        write_export: Callable[[Path], None],
    ) -> dict[str, Any]:
        """Checkpoint step `state["step"]` (not `committed` yet) by the commit protocol; returns the event fields
        (tag, seconds, files, removed)."""
        tag = tag_for(state["step"])
        t0 = time.perf_counter()
        if self.rank == 0:
            discard_uncommitted(self.dir, tag)
        group.barrier()
        problems, checksums = self._write(engine, group, tag, state, config, write_export)
        removed: list[str] = []
        if not problems and self.rank == 0:
            try:
                write_checksums(self.dir / tag, checksums)
                commit_latest(self.dir, tag)
            except OSError as e:
                problems = [self.write_problem(e, self.dir / tag)]
            else:
                removed = prune(self.dir, self.keep_last)
        problems = group.broadcast(problems)
        if problems:
            if self.rank == 0:
                discard_uncommitted(self.dir, tag)  # free the space; never the tag `latest` names
            latest = read_latest(self.dir)
            raise RunWriteError(
                f"checkpoint {self.dir / tag} could not be written: {'; '.join(problems[:4])}. "
                f"{self.dir / LATEST} stays on {latest or '(none)'}; free space or fix the filesystem, then "
                "rerun the same command to resume from it"
            )
        return {"tag": tag, "seconds": time.perf_counter() - t0, "files": len(checksums), "removed": removed}

    def write_problem(self, err: BaseException, where: Path, doing: str = "") -> str:
        """One line for a failed write of a checkpoint: the path, the errno and what it means. torch's zip writer
        (DeepSpeed's files) says a full disk as "unexpected pos N vs M", without an errno or a path:
        `common.errors.os_error_of` reads it as the full disk it is when the filesystem of `where` has no room left."""
        os_err = os_error_of(err, where)
        text = describe_os_error(os_err) if os_err is not None else f"{type(err).__name__}: {err}"
        return f"rank {self.rank}: {doing}" + " ".join(text.split())

    def _write(
        self,
        engine: Any,
        group: Group,
        tag: str,
        state: dict[str, Any],
        config: dict[str, Any],
        write_export: Callable[[Path], None],
    ) -> tuple[list[str], dict[str, Any]]:
        """Every file of the checkpoint but checksums.json and `latest`: (the write problems of all ranks, agreed;
        the checksums of every file)."""
        tag_dir = self.dir / tag
        error = None
        try:
            engine.save_checkpoint(str(self.dir), tag=tag, client_state=dict(state), save_latest=False)
        except (OSError, RuntimeError) as e:
            group.barrier()  # the barrier DeepSpeed's save ends with, which this rank skipped
            error = self.write_problem(e, tag_dir)
        if error is None and self.rank == 0:
            try:
                write_export(tag_dir / "export")
                full = {**state, "config": config, "time": time.time()}
                atomic_write_text(tag_dir / CLIENT_STATE, json.dumps(full, indent=2))
            except OSError as e:
                error = self.write_problem(e, tag_dir)
        group.barrier()
        names = group.broadcast(list_files(tag_dir) if self.rank == 0 else None)
        entries: dict[str, Any] = {}
        if error is None:
            try:
                entries = hash_files(tag_dir, share_of(names, self.rank, self.world))
            except OSError as e:
                error = self.write_problem(e, tag_dir, "hashing: ")
        gathered = group.all_gather((error, entries))
        return [e for e, _ in gathered if e], {k: v for _, part in gathered for k, v in part.items()}


def export_files_writer(model_config: Any, tokenizer_dir: Path | None) -> Callable[[Path], None]:
    """What `export` needs besides the weights, written into a checkpoint: the HF config and the tokenizer files."""

    def write(out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        model_config.to_json_file(str(out / "config.json"))
        if tokenizer_dir is not None and tokenizer_dir.is_dir():
            tok = out / "tokenizer"
            tok.mkdir(exist_ok=True)
            for f in tokenizer_dir.iterdir():
                if f.is_file():
                    shutil.copy2(f, tok / f.name)

    return write


def nonfinite_weight_tensors(engine: Any, group: Group, zero_stage: int) -> int:
    """How many weight tensors hold NaN/inf over all ranks (each counts its own; ZeRO-3: its partitions). A corrupt
    optimizer state turns the weights non-finite one step before the loss shows it: checked before every save."""
    params = [getattr(p, "ds_tensor", p) if zero_stage == 3 else p for p in engine.module.parameters()]
    bad = torch.tensor(
        [sum(1 for t in params if t.numel() and not bool(torch.isfinite(t).all()))],
        dtype=torch.float64,
        device=engine.device,
    )
    group.all_reduce(bad)
    return int(bad.item())


def dump_weights(engine: Any, group: Group, zero_stage: int, path: Path) -> None:
    """The in-memory weights, gathered from all ranks under ZeRO-3, as fp32 safetensors (rank 0 writes)."""
    from safetensors.torch import save_file

    params = list(engine.module.parameters())
    if zero_stage == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            sd = {k: v.detach().float().clone() for k, v in engine.module.state_dict().items()}
    else:
        sd = {k: v.detach().float().clone() for k, v in engine.module.state_dict().items()}
    if group.rank == 0:
        with atomic_path(path) as tmp:
            save_file(sd, str(tmp))
    group.barrier()
