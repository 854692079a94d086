"""Checkpoint directory layout and the commit protocol around DeepSpeed's `save_checkpoint`.

RUN/checkpoints/
  global_step{N}/            DeepSpeed's files (every rank) + client_state.json + export/ (HF config, tokenizer)
  global_step{N}_universal/  made on demand when resuming at another world size
  latest                     the tag of the newest *complete* checkpoint

A checkpoint is committed in this order: DeepSpeed files (all ranks) -> client_state.json (rank 0, temp+rename
through `common.io`) -> barrier -> `latest` (temp+rename) -> prune old tags. A kill at any point leaves `latest` on
a complete checkpoint.
`client_state.json` is plain JSON so the launcher-side checks (config hash, world size) run before any process group.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import UserError
from common.io import atomic_path

CLIENT_STATE = "client_state.json"
LATEST = "latest"
TAG_RE = re.compile(r"^global_step(\d+)$")


class ResumeError(UserError):
    """A checkpoint that must not be resumed from (or exported) as is: different config, unreadable state."""


def tag_for(step: int) -> str:
    return f"global_step{step}"


def read_latest(ckpt_dir: Path) -> str | None:
    p = ckpt_dir / LATEST
    if not p.is_file():
        return None
    tag = p.read_text(encoding="utf-8").strip()
    return tag or None


def resolve_tag(ckpt_dir: Path, tag: str | None) -> str:
    """'latest' / None -> the tag named in the `latest` file; anything else must exist as a directory."""
    if tag in (None, LATEST):
        found = read_latest(ckpt_dir)
        if found is None:
            raise ResumeError(f"{ckpt_dir}: no 'latest' file; is this a checkpoints directory (RUN/checkpoints)?")
        tag = found
    if not (ckpt_dir / tag).is_dir():
        raise ResumeError(f"{ckpt_dir}: checkpoint tag {tag!r} does not exist")
    return tag


def read_client_state(ckpt_dir: Path, tag: str) -> dict[str, Any]:
    p = ckpt_dir / tag / CLIENT_STATE
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ResumeError(f"{p} is missing: checkpoint {tag} was not committed by this trainer") from None
    except json.JSONDecodeError as e:
        raise ResumeError(f"{p} is corrupt: {e}") from None


@dataclass
class ResumePoint:
    tag: str
    state: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.state["step"])

    @property
    def consumed_samples(self) -> int:
        return int(self.state["consumed_samples"])


def find_resume_point(ckpt_dir: Path) -> ResumePoint | None:
    tag = read_latest(ckpt_dir)
    if tag is None:
        return None
    return ResumePoint(tag, read_client_state(ckpt_dir, tag))


def config_differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested config dicts (for a readable refusal)."""
    diffs: list[str] = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(a, dict) and isinstance(b, dict):
            diffs.extend(config_differences(a, b, name))
        elif a != b:
            diffs.append(f"{name}: {a!r} -> {b!r}")
    return diffs


def check_compatible(point: ResumePoint, config_hash: str, config: dict[str, Any], force: bool) -> list[str]:
    """Refuse (ResumeError) a checkpoint written under a different semantic config unless forced.

    Returns the differences (empty when the hashes agree) so a forced resume can log them.
    """
    if point.state.get("config_hash") == config_hash:
        return []
    diffs = config_differences(point.state.get("config", {}), config)
    relevant = [d for d in diffs if not d.split(":")[0].startswith(("logging.", "checkpoint.", "eval."))]
    if not force:
        shown = "\n".join(f"    {d}" for d in (relevant or diffs)[:20])
        raise ResumeError(
            f"checkpoint {point.tag} was written under a different config (hash {point.state.get('config_hash')} "
            f"vs {config_hash}); differences:\n{shown}\n"
            "  Use a new --output, restore the old config, or pass --force-resume to continue anyway."
        )
    return relevant or diffs


def step_tags(ckpt_dir: Path) -> list[tuple[int, str]]:
    out = []
    for p in ckpt_dir.iterdir() if ckpt_dir.is_dir() else []:
        m = TAG_RE.match(p.name)
        if m and p.is_dir():
            out.append((int(m.group(1)), p.name))
    return sorted(out)


def prune(ckpt_dir: Path, keep_last: int) -> list[str]:
    """Delete all but the newest `keep_last` step checkpoints (never the one `latest` names)."""
    latest = read_latest(ckpt_dir)
    tags = step_tags(ckpt_dir)
    removed = []
    for _, tag in tags[: max(len(tags) - keep_last, 0)]:
        if tag == latest:
            continue
        shutil.rmtree(ckpt_dir / tag, ignore_errors=True)
        shutil.rmtree(ckpt_dir / f"{tag}_universal", ignore_errors=True)
        removed.append(tag)
    return removed


def needs_universal(state: dict[str, Any], world_size: int, zero_stage: int) -> bool:
    """ZeRO shards are laid out for one data-parallel size: a checkpoint written under another world size or ZeRO
    stage (with ZeRO on either side) must go through DeepSpeed's universal format."""
    old_world = int(state.get("world_size", world_size))
    old_stage = int(state.get("zero_stage", zero_stage))
    return (old_world != world_size or old_stage != zero_stage) and max(old_stage, zero_stage) > 0


def convert_to_universal(ckpt_dir: Path, tag: str) -> str:
    """DeepSpeed universal checkpoint of `tag` (for a resume at another data-parallel size); returns its tag.

    Built under a temporary name and renamed, so a crash mid-conversion leaves no half-made universal directory.
    """
    from deepspeed.checkpoint import ds_to_universal  # heavy: only when a conversion is needed

    out_tag = f"{tag}_universal"
    out = ckpt_dir / out_tag
    if (out / "zero").is_dir():
        return out_tag
    with atomic_path(out) as tmp:
        args = argparse.Namespace(
            input_folder=str(ckpt_dir / tag),
            output_folder=str(tmp),
            num_extract_workers=1,
            num_merge_workers=1,
            keep_temp_folder=False,
            strict=True,
            inject_missing_state=True,
        )
        ds_to_universal.main(args)
        for name in (CLIENT_STATE, "export"):
            src = ckpt_dir / tag / name
            if src.is_dir():
                shutil.copytree(src, tmp / name)
            elif src.is_file():
                shutil.copy2(src, tmp / name)
    return out_tag
