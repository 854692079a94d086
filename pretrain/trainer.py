"""The DeepSpeed training loop: grouped exits, gradient equilibrium, exact resume, agreed preemption saves.

Order of work at start-up: everything that can fail on bad input (config, DeepSpeed JSON, run directory, data,
checkpoint compatibility) is checked before the process group exists, so a mistake costs seconds and prints one
clear message instead of a hung or half-started job.

One optimizer step t:
  active exits = group t mod G; lr = schedule(t) written into the param groups;
  for each of the `accum` micro-batches: dropout RNG <- f(seed, t, global micro index); forward; backward; step;
  one all-reduce carries the step's statistics, gradient norm and preemption vote (`StepStats`), read on the host
  once (the step's only host sync of ours): all ranks stop together; a non-finite loss or norm stops every rank at
  that step, before anything is saved (guards.py).
Everything a resumed run needs is (step, consumed_samples) + DeepSpeed's model/optimizer state: data order, masking
(per-sample seed), dropout (per-micro-step seed), lr and exit group (functions of step) are recomputed, not restored.

The components the loop calls live beside it: checkpointer.py (resume, save, load: the commit protocol),
evaluation.py (validation), corpora.py + data.py + collation.py (data; packed rows), model_setup.py, schedule.py
(lr, seeds, when to save / evaluate), stats.py (what crosses the ranks), rank_report.py (start-up, memory, comm time
per rank), mfu.py, precision.py (bf16/fp16/fp32, loss scaler), guards.py (what stops a run), metrics.py; common.run_dir.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from common.dist import DistEnv, resolve_env, stop_with_launcher
from common.errors import EXIT_PREEMPTED
from common.run_dir import RunLock, prepare_run_dir, release_inherited_locks

from .checkpoint import LATEST, read_latest
from .checkpointer import Checkpointer, dump_weights, export_files_writer, nonfinite_weight_tensors
from .collation import Collator
from .config import RunConfig, validate, write_resolved_configs
from .corpora import open_data
from .data import RankBatches, SampleOrder, batch_digests, train_loader
from .ds_config import fill_ds_config, load_ds_json
from .ds_runtime import import_deepspeed, quiet_deepspeed, set_op_build_arch
from .evaluation import evaluate
from .guards import TrainingDiverged, peer_lost, refuse_stale_build_locks, step_problem
from .metrics import MetricsLogger
from .mfu import model_flops_utilization, peak_flops
from .model_setup import build_model, init_source, param_groups
from .precision import DeviceCaps, choose_precision, describe_precision, precision_of, step_precision_record
from .preemption import PreemptionFlag, ignore_preemption_signals
from .rank_report import CommTimer, StartupClock, gather_startup, host_memory_mb, summarize_memory
from .schedule import due, learning_rate, micro_seed
from .stats import Group, StepStats, StepTotals


def _worker_init(worker_id: int) -> None:
    """DataLoader workers: survive the preemption signals, and do not hold the run directory's lock."""
    ignore_preemption_signals(worker_id)
    release_inherited_locks()


