"""The DeepSpeed training loop: grouped exits, gradient equilibrium, exact resume, agreed preemption saves.

Start-up comes first, in phases (startup.py: every check that can fail on bad input before the process group
exists, then the model, engine, data loader and loggers, then the announcement); this module is the loop.

One optimizer step t:
  active exits = group t mod G; lr = schedule(t) written into the param groups;
  for each of the `accum` micro-batches: dropout RNG <- f(seed, t, global micro index); forward; backward; step;
  one all-reduce carries the step's statistics, gradient norm and preemption vote (`StepStats`), read on the host
  once (the step's only host sync of ours): all ranks stop together; a non-finite loss or norm stops every rank at
  that step, before anything is saved (guards.py).
Everything a resumed run needs is (step, consumed_samples) + DeepSpeed's model/optimizer state: data order, masking
(per-sample seed), dropout (per-micro-step seed), lr and exit group (functions of step) are recomputed, not restored.
Each checkpoint also records the fingerprint of every corpus (`corpora`): a resume on other data is refused, or, with
`--resume-on-new-data`, starts the sample order over on it (`data_start_samples`, `data_changes`).

The components the loop calls live beside it: startup.py (the state it runs on), checkpointer.py (resume, save,
load: the commit protocol), evaluation.py (validation), corpora.py + data.py + collation.py (data; packed rows),
model_setup.py, schedule.py (lr, seeds, when to save / evaluate), stats.py (what crosses the ranks), rank_report.py
(start-up, memory, comm time per rank), mfu.py, precision.py (bf16/fp16/fp32, loss scaler), guards.py (what stops a
run), metrics.py; common.run_dir.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from common.dist import stop_with_launcher
from common.errors import EXIT_PREEMPTED

from .checkpoint import LATEST, read_latest
from .checkpointer import dump_weights, export_files_writer, nonfinite_weight_tensors
from .collation import to_device
from .config import RunConfig
from .evaluation import evaluate
from .guards import TrainingDiverged, peer_lost, step_problem
from .mfu import model_flops_utilization
from .precision import step_precision_record
from .schedule import due, learning_rate, micro_seed
from .startup import TrainerStartup
from .stats import StepStats, StepTotals


class Trainer(TrainerStartup):
    """The loop over the start-up's state (`TrainerStartup`); `run()` returns the process exit code (0 done, 75
    preempted)."""

    # ------------------------------------------------------------------------------------------- the loop
    def run(self) -> int:
        self.preempt.install()  # from here on a SIGTERM/SIGUSR1 (or a dead launcher's) means "save at the next step"
        stop_with_launcher(self.env)
        try:
            self._setup()
            self._announce()
            return self._train()
        except RuntimeError as err:
            where = f"rank {self.rank} on {socket.gethostname()}, step {getattr(self, 'step', 0)}"
            lost = peer_lost(err, where, getattr(self, "hosts", []))
            if lost is None:
                raise
            raise lost from None
        finally:
            self.preempt.restore()
            if hasattr(self, "metrics"):
                self.metrics.close()
            if getattr(self, "samples_log", None):
                self.samples_log.close()
            self.group.leave()
            self.lock.release()

    def _train(self) -> int:
        """Optimizer steps up to `end_step`, saving and validating when due; exits 75 after a preemption save."""
        batches = iter(self.loader)
        while self.step < self.end_step:
            code = self.optimizer_step(batches)
            if code is not None:
                return code
        if self.last_saved != self.step:
            self.save()
        if self.cfg.checkpoint.dump_final_weights:
            dump_weights(self.engine, self.group, self.zero_stage, self.run_dir / "final_weights.safetensors")
        self.metrics.event("end", step=self.step, consumed_samples=self.consumed, memory=self._memory_summary())
        return 0

    def optimizer_step(self, batches: Iterator[dict[str, torch.Tensor]]) -> int | None:
        """One optimizer step and what follows it (its record, the guards, a due save or validation); returns the
        exit code when the run stops here (75: preempted), else None. Its one host sync is the read of the reduced
        sums (`StepStats.reduce_and_read`): until then every figure stays on the device, so the host keeps queuing
        work ahead of the GPU."""
        t0 = time.perf_counter()
        active = self.groups[self.step % len(self.groups)]
        lr = learning_rate(self.step, self.cfg.train.train_steps, self.cfg.optim)
        for group in self.engine.optimizer.param_groups:
            group["lr"] = lr
        totals = self._train_step(batches, active).reduce_and_read(self.group)  # also the preemption vote
        precision = step_precision_record(self.engine, self.precision)
        self.step += 1
        self.consumed += self.layout.global_batch
        record = self._log_step(totals, active, lr, time.perf_counter() - t0, precision)
        problem = step_problem(record["loss"], record["grad_norm"], precision["step_skipped"], self.precision)
        if problem:
            self._stop_diverged(problem)
        if totals.preempted:
            return self._save_for_preemption()
        if due(self.step, self.end_step, self.cfg.checkpoint.interval):
            self.save()
        if due(self.step, self.end_step, self.cfg.eval.interval):
            self.evaluate()
        return None

    def _train_step(self, batches: Iterator[dict[str, torch.Tensor]], active: tuple[int, ...]) -> StepStats:
        """The `grad_accum` micro-batches of one optimizer step (DeepSpeed steps the optimizer after the last one);
        returns this rank's sums, DeepSpeed's gradient norm and its preemption vote, on the device, not reduced."""
        stats = StepStats.zeros(len(active), self.engine.device)
        accum = self.layout.grad_accum
        for m in range(accum):
            tw = time.perf_counter()
            batch = next(batches)
            stats.data_wait_s += time.perf_counter() - tw
            if self.samples_log is not None:  # the DataLoader's keys, on the host: no device sync
                keys = batch["keys"].tolist()
                self.samples_log.write(json.dumps({"step": self.step, "micro": m, "keys": keys}) + "\n")
            # asynchronous copies: a blocking host-to-device copy waits for the queued kernels, a sync per tensor
            batch = to_device(batch, self.engine.device, non_blocking=True)
            torch.manual_seed(micro_seed(self.cfg.train.seed, self.step, self.rank * accum + m))
            out = self.engine(**batch, active_exits=active, gradient_equilibrium=self.cfg.exits.gradient_equilibrium)
            if tuple(out.exit_layers) != tuple(active):
                raise RuntimeError(f"model trained exits {out.exit_layers}, expected group {active}")
            self.engine.backward(out.loss)
            self.engine.step()
            stats.add_micro_batch(out, batch)
        stats.set_grad_norm(self.engine.get_global_grad_norm())
        stats.comm_s += self.comm_timer.take() or 0.0
        stats.vote_preemption(self.preempt.requested)
        return stats

    def _log_step(
        self, totals: StepTotals, active: tuple[int, ...], lr: float, elapsed: float, precision: dict[str, Any]
    ) -> dict[str, Any]:
        """One metrics.jsonl record from the reduced sums (means over accumulation × world micro-batches); returns
        it. `precision`: the fp16 loss scaler's bookkeeping (`step_precision_record`)."""
        n = self.layout.grad_accum * self.world
        v = totals.values
        tokens, masked, padded = v["tokens"], v["masked"], v["padded"]
        record: dict[str, Any] = {
            "step": self.step,
            "loss": v["loss"] / n,
            "active_exits": list(active),
            "group": (self.step - 1) % len(self.groups),
            "consumed_samples": self.consumed,
            "lr": lr,
            "grad_norm": totals.grad_norm,
            **totals.exit_means(n),
            "samples": int(v["samples"]),
            "rows": int(v["rows"]),
            "tokens": int(tokens),  # real tokens: packed or padded, padding never counts
            "tokens_per_s": tokens / elapsed,
            "padding_fraction": 1.0 - tokens / padded if padded else 0.0,
            "data_wait_s": v["data_wait_s"] / self.world,
            **({"comm_s": v["comm_s"] / self.world} if self.comm_timer.enabled else {}),
            "step_time_s": elapsed,
            "time": time.time(),
            "world_size": self.world,
            **precision,
        }
        if self.peak:
            record["mfu"] = model_flops_utilization(
                self.model_config, active, tokens, masked, v["samples"], elapsed, self.peak, self.world, v["attended"]
            )
        self.metrics.step(record)
        return record

    def _stop_diverged(self, problem: str) -> None:
        """A non-finite step: record it and stop every rank (they all see the same reduced values) unsaved."""
        latest = read_latest(self.checkpoints.dir)
        self.metrics.event("diverged", step=self.step, problem=problem, latest=latest)
        raise TrainingDiverged.at(problem, self.step, self.checkpoints.dir / LATEST, latest)

    # -------------------------------------------------------------------------------------- checkpoints, eval
    def _save_for_preemption(self) -> int:
        signame = self.preempt.name  # SIGTERM, SIGUSR1, or "a peer rank"
        self.metrics.write(f"preemption ({signame}): saving at step {self.step} and exiting with {EXIT_PREEMPTED}")
        self.save()
        self.metrics.event("preempted", step=self.step, signal=signame)
        return EXIT_PREEMPTED

    def save(self) -> None:
        """A checkpoint of this step (`Checkpointer.save`; a committed one is never rewritten), never of NaN/inf
        weights; a `checkpoint` event."""
        if self.checkpoints.committed(self.step):
            self.last_saved = self.step
            return
        bad = nonfinite_weight_tensors(self.engine, self.group, self.zero_stage)
        if bad:
            self._stop_diverged(f"{bad} weight tensor(s) hold NaN/inf")
        state = {
            "step": self.step,
            "consumed_samples": self.consumed,
            "group_cursor": self.step % len(self.groups),
            "config_hash": self.config_hash,
            "world_size": self.world,
            "zero_stage": self.zero_stage,
            "micro_batch": self.layout.micro_batch,
            "precision": self.precision,
            "corpora": self.data.fingerprints,  # the data it trained on, compared on resume (`check_resume_data`)
            "data_start_samples": self.data_start,  # where the sample order of these corpora started
            "data_changes": self.data_history,
        }
        write_export = export_files_writer(self.model_config, self.data.tokenizer_dir)
        saved = self.checkpoints.save(self.engine, self.group, state, self.cfg.to_dict(), write_export)
        self.metrics.event("checkpoint", step=self.step, **saved, memory=self._memory_summary())
        self.last_saved = self.step

    def evaluate(self) -> dict[str, Any] | None:
        """Every exit on the held-out slice (`pretrain.evaluation`); an eval.jsonl record and one line."""
        e, layers = self.cfg.eval, self.model_config.num_hidden_layers
        micro = e.micro_batch_size or self.layout.micro_batch
        sums = evaluate(self.engine, self.data.valid, self.collator, self.group, e.max_samples, micro, layers)
        if sums is None:
            self.metrics.write("validation skipped: held-out split smaller than one batch per rank")
            return None
        record = {"step": self.step, **sums}
        self.metrics.eval(record)
        return record


def train(
    cfg: RunConfig,
    run_dir: Path,
    ds_config_path: str | None = None,
    force_resume: bool = False,
    verify_checksums: bool = True,
    resume_on_new_data: bool = False,
) -> int:
    """Entry point used by the CLI: returns the exit code."""
    return Trainer(cfg, run_dir, ds_config_path, force_resume, verify_checksums, resume_on_new_data).run()
