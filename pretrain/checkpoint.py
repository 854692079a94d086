"""Checkpoint directory layout and the commit protocol around DeepSpeed's `save_checkpoint`.

RUN/checkpoints/
  global_step{N}/            DeepSpeed's files (every rank) + client_state.json + export/ (HF config, tokenizer)
                             + checksums.json (common.integrity: size and sha256 of every other file)
  global_step{N}_universal/  made on demand when resuming at another world size (with its own checksums.json)
  latest                     the tag of the newest *committed* checkpoint

A checkpoint is committed in this order: a leftover directory of the same tag that `latest` does not name is
removed -> DeepSpeed files (all ranks) -> client_state.json and export/ (rank 0, temp+rename through `common.io`) ->
checksums.json (every rank hashes its share, rank 0 writes) -> `latest` (temp+rename) -> prune old tags. A kill at
any point leaves `latest` on a committed checkpoint; a write error (a full disk) on any rank stops every rank before
`latest` moves. Resume, export and universal conversion verify the checksums first (`verify_checksums`).
`client_state.json` is plain JSON so the launcher-side checks (config hash, world size) run before any process group.
"""

from __future__ import annotations

import argparse
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.config import stored_tree
from common.errors import UserError
from common.integrity import CHECKSUMS, hash_files, list_files, verify_share, write_checksums
from common.io import atomic_path, atomic_write_text, read_object
from common.resume import config_differences
from common.vocab import TokenizerIdentity, TokenizerIdentityError, check_same_tokenizer, identity_of, model_identity

from .config import RunConfig

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
    try:
        tag = p.read_text(encoding="utf-8").strip()
    except (UnicodeDecodeError, OSError) as e:
        raise ResumeError(f"{p} is unreadable ({e}); it should hold one tag such as global_step1000") from None
    if tag and ("/" in tag or "\n" in tag or tag in (".", "..")):
        raise ResumeError(f"{p} holds {tag[:80]!r}, not a checkpoint tag such as global_step1000")
    return tag or None


def commit_latest(ckpt_dir: Path, tag: str) -> None:
    """Point `latest` at a checkpoint whose checksums.json is written (temp + rename: never half a name)."""
    atomic_write_text(ckpt_dir / LATEST, tag)


def is_complete(ckpt_dir: Path, tag: str) -> bool:
    """The save of `tag` finished: checksums.json written (this trainer's last file before `latest`), or, for a
    checkpoint of a trainer before checksums, client_state.json (its last file then). A directory with neither is
    what a killed save left."""
    return (ckpt_dir / tag / CHECKSUMS).is_file() or (ckpt_dir / tag / CLIENT_STATE).is_file()


def discard_uncommitted(ckpt_dir: Path, tag: str) -> bool:
    """Remove a directory `tag` left by an interrupted save (not the one `latest` names), so the new save of the
    same step starts from nothing; returns whether one was removed."""
    if (ckpt_dir / tag).is_dir() and read_latest(ckpt_dir) != tag:
        shutil.rmtree(ckpt_dir / tag, ignore_errors=True)
        return True
    return False


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
    if not p.is_file():
        raise ResumeError(
            f"{p} is missing: checkpoint {tag} was not committed by this trainer{older_hint(ckpt_dir, tag)}"
        )
    state = read_object(
        p, ResumeError, "a client state object", hint=f"the checkpoint is corrupt{older_hint(ckpt_dir, tag)}"
    )
    bad = [k for k in ("step", "consumed_samples") if type(state.get(k)) is not int]
    if bad:
        raise ResumeError(
            f"{p} lacks an integer {' and '.join(bad)}: not written by this trainer{older_hint(ckpt_dir, tag)}"
        )
    return state


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


# Model keys that set the shape of a weight: no --force-resume can load a checkpoint across them.
SHAPE_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "vocab_size",
    "type_vocab_size",
)


def check_compatible(point: ResumePoint, config_hash: str, config: dict[str, Any], force: bool) -> list[str]:
    """Refuse (ResumeError) a checkpoint written under a different semantic config unless forced; a change of a
    weight's shape (`SHAPE_KEYS`, models built from the config on both sides) is refused even when forced.

    Returns the differences (empty when the hashes agree) so a forced resume can log them.
    """
    if point.state.get("config_hash") == config_hash:
        return []
    old = stored_tree(point.state.get("config", {}), RunConfig)  # an earlier release's keys under today's names
    diffs = config_differences(old, config)
    relevant = [d for d in diffs if not d.split(":")[0].startswith(("logging.", "checkpoint.", "eval."))]
    if not force:
        shown = "\n".join(f"    {d}" for d in (relevant or diffs)[:20])
        raise ResumeError(
            f"checkpoint {point.tag} was written under a different config (hash {point.state.get('config_hash')} "
            f"vs {config_hash}); differences:\n{shown}\n"
            "  Use a new --output, restore the old config, or pass --force-resume to continue anyway."
        )
    from_config = old.get("model", {}).get("init_from") is None and config.get("model", {}).get("init_from") is None
    shapes = [d for d in diffs if d.split(":")[0] in {f"model.{k}" for k in SHAPE_KEYS}] if from_config else []
    if shapes:
        raise ResumeError(
            f"checkpoint {point.tag} has weights of another shape: {'; '.join(shapes)}. --force-resume cannot load "
            f"them; restore {shapes[0].split(':')[0]} or use a new --output"
        )
    return relevant or diffs


