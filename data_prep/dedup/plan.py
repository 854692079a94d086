"""The settings (`DedupConfig`: hashed; `DedupRun`: how a run goes, not hashed), the corpora of a run and its plan
(`data_prep.plan`'s sources and work units with the corpus of each source), the unit keys, and the records that make
a dedup output directory resumable and refuse a mixed one. The stages are described in `data_prep.dedup`.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal

from common.config import literal_problems
from common.integrity import read_checksums, sha256_bytes
from common.io import atomic_write_json, read_object

from .. import sources as S
from .. import text_faults as TF
from ..errors import DataPrepError
from ..plan import build_plan, make_config, plan_difference, plan_hash
from ..util import CANONICAL, canonical_json
from .manifest import REPORT

log = logging.getLogger("data_prep")

DEDUP_FORMAT = 1
REPORT_MD = "dedup_report.md"
Stage = Literal["all", "signatures", "clusters", "write", "report"]
Compression = Literal["zst", "none"]
DecontaminateMode = Literal["cut", "drop", "report"]  # see data_prep.dedup.evalsets
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
SETTINGS_KEYS = ("config", "dedup", "corpora")
INPUT_SETTINGS = ("doc_boundary", "strip_gutenberg", "on_decode_error", "text_field", "hf_split", "max_doc_bytes")


@dataclass
class DedupConfig:
    """Settings that change which documents are kept and what they contain (all recorded in the report and hashed).

    Defaults (chosen from docs/dedup/quality.md, `bench/data/dedup_quality.py`): 3-word shingles, 14 bands x 8 rows (112
    signature values, as FineWeb's 5-word 14 x 8): of the settings whose chance candidates stay under 1e-3 per
    document at 160 GB (6.8e-4 here, FineWeb's 5.9e-4; 16 x 7 would make 3.9e-3, 20 x 5 0.18), the one that finds
    most copies with 5 % of the words changed (0.81, FineWeb's 0.30; 10 %: 0.18 vs 0.007), with every 1 % copy,
    every paragraph-shuffled copy and every copy that differs only in boilerplate; documents of at least 20 words
    compared; 13-grams clamped down to 8 for sets of short texts; GPT-3's cut rule."""

    shingle: int = 3
    bands: int = 14
    rows: int = 8
    seed: int = 1
    min_words: int = 20
    ngram: int = 13
    ngram_min: int = 8
    decontaminate: DecontaminateMode = "cut"
    eval_splits: str = "dev,test"
    cut_margin: int = 200
    cut_min_piece: int = 200
    cut_max_pieces: int = 10
    compress: Compression = "zst"
    unit_bytes: int = 64 << 20

    def problems(self) -> list[str]:
        """Out-of-range values, named by their command-line flags."""
        problems = literal_problems(self, key=lambda name: "--" + name.replace("_", "-"))
        for name in ("shingle", "bands", "rows", "ngram", "ngram_min", "cut_max_pieces"):
            if getattr(self, name) < 1:
                problems.append(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(self, name)})")
        if self.min_words < self.shingle:
            problems.append(f"--min-words must be >= --shingle (got {self.min_words} < {self.shingle})")
        if self.ngram_min > self.ngram:
            problems.append(f"--ngram-min must be <= --ngram (got {self.ngram_min} > {self.ngram})")
        if self.cut_margin < 0 or self.cut_min_piece < 0:
            problems.append("--cut-margin and --cut-min-piece must be >= 0")
        if self.unit_bytes < 1024:
            problems.append(f"--unit-size must be >= 1 KiB (got {self.unit_bytes} bytes)")
        if not [s for s in self.splits() if s]:
            problems.append("--eval-splits must name at least one split (or all)")
        return problems

    def splits(self) -> list[str]:
        return [s.strip().lower() for s in self.eval_splits.split(",") if s.strip()]


@dataclass(frozen=True)
class DedupRun:
    """How a run goes about its work; none of it changes an output byte (so none of it is hashed)."""

    workers: int = 1
    num_tasks: int = 1
    task_index: int = 0
    stage: Stage = "all"
    lsh_memory: int = 2 << 30
    allow_empty: bool = False
    rehash: bool = True
    max_nontext_fraction: float = TF.DEFAULT_MAX_NONTEXT_FRACTION  # (judges inputs; changes no output byte)

    def problems(self) -> list[str]:
        problems = literal_problems(self, key=lambda name: "--" + name.replace("_", "-"))
        if not 0 <= self.max_nontext_fraction <= 1:
            problems.append(f"--max-nontext-fraction must be within [0, 1] (got {self.max_nontext_fraction})")
        if self.workers < 1:
            problems.append(f"--workers must be >= 1 (got {self.workers})")
        if self.lsh_memory < 16 << 20:
            problems.append(f"--lsh-memory must be >= 16M (got {self.lsh_memory} bytes)")
        if self.num_tasks > 1 and self.stage not in ("signatures", "write"):
            problems.append(
                f"--stage {self.stage} with --num-tasks {self.num_tasks}: an array task runs --stage signatures or "
                "--stage write; clusters and report run once (slurm/dedup_data.sh submits all four)"
            )
        return problems


# ------------------------------------------------------------------------------------------------- corpora


def parse_corpora(inputs: Sequence[str]) -> list[tuple[str, str]]:
    """(corpus name, path) per input, in priority order: `NAME=PATH`, or PATH named after its last component (a
    glob after its folder); names must be distinct."""
    corpora: list[tuple[str, str]] = []
    for item in inputs:
        item = str(item)
        name, sep, path = item.partition("=")
        if not sep or not _NAME.match(name) or item.startswith("hf:"):
            name, path = _default_name(item), item
        if any(n == name for n, _ in corpora):
            raise DataPrepError(
                f"two inputs would both be corpus {name!r}: name them (NAME=PATH, e.g. wiki=/data/wiki)"
            )
        corpora.append((name, path))
    if not corpora:
        raise DataPrepError("no inputs given")
    return corpora


def _default_name(path: str) -> str:
    p = Path(path.rstrip("/"))
    if any(ch in path for ch in "*?["):
        p = Path(path.split("*")[0].split("?")[0].split("[")[0].rstrip("/") or ".")
    name = p.name.split(".")[0] if p.suffix else p.name
    name = re.sub(r"[^A-Za-z0-9._-]", "_", name or "corpus").lstrip("._-") or "corpus"
    return name


def source_corpora(corpora: list[tuple[str, str]], plan: dict[str, Any]) -> list[int]:
    """For each source of the plan, the index of its corpus; a file reached from two corpora is an error."""
    owner: dict[str, int] = {}
    for c, (name, path) in enumerate(corpora):
        for spec in S.discover([path]):
            real = spec.path if spec.kind == "hub" else os.path.realpath(spec.path)
            if owner.setdefault(real, c) != c:
                raise DataPrepError(
                    f"{spec.path}: in two corpora ({corpora[owner[real]][0]!r} and {name!r}): give each file once"
                )
    out = []
    for src in plan["sources"]:
        real = src["path"] if src["kind"] == "hub" else os.path.realpath(src["path"])
        out.append(owner[real])
    return out


# ---------------------------------------------------------------------------------------------------- plan


def make_dedup_plan(
    inputs: Sequence[str], cfg: DedupConfig, input_settings: dict[str, Any], out: Path, allow_empty: bool
) -> dict[str, Any]:
    """The plan of `data_prep.plan` (sources + work units, independent of workers and tasks), with the corpora, the
    corpus of each source and the dedup settings."""
    try:
        from .text import SIGNATURE_ALGORITHM
    except ImportError as e:  # rensa is in the train/dev extras
        raise DataPrepError(f"dedup needs the 'rensa' package ({e}): pip install rensa, or the [train] extra") from e

    corpora = parse_corpora(inputs)
    prep = make_config(None, unit_bytes=cfg.unit_bytes, **input_settings).resolved()
    plan = build_plan([p for _, p in corpora], prep, "", out, allow_empty)
    plan["config"] = {k: prep[k] for k in (*INPUT_SETTINGS, "unit_bytes")}
    plan["dedup"] = {**asdict(cfg), "format": DEDUP_FORMAT, "signature": SIGNATURE_ALGORITHM}
    plan["corpora"] = [name for name, _ in corpora]
    plan["source_corpus"] = source_corpora(corpora, plan)
    plan["splitter"] = "dedup"
    return plan


def signature_settings(plan: dict[str, Any]) -> dict[str, Any]:
    """What a unit's signatures depend on besides its bytes (not the evaluation sets or the cut rule)."""
    d = plan["dedup"]
    keep = ("shingle", "bands", "rows", "seed", "min_words", "format", "signature")
    return {"input": plan["config"], **{k: d[k] for k in keep}}


def unit_keys(plan: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    """A unit's identity: `settings` plus exactly the bytes it covers (as `data_prep.plan.unit_keys`)."""
    base = sha256_bytes(canonical_json(settings).encode())
    return [
        sha256_bytes(canonical_json([base, [[plan["sources"][si], a, b] for si, a, b in unit]]).encode())
        for unit in plan["units"]
    ]


def record_plan(out: Path, plan: dict[str, Any]) -> str:
    """Write OUT/.work/plan.json; returns the plan hash. An unfinished run with other settings is refused; one whose
    inputs changed is continued (units are keyed by their bytes, so only changed units are redone; the later stages
    start over)."""
    phash = plan_hash(plan)
    work = out / ".work"
    path = work / "plan.json"
    if path.is_file():
        old = read_object(path, DataPrepError, hint=f"delete {work} to start over")
        old_plan = old.get("plan", {})
        if any(old_plan.get(k) != plan[k] for k in SETTINGS_KEYS):
            raise DataPrepError(
                f"{path}: an unfinished dedup run in this directory used other settings or corpora; nothing was "
                f"changed: use a new --output (or delete {work} to start over)"
            )
        if old.get("plan_hash") != phash:
            log.warning(
                "%s: inputs changed since the last run (%s): changed units are redone",
                out,
                plan_difference(old_plan, plan),
            )
            for stage_dir in ("lsh", "write"):
                shutil.rmtree(work / stage_dir, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, {"plan_hash": phash, "plan": plan}, **CANONICAL)
    return phash


def finished_report(out: Path, phash: str) -> dict[str, Any] | None:
    """The report of a finished output made from this very plan; None when unfinished; another plan's is refused."""
    if read_checksums(out) is None or not (out / REPORT).is_file():
        return None
    report = read_object(
        out / REPORT, DataPrepError, hint="this directory holds a damaged dedup output: use a new --output"
    )
    if report.get("plan_hash") == phash:
        log.info("%s: already complete (report matches inputs and settings)", out)
        return report
    raise DataPrepError(
        f"{out / REPORT}: this directory already holds a finished dedup output of other inputs or settings; nothing "
        "was changed: use a new --output"
    )


def given_settings(args: Any) -> tuple[DedupConfig, dict[str, Any]]:
    """(DedupConfig, input settings) from parsed CLI arguments (the fields the command has flags for)."""
    cfg = DedupConfig(**{f.name: getattr(args, f.name) for f in fields(DedupConfig) if hasattr(args, f.name)})
    return cfg, {k: getattr(args, k) for k in INPUT_SETTINGS if hasattr(args, k)}


def remove_work(out: Path) -> None:
    shutil.rmtree(out / ".work", ignore_errors=True)