class Trainer:
    """Holds the engine and the loop state; `run()` returns the process exit code (0 done, 75 preempted)."""

    def __init__(
        self,
        cfg: RunConfig,
        run_dir: Path,
        ds_config_path: str | None,
        force_resume: bool,
        verify_checksums: bool = True,
    ) -> None:
        """Every check that needs no process group: config, DeepSpeed JSON, run directory and its lock, data,
        checkpoint (compatibility and this rank's share of its files)."""
        self.clock = StartupClock()
        quiet_deepspeed("cuda" if torch.cuda.is_available() else "cpu")
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.env: DistEnv = resolve_env()
        self.rank, self.world = self.env.rank, self.env.world_size
        self.group = Group(self.rank, self.world)
        self.caps = DeviceCaps.detect(self.env.local_rank)
        self.device = self.caps.kind
        self.preempt = PreemptionFlag()

        validate(cfg, world_size=self.world)
        refuse_stale_build_locks()  # before DeepSpeed loads an op and waits on it forever
        raw = load_ds_json(ds_config_path or cfg.train.ds_config)
        self.ds_cfg, self.layout = fill_ds_config(raw, cfg, self.world, self.caps)
        self.precision_choice = choose_precision(cfg.train.precision, raw, self.caps)
        self.precision = precision_of(self.ds_cfg)
        self.zero_stage = int(self.ds_cfg.get("zero_optimization", {}).get("stage", 0))
        prepare_run_dir(self.run_dir, self.rank)
        self.lock = RunLock.acquire(self.run_dir, self.env)
        verify = verify_checksums and cfg.checkpoint.verify_checksums
        self.checkpoints = Checkpointer(self.run_dir, self.rank, self.world, cfg.checkpoint.keep_last, verify)
        try:
            self._check_inputs(force_resume or cfg.checkpoint.force_resume)
        except BaseException:
            self.lock.release()
            raise

    def _check_inputs(self, force_resume: bool) -> None:
        """Data, then the checkpoint to resume from, then the resolved configs, written once everything passed."""
        cfg = self.cfg
        if cfg.model.init_from is not None:
            init_source(cfg.model.init_from)  # a hub name not in the cache fails here, before the process group
        self.data = open_data(cfg, self.run_dir, need_valid=cfg.eval.interval > 0)
        self.clock.mark("data_ready")
        self.groups = cfg.exit_groups()
        self.end_step = cfg.train.end_step()
        self.config_hash = cfg.semantic_hash()
        self.point = self.checkpoints.find(self.config_hash, cfg.to_dict(), force_resume)
        if self.rank == 0:
            write_resolved_configs(self.run_dir, cfg, self.ds_cfg)

    # ------------------------------------------------------------------ setup that needs the process group
    def _setup(self) -> None:
        """Process group, model, engine (resumed from the checkpoint if any), data loader, loggers."""
        deepspeed = import_deepspeed(self.ds_cfg["optimizer"]["type"])  # heavy: only once the cheap checks passed
        deepspeed.init_distributed(
            dist_backend="nccl" if self.device == "cuda" else "gloo", timeout=timedelta(minutes=60), verbose=False
        )
        if self.device == "cuda":
            torch.cuda.set_device(self.env.local_rank)
            set_op_build_arch()  # a DeepSpeed op built here (optim.backend=deepspeed) targets this node's GPUs
        self.group.dist = torch.distributed
        self.clock.mark("rendezvous")
        self.checkpoints.agree(self.group)
        model, self.origin = build_model(self.cfg, int(self.data.special_ids["vocab_size"]), self.data.tokenizer_dir)
        self.model_config = model.config
        self.clock.mark("model")
        self.load_tag = self.checkpoints.prepare_load(self.group, model.config, self.zero_stage, self.ds_cfg)
        if self.point is not None and self.load_tag != self.point.tag:
            self.clock.mark("converted")
        self.engine, *_ = deepspeed.initialize(
            model=model, model_parameters=param_groups(model, self.cfg.optim.weight_decay), config=self.ds_cfg
        )
        self.clock.mark("engine")
        self.step, self.consumed = self.checkpoints.load(self.engine, self.group)
        if self.point is not None:
            self.clock.mark("loaded")
        self.comm_timer = CommTimer(self.cfg.logging.comm_timing)
        self.last_saved = self.step if self.point is not None else -1
        d = self.cfg.data
        self.order = SampleOrder(
            [len(c) for c in self.data.train], [c.weight for c in d.corpora], self.cfg.train.seed, d.blend_block
        )
        lay = self.layout
        batches = RankBatches(self.order, self.consumed, lay.global_batch, lay.micro_batch, self.rank, self.world)
        pad_id = int(self.data.special_ids.get("pad", 0))  # compiled: every batch at max_length (one static shape)
        self.collator = Collator(pad_id, d.max_length if self.cfg.train.compile else 8, d.packing, d.max_length)
        self.loader = train_loader(self.data.train, batches, self.collator, d.num_workers, _worker_init)
        lg = self.cfg.logging
        self.metrics = MetricsLogger(
            self.run_dir, self.rank == 0, lg.tensorboard, lg.progress, self.end_step, self.step, lg.tb_interval
        )
        self.metrics.digests = lambda steps: batch_digests(self.order, steps, self.layout.global_batch)
        self.peak = peak_flops(lg.peak_tflops, self.device, self.precision)
        self.samples_log = (
            open(self.run_dir / f"samples_rank{self.rank}.jsonl", "a", encoding="utf-8") if lg.log_samples else None
        )

    def _announce(self) -> None:
        """The run's first lines (rank 0) and the `start` event, with every rank's start-up phases and memory."""
        self.hosts, startup = gather_startup(self.group, self.clock)
        n_params = sum(getattr(p, "ds_numel", p.numel()) for p in self.engine.module.parameters())
        lines = [
            f"ElasticBERT pre-training: {self.world} process(es) via {self.env.launcher}, device {self.device}, "
            f"ZeRO-{self.zero_stage}, {self.precision}{', compiled' if self.cfg.train.compile else ''}",
            f"  precision: {describe_precision(self.precision_choice, self.ds_cfg)}",
            f"  batch: {self.layout}",
            f"  model: {self.model_config.num_hidden_layers} layers, hidden {self.model_config.hidden_size}, "
            f"{n_params / 1e6:.2f}M parameters, {self.origin}",
            f"  exit groups (step t trains group t mod {len(self.groups)}): {self.groups}",
            f"  data: {sum(len(d) for d in self.data.train)} train samples in {len(self.data.train)} corpora; "
            f"index {'; '.join(self.data.index_paths)}",
        ]
        if self.point is not None:
            via = f" via {self.load_tag}" if self.load_tag != self.point.tag else ""
            lines.append(f"  resuming from {self.point.tag} (step {self.step}, consumed_samples {self.consumed}){via}")
            lines += [f"  forced resume despite config change: {d}" for d in self.checkpoints.config_diffs]
        lines += [f"  note: {n}" for n in (*self.caps.notes, *self.data.notes)]
        lines.append(
            f"  start-up across {self.world} rank(s), seconds since the first process started (last rank): "
            + ", ".join(f"{phase} {p['s']:.1f} (rank {p['rank']} on {p['host']})" for phase, p in startup.items())
        )
        for line in lines:
            self.metrics.write(line)
        self.metrics.event(
            "start",
            step=self.step,
            consumed_samples=self.consumed,
            launcher=self.env.launcher,
            zero_stage=self.zero_stage,
            precision=self.precision,
            precision_reason=self.precision_choice.reason,
            device=self.caps.describe(),
            **asdict(self.layout),  # micro_batch, grad_accum, global_batch, world_size
            resumed_from=self.point.tag if self.point else None,
            load_tag=self.load_tag,
            config_hash=self.config_hash,
            forced_diffs=self.checkpoints.config_diffs,
            startup=startup,
            memory=self._memory_summary(),
        )

    def _memory_summary(self) -> dict[str, Any]:
        """Peak host memory over the ranks (every rank calls this: it is a collective)."""
        return summarize_memory(self.group.all_gather(host_memory_mb()), self.hosts)

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
            batch = {name: t.to(self.engine.device, non_blocking=True) for name, t in batch.items() if name != "keys"}
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
) -> int:
    """Entry point used by the CLI: returns the exit code."""
    return Trainer(cfg, run_dir, ds_config_path, force_resume, verify_checksums).run()