def check_architecture(ckpt_dir: Path, tag: str, model_config: Any) -> None:
    """The model built for this run must have the checkpoint's weight shapes (export/config.json records them);
    catches what the config comparison cannot see (a changed model.init_from, another vocabulary)."""
    path = ckpt_dir / tag / "export" / "config.json"
    if not path.is_file():
        raise ResumeError(f"{path} is missing: checkpoint {tag} was not committed by this trainer")
    saved = read_object(path, ResumeError, "a model config object", hint="the checkpoint is corrupt")
    differ = [
        f"{k}={saved.get(k)} in the checkpoint but {getattr(model_config, k, None)} in this run (model.{k})"
        for k in SHAPE_KEYS
        if k in saved and saved.get(k) != getattr(model_config, k, None)
    ]
    if differ:
        raise ResumeError(
            f"checkpoint {ckpt_dir / tag} cannot be loaded into this model: {'; '.join(differ)}. Even "
            "--force-resume cannot change a weight's shape; restore the config or use a new --output"
        )


def checkpoint_tokenizer(ckpt_dir: Path, tag: str) -> TokenizerIdentity | None:
    """The tokenizer a checkpoint's weights were trained with: recorded in export/config.json (`tokenizer_identity`,
    written by every save), else computed from export/tokenizer (a checkpoint of a trainer before identities)."""
    export = ckpt_dir / tag / "export"
    try:
        recorded = model_identity(export)[0] if (export / "config.json").is_file() else None
        return recorded or (identity_of(export / "tokenizer") if (export / "tokenizer").is_dir() else None)
    except TokenizerIdentityError:
        return None  # a damaged export: its checksums (and `check_architecture`) name it


def check_resume_tokenizer(ckpt_dir: Path, identity: TokenizerIdentity | None, data_where: str) -> None:
    """Refuse to resume a run whose checkpoint was trained on the ids of another tokenizer than the data's now (a
    corpus re-tokenized at the same path): the same ids would mean other words. No override: such a run is a new
    one. A missing or unreadable `latest` is left to the checkpointer, which names it."""
    try:
        tag = read_latest(ckpt_dir)
    except ResumeError:
        return
    if tag is None or identity is None or not (ckpt_dir / tag).is_dir():
        return
    check_same_tokenizer(
        identity,
        data_where,
        checkpoint_tokenizer(ckpt_dir, tag),
        f"checkpoint {ckpt_dir / tag} was trained with",
        f"Resume with the corpus prepared with the checkpoint's tokenizer ({ckpt_dir / tag / 'export' / 'tokenizer'}), "
        "or pre-train on this corpus in a new --output",
        error=ResumeError,
    )


NEW_DATA_FLAG = "--resume-on-new-data"


def _described(fp: dict[str, Any]) -> str:
    return (
        f"fingerprint {fp.get('fingerprint')} (manifest sha256 {str(fp.get('manifest_sha256'))[:16]}, "
        f"{fp.get('shard_files')} shard files, {fp.get('bytes'):,} bytes)"
    )


