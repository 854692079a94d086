"""Rank-0 metrics: RUN/metrics.jsonl (one line per optimizer step, machine-readable, compared by tests and the Slurm
scripts), RUN/events.jsonl (start / resume / checkpoint / preemption / end), RUN/eval.jsonl, TensorBoard scalars,
and a tqdm bar. Other ranks get a logger whose methods do nothing, so call sites need no rank checks.

Step records are written every `logging.tb_interval` steps, all of the interval's at once (one append, the
TensorBoard scalars, the bar): between two writes the host does no file work, which on a GPU it would do while the
device waits for the next step's kernels. Every record is written, in order: the buffer is written before any event
(a checkpoint, a preemption, a divergence, the end) and when the logger closes (also after an error), so the
records up to every checkpoint are on disk when it is; a killed process loses at most the records of steps after
its last checkpoint, which the resumed run trains and logs again."""

from __future__ import annotations

import json
import math
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.run_dir import RunWriteError, describe_write_error


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    return v


class MetricsLogger:
    def __init__(
        self,
        run_dir: Path,
        enabled: bool,
        tensorboard: bool,
        progress: bool,
        total_steps: int,
        start_step: int,
        tb_interval: int = 1,
    ) -> None:
        self.enabled = enabled
        self.tb_interval = tb_interval
        self.pending: list[dict[str, Any]] = []  # step records not written yet
        # `samples_digest` of 0-based steps, computed for a whole interval at once when its records are written
        self.digests: Callable[[range], list[str]] | None = None
        self.attempt = 0
        self._tb = None
        self._bar = None
        if not enabled:
            return
        self.metrics_path = run_dir / "metrics.jsonl"
        self.events_path = run_dir / "events.jsonl"
        self.eval_path = run_dir / "eval.jsonl"
        if self.events_path.is_file():
            with open(self.events_path, encoding="utf-8") as f:
                self.attempt = sum(1 for line in f if '"event": "start"' in line)
        self.attempt += 1
        if tensorboard:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                from torch.utils.tensorboard import SummaryWriter
            self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        if progress:
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, initial=start_step, desc="pretrain", unit="step", dynamic_ncols=True)

    def _append(self, path: Path, *records: dict[str, Any]) -> None:
        try:
            with open(path, "a", encoding="utf-8") as f:
                f.write("".join(json.dumps({k: _jsonable(v) for k, v in r.items()}) + "\n" for r in records))
                f.flush()
        except OSError as e:
            raise RunWriteError(f"cannot append to {path}: {describe_write_error(e)}") from None

    def event(self, name: str, **fields: Any) -> None:
        if self.enabled:
            self.flush()
            self._append(self.events_path, {"event": name, "attempt": self.attempt, "time": time.time(), **fields})

    def step(self, record: dict[str, Any]) -> None:
        """One optimizer step's record: kept, and written with the others of its interval at its end (`flush`)."""
        if not self.enabled:
            return
        self.pending.append({**record, "attempt": self.attempt})
        if record["step"] % self.tb_interval == 0:
            self.flush()

    def flush(self) -> None:
        """Write the kept step records: metrics.jsonl (every one), TensorBoard (the steps on the interval), the bar."""
        if not self.enabled or not self.pending:
            return
        records, self.pending = self.pending, []
        if self.digests is not None:
            first = records[0]["step"] - 1  # the records of one process are consecutive steps
            for record, digest in zip(records, self.digests(range(first, first + len(records))), strict=True):
                record["samples_digest"] = digest
        self._append(self.metrics_path, *records)
        for record in records:
            if self._tb is not None and record["step"] % self.tb_interval == 0:
                self._scalars(record)
        if self._bar is not None:
            last = records[-1]
            self._bar.update(len(records))
            self._bar.set_postfix(
                loss=f"{last['loss']:.3f}", lr=f"{last['lr']:.2e}", tok_s=f"{last.get('tokens_per_s') or 0:.0f}"
            )

    def _scalars(self, record: dict[str, Any]) -> None:
        tb, step = self._tb, record["step"]
        tb.add_scalar("train/loss", record["loss"], step)
        keys = (
            "lr", "grad_norm", "tokens_per_s", "mfu", "data_wait_s", "step_time_s", "loss_scale", "skipped_steps",
            "samples", "rows", "tokens", "padding_fraction",
        )  # fmt: skip
        for key in keys:
            if record.get(key) is not None:
                tb.add_scalar(f"train/{key}", record[key], step)
        for i, layer in enumerate(record["active_exits"]):
            tb.add_scalar(f"mlm_loss/exit_{layer:02d}", record["mlm_loss"][i], step)
            tb.add_scalar(f"mlm_accuracy/exit_{layer:02d}", record["mlm_accuracy"][i], step)
            tb.add_scalar(f"sop_loss/exit_{layer:02d}", record["sop_loss"][i], step)
            tb.add_scalar(f"sop_accuracy/exit_{layer:02d}", record["sop_accuracy"][i], step)

    def eval(self, record: dict[str, Any]) -> None:
        """One validation: eval.jsonl, a line, TensorBoard."""
        if not self.enabled:
            return
        self.flush()
        self._append(self.eval_path, {**record, "attempt": self.attempt})
        losses = " ".join(f"{x:.3f}" for x in record["mlm_loss"])
        self.write(
            f"valid @ step {record['step']}: MLM loss by exit {losses}; SOP acc (top) {record['sop_accuracy'][-1]:.3f}"
        )
        if self._tb is not None:
            step = record["step"]
            for i, layer in enumerate(record["exits"]):
                self._tb.add_scalar(f"valid_mlm_loss/exit_{layer:02d}", record["mlm_loss"][i], step)
                self._tb.add_scalar(f"valid_mlm_accuracy/exit_{layer:02d}", record["mlm_accuracy"][i], step)
                self._tb.add_scalar(f"valid_sop_accuracy/exit_{layer:02d}", record["sop_accuracy"][i], step)

    def write(self, message: str) -> None:
        """A line that does not break the progress bar."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(message)
        else:
            print(message, flush=True)

    def close(self) -> None:
        self.flush()
        if self._bar is not None:
            self._bar.close()
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def latest_per_step(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The record of each step from the newest attempt that logged it (a restart re-logs the steps after the
    checkpoint it resumed from)."""
    out: dict[int, dict[str, Any]] = {}
    for r in records:
        if r["step"] not in out or r.get("attempt", 0) >= out[r["step"]].get("attempt", 0):
            out[r["step"]] = r
    return out