def data_changes(point: ResumePoint, fingerprints: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The corpora whose fingerprint (`pretrain.corpora.corpus_fingerprint`) differs from the one the checkpoint
    recorded, each as {corpus, path, before, now}; None when the checkpoint records none (written before they were)."""
    recorded = point.state.get("corpora")
    if not isinstance(recorded, list):
        return None
    before = {r.get("corpus"): r for r in recorded if isinstance(r, dict)}
    changed = []
    for now in fingerprints:
        old = before.get(now["corpus"])
        if old is None or old.get("fingerprint") != now["fingerprint"]:
            changed.append({"corpus": now["corpus"], "path": now["path"], "before": old, "now": now})
    return changed


def check_resume_data(point: ResumePoint, fingerprints: list[dict[str, Any]], accept_new: bool) -> list[dict]:
    """Refuse (ResumeError, one line) to resume on other data than the checkpoint was trained on: a corpus folder
    rebuilt or replaced in place (same path, same vocabulary, other text) would otherwise be read from the middle of a
    sample order made for another corpus. With `accept_new` (`--resume-on-new-data`) the changes are returned (the
    trainer restarts the sample order on the new data and records it); [] when nothing changed or the checkpoint
    records no fingerprints."""
    changed = data_changes(point, fingerprints) or []
    if changed and not accept_new:
        said = "; ".join(
            f"data.corpora[{c['corpus']}] ({c['path']}) was "
            + (f"{_described(c['before'])} then, and is {_described(c['now'])} now" if c["before"] else "not in it")
            for c in changed
        )
        raise ResumeError(
            f"checkpoint {point.tag} was trained on other data: {said}. The corpus was rebuilt or replaced since; "
            f"resume on the data the checkpoint was trained on, or pass {NEW_DATA_FLAG} to continue on this data "
            "(its sample order starts over)"
        )
    return changed


def committed_before(ckpt_dir: Path, tag: str) -> list[str]:
    """Complete step checkpoints older than `tag`, newest first (what an operator could fall back to)."""
    m = TAG_RE.match(tag)
    limit = int(m.group(1)) if m else None
    return [t for s, t in reversed(step_tags(ckpt_dir)) if (limit is None or s < limit) and is_complete(ckpt_dir, t)]


def older_hint(ckpt_dir: Path, tag: str) -> str:
    older = committed_before(ckpt_dir, tag)
    if not older:
        return ""
    return (
        f". Older committed checkpoints: {', '.join(older[:3])}; to resume from one, write its tag into "
        f"{ckpt_dir / LATEST} (e.g. `echo {older[0]} > {ckpt_dir / LATEST}`)"
    )


def integrity_refusal(ckpt_dir: Path, tag: str, problems: list[str], what: str = "resume from") -> ResumeError:
    """The error for a checkpoint that failed verification: every problem, the way out, the older checkpoints."""
    shown = "\n".join(f"  - {p}" for p in problems[:20])
    more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
    return ResumeError(
        f"refusing to {what} checkpoint {ckpt_dir / tag}: it failed verification:\n{shown}{more}\n"
        f"  Pass --no-verify-checksums to use it anyway (truncated files are still refused){older_hint(ckpt_dir, tag)}"
    )


def verify_checkpoint(ckpt_dir: Path, tag: str, use_checksums: bool, what: str = "resume from") -> None:
    """Verify every file of a checkpoint in this process (export, conversion, a single-process resume)."""
    problems = verify_share(ckpt_dir / tag, 0, 1, use_checksums)
    if problems:
        raise integrity_refusal(ckpt_dir, tag, problems, what)


def step_tags(ckpt_dir: Path) -> list[tuple[int, str]]:
    out = []
    for p in ckpt_dir.iterdir() if ckpt_dir.is_dir() else []:
        m = TAG_RE.match(p.name)
        if m and p.is_dir():
            out.append((int(m.group(1)), p.name))
    return sorted(out)


def prune(ckpt_dir: Path, keep_last: int) -> list[str]:
    """Keep the `keep_last` newest *complete* checkpoints up to `latest` (`is_complete`) and `latest` itself; delete
    older complete ones and the leftovers of killed saves older than `latest`. Directories newer than `latest` are
    left alone. A leftover never counts towards `keep_last`, so a run of failed saves cannot push the last good
    checkpoint out, and `latest` (the newest verified one) is never deleted."""
    latest = read_latest(ckpt_dir)
    m = TAG_RE.match(latest or "")
    if m is None:
        return []
    latest_step = int(m.group(1))
    tags = [(s, t) for s, t in step_tags(ckpt_dir) if s <= latest_step]
    complete = [t for _, t in tags if is_complete(ckpt_dir, t)]
    keep = set(complete[-keep_last:]) | {latest}
    removed = []
    for _, tag in tags:
        if tag in keep:
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
    if (out / "zero").is_dir() and not verify_share(out, 0, 1, use_checksums=True):
        return out_tag  # made before, and intact
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
        try:
            ds_to_universal.main(args)
        except (RuntimeError, OSError, EOFError, KeyError, ValueError, AssertionError) as e:
            raise ResumeError(
                f"DeepSpeed could not convert {ckpt_dir / tag} to a universal checkpoint ({type(e).__name__}: {e})"
            ) from None
        for name in (CLIENT_STATE, "export"):
            src = ckpt_dir / tag / name
            if src.is_dir():
                shutil.copytree(src, tmp / name)
            elif src.is_file():
                shutil.copy2(src, tmp / name)
        write_checksums(tmp, hash_files(tmp, list_files(tmp)))
    return out_tag
