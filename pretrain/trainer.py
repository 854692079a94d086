"""The DeepSpeed training loop and its checkpoint calls: grouped exits, gradient equilibrium, exact resume, agreed
preemption saves.

Order of work at start-up: everything that can fail on bad input (config, DeepSpeed JSON, run directory, data,
checkpoint compatibility) is checked before the process group exists, so a mistake costs seconds and prints one
clear message instead of a hung or half-started job.

One optimizer step t:
  active exits = group t mod G; lr = schedule(t) written into the param groups;
  for each of the `accum` micro-batches: dropout RNG <- f(seed, t, global micro index); forward; backward; step;
  one all-reduce carries the step's statistics *and* the preemption vote (`StepStats`), so all ranks stop at the
  same step.
  a non-finite loss or gradient norm stops every rank at that step, before anything is saved (guards.py).
Everything a resumed run needs is (step, consumed_samples) + DeepSpeed's model/optimizer state: data order,
masking (per-sample seed), dropout (per-micro-step seed), lr (function of step) and the exit group (step mod G)
are all recomputed, not restored. The checkpoint is verified (checksums, truncation) before it is loaded.

What the loop uses lives beside it: corpora.py (data), model_setup.py (model), schedule.py (lr, seeds, when to
save / evaluate), stats.py (what crosses the ranks), mfu.py (FLOPs utilisation), precision.py (bf16/fp16/fp32 and
the loss scaler), guards.py (what stops a run), checkpoint.py + integrity.py (the layout, commit protocol and
checksums), run_dir.py (the directory and its lock), metrics.py.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from common.dist import DistEnv, resolve_env
from common.errors import EXIT_PREEMPTED
from common.io import atomic_path, atomic_write_text

from .checkpoint import (
    CLIENT_STATE,
    LATEST,
    ResumeError,
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
from .config import RunConfig, validate
from .corpora import open_data
from .data import BlendedDataset, Collator, RankBatches, SampleOrder, batch_digest, collate
from .ds_config import fill_ds_config, load_ds_json
from .ds_runtime import import_deepspeed, quiet_deepspeed
from .guards import (
    RunWriteError,
    TrainingDiverged,
    describe_write_error,
    peer_lost,
    refuse_stale_build_locks,
    step_problem,
)
from .integrity import LOAD_ERRORS, hash_files, list_files, share_of, verify_share, write_checksums
from .metrics import MetricsLogger
from .mfu import model_flops_utilization, peak_flops
from .model_setup import build_model, init_source, param_groups
from .precision import DeviceCaps, choose_precision, describe_precision, precision_of, step_precision_record
from .preemption import PreemptionFlag, ignore_preemption_signals
from .rank_report import CommTimer, StartupClock, host_memory_mb, summarize_memory, summarize_startup
from .run_dir import RunLock, prepare_run_dir, release_inherited_locks, write_resolved_configs
from .schedule import due, learning_rate, micro_seed
from .stats import EvalSums, StepStats


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
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.env: DistEnv = resolve_env()
        self.rank, self.world = self.env.rank, self.env.world_size
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
        try:
            self._check_inputs(force_resume or cfg.checkpoint.force_resume, verify_checksums)
        except BaseException:
            self.lock.release()
            raise

    def _check_inputs(self, force_resume: bool, verify_checksums: bool) -> None:
        """Data, checkpoint compatibility and integrity (a single process refuses here; several agree in
        `_setup`), then the resolved configs, written only once everything passed."""
        cfg = self.cfg
        if cfg.model.init_from is not None:
            init_source(cfg.model.init_from)  # a hub name not in the cache fails here, before the process group
        self.data = open_data(cfg, self.run_dir, need_valid=cfg.eval.interval > 0)
        self.clock.mark("data_ready")
        self.groups = cfg.exit_groups()
        self.end_step = cfg.train.end_step()
        self.config_hash = cfg.semantic_hash()
        self.point = find_resume_point(self.ckpt_dir)
        self.config_diffs: list[str] = []
        self.integrity_problems: list[str] = []
        if self.point is not None:
            self.config_diffs = check_compatible(self.point, self.config_hash, cfg.to_dict(), force_resume)
            self.integrity_problems = verify_share(
                self.ckpt_dir / self.point.tag,
                self.rank,
                self.world,
                verify_checksums and cfg.checkpoint.verify_checksums,
            )
            if self.world == 1 and self.integrity_problems:
                raise integrity_refusal(self.ckpt_dir, self.point.tag, self.integrity_problems)
        if self.rank == 0:
            write_resolved_configs(self.run_dir, cfg, self.ds_cfg)

    def _all_gather(self, obj: Any) -> list[Any]:
        """`obj` of every rank (how the ranks agree on a failure only some of them saw)."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        self.dist.all_gather_object(out, obj)
        return out

    def _broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if self.world == 1:
            return obj
        box = [obj]
        self.dist.broadcast_object_list(box, src=0)
        return box[0]

    def _memory_summary(self) -> dict[str, Any]:
        """Peak host memory over the ranks (every rank calls this: it is a collective)."""
        return summarize_memory(self._all_gather(host_memory_mb()), self.hosts)

    # ------------------------------------------------------------------ setup that needs the process group
    def _setup(self) -> None:
        """Process group, model, engine (resumed from the checkpoint if any), data loader, loggers."""
        deepspeed = import_deepspeed(self.ds_cfg["optimizer"]["type"])  # heavy: only once the cheap checks passed
        deepspeed.init_distributed(
            dist_backend="nccl" if self.device == "cuda" else "gloo", timeout=timedelta(minutes=60), verbose=False
        )
        if self.device == "cuda":
            torch.cuda.set_device(self.env.local_rank)
        self.dist = torch.distributed
        self.clock.mark("rendezvous")
        problems = [p for rank_problems in self._all_gather(self.integrity_problems) for p in rank_problems]
        if problems:
            raise integrity_refusal(self.ckpt_dir, self.point.tag, problems)
        model, self.origin = build_model(self.cfg, int(self.data.special_ids["vocab_size"]), self.data.tokenizer_dir)
        self.model_config = model.config
        self.clock.mark("model")
        if self.point is not None:
            check_architecture(self.ckpt_dir, self.point.tag, model.config)
        self.load_tag = self._checkpoint_to_load()
        if self.point is not None and self.load_tag != self.point.tag:
            self.clock.mark("converted")
        self.engine, *_ = deepspeed.initialize(
            model=model, model_parameters=param_groups(model, self.cfg.optim.weight_decay), config=self.ds_cfg
        )
        self.clock.mark("engine")
        self.step, self.consumed = self._load_checkpoint()
        if self.point is not None:
            self.clock.mark("loaded")
        self.comm_timer = CommTimer(self.cfg.logging.comm_timing)
        self.last_saved = self.step if self.point is not None else -1
        self.order = SampleOrder(
            [len(d) for d in self.data.train],
            [c.weight for c in self.cfg.data.corpora],
            self.cfg.train.seed,
            self.cfg.data.blend_block,
        )
        self.loader = self._train_loader()
        lg = self.cfg.logging
        self.metrics = MetricsLogger(
            self.run_dir, self.rank == 0, lg.tensorboard, lg.progress, self.end_step, self.step, lg.tb_interval
        )
        self.peak = peak_flops(lg.peak_tflops, self.device, self.precision)
        self.samples_log = (
            open(self.run_dir / f"samples_rank{self.rank}.jsonl", "a", encoding="utf-8") if lg.log_samples else None
        )

    def _checkpoint_to_load(self) -> str | None:
        """The tag to resume from: the latest one, or its universal conversion when the world size / ZeRO stage
        changed (rank 0 converts; the others wait)."""
        if self.point is None:
            return None
        if not needs_universal(self.point.state, self.world, self.zero_stage):
            return self.point.tag
        tag = convert_to_universal(self.ckpt_dir, self.point.tag) if self.rank == 0 else f"{self.point.tag}_universal"
        self.dist.barrier()
        self.ds_cfg.setdefault("checkpoint", {})["load_universal"] = True
        return tag

    def _load_checkpoint(self) -> tuple[int, int]:
        """DeepSpeed's model/optimizer state into the engine; returns (step, consumed_samples)."""
        if self.point is None:
            return 0, 0
        path, client, error = None, None, None
        try:
            path, client = self.engine.load_checkpoint(
                str(self.ckpt_dir), tag=self.load_tag, load_lr_scheduler_states=False
            )
        except LOAD_ERRORS as e:
            error = f"rank {self.rank}: {type(e).__name__}: {str(e)[:500]}"
        errors = [e for e in self._all_gather(error) if e]
        if errors or path is None:
            raise ResumeError(
                f"DeepSpeed could not load checkpoint {self.ckpt_dir / self.load_tag}: "
                f"{errors[0] if errors else 'no model states found'}{older_hint(self.ckpt_dir, self.point.tag)}"
            )
        step = self.point.step
        if client and int(client.get("step", step)) != step:
            raise ResumeError(f"{self.load_tag}: client state step {client.get('step')} != {step}")
        if self.ds_cfg.get("checkpoint", {}).get("load_universal"):
            self.engine._config.load_universal_checkpoint = False  # later saves are ordinary, for the new world
        return step, self.point.consumed_samples

    def _train_loader(self) -> torch.utils.data.DataLoader:
        """This rank's micro-batches from `consumed_samples` on, built in worker processes when configured."""
        batches = RankBatches(
            self.order, self.consumed, self.layout.global_batch, self.layout.micro_batch, self.rank, self.world
        )
        nw = self.cfg.data.num_workers
        return torch.utils.data.DataLoader(
            BlendedDataset(self.data.train),
            batch_sampler=batches,
            collate_fn=Collator(int(self.data.special_ids.get("pad", 0))),
            num_workers=nw,
            worker_init_fn=_worker_init if nw else None,
            prefetch_factor=4 if nw else None,
            persistent_workers=False,
        )

    def _announce(self) -> None:
        gathered = self._all_gather((socket.gethostname(), self.clock.marks))
        self.hosts = [host for host, _ in gathered]
        startup = summarize_startup([marks for _, marks in gathered], self.hosts)
        n_params = sum(p.numel() for p in self.engine.module.parameters())
        if self.zero_stage == 3:
            n_params = sum(getattr(p, "ds_numel", p.numel()) for p in self.engine.module.parameters())
        lines = [
            f"ElasticBERT pre-training: {self.world} process(es) via {self.env.launcher}, device {self.device}, "
            f"ZeRO-{self.zero_stage}, {self.precision}",
            f"  precision: {describe_precision(self.precision_choice, self.ds_cfg)}",
            f"  batch: {self.layout}",
            f"  model: {self.model_config.num_hidden_layers} layers, hidden {self.model_config.hidden_size}, "
            f"{n_params / 1e6:.2f}M parameters, {self.origin}",
            f"  exit groups (step t trains group t mod {len(self.groups)}): {self.groups}",
            f"  data: {sum(len(d) for d in self.data.train)} train samples in {len(self.data.train)} corpora; "
            f"index {'; '.join(self.data.index_paths)}",
        ]
        if self.point is not None:
            lines.append(
                f"  resuming from {self.point.tag} (step {self.step}, consumed_samples {self.consumed})"
                + (f" via {self.load_tag}" if self.load_tag != self.point.tag else "")
            )
            for d in self.config_diffs:
                lines.append(f"  forced resume despite config change: {d}")
        lines += [f"  note: {n}" for n in self.data.notes]
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
            world_size=self.world,
            launcher=self.env.launcher,
            zero_stage=self.zero_stage,
            precision=self.precision,
            precision_reason=self.precision_choice.reason,
            device=self.caps.describe(),
            micro_batch=self.layout.micro_batch,
            grad_accum=self.layout.grad_accum,
            global_batch=self.layout.global_batch,
            resumed_from=self.point.tag if self.point else None,
            load_tag=self.load_tag,
            config_hash=self.config_hash,
            forced_diffs=self.config_diffs,
            startup=startup,
            memory=self._memory_summary(),
        )

    # ------------------------------------------------------------------------------------------- the loop
    def run(self) -> int:
        self.preempt.install()  # from here on a SIGTERM/SIGUSR1 means "save at the next step boundary"
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
            self._leave_process_group()
            self.lock.release()

    def _leave_process_group(self) -> None:
        """Join gloo's worker threads while the interpreter is alive: a rank that exits without this can abort at
        exit ("terminate called without an active exception", pytorch#190489) and fail a finished Slurm step
        (seen in CI; 3 of 20 bare 2-rank gloo runs here, 0 of 30 with it)."""
        dist = getattr(self, "dist", None)
        if dist is not None and dist.is_initialized():
            dist.destroy_process_group()

    def _train(self) -> int:
        """Optimizer steps up to `end_step`, saving and validating when due; exits 75 after a preemption save."""
        batches = iter(self.loader)
        while self.step < self.end_step:
            t0 = time.perf_counter()
            active = self.groups[self.step % len(self.groups)]
            lr = learning_rate(self.step, self.cfg.train.train_steps, self.cfg.optim)
            for group in self.engine.optimizer.param_groups:
                group["lr"] = lr
            stats = self._train_step(batches, active).all_reduce(self.dist)  # also the preemption vote
            grad_norm = self.engine.get_global_grad_norm()
            precision = step_precision_record(self.engine, self.precision)
            self.step += 1
            self.consumed += self.layout.global_batch
            record = self._log_step(stats, active, lr, grad_norm, time.perf_counter() - t0, precision)
            problem = step_problem(record["loss"], record["grad_norm"], precision["step_skipped"], self.precision)
            if problem:
                self._stop_diverged(problem)
            if stats.preempted:
                return self._save_for_preemption()
            if due(self.step, self.end_step, self.cfg.checkpoint.interval):
                self.save()
            if due(self.step, self.end_step, self.cfg.eval.interval):
                self.evaluate()
        if self.last_saved != self.step:
            self.save()
        if self.cfg.checkpoint.dump_final_weights:
            self.dump_weights(self.run_dir / "final_weights.safetensors")
        self.metrics.event("end", step=self.step, consumed_samples=self.consumed, memory=self._memory_summary())
        return 0

    def _train_step(self, batches: Iterator[dict[str, torch.Tensor]], active: tuple[int, ...]) -> StepStats:
        """The `grad_accum` micro-batches of one optimizer step (DeepSpeed steps the optimizer after the last one);
        returns this rank's sums and its preemption vote, not yet reduced."""
        stats = StepStats.zeros(len(active), self.engine.device)
        accum = self.layout.grad_accum
        wait = 0.0
        for m in range(accum):
            tw = time.perf_counter()
            batch = next(batches)
            wait += time.perf_counter() - tw
            self._log_samples(m, batch.pop("keys"))
            batch = {name: t.to(self.engine.device) for name, t in batch.items()}
            torch.manual_seed(micro_seed(self.cfg.train.seed, self.step, self.rank * accum + m))
            out = self.engine(**batch, active_exits=active, gradient_equilibrium=self.cfg.exits.gradient_equilibrium)
            if tuple(out.exit_layers) != tuple(active):
                raise RuntimeError(f"model trained exits {out.exit_layers}, expected group {active}")
            self.engine.backward(out.loss)
            self.engine.step()
            stats.add_micro_batch(out, batch)
        stats.data_wait_s += wait
        stats.comm_s += self.comm_timer.take() or 0.0
        stats.vote_preemption(self.preempt.requested)
        return stats

    def _log_samples(self, micro: int, keys: torch.Tensor) -> None:
        if self.samples_log is not None:
            self.samples_log.write(json.dumps({"step": self.step, "micro": micro, "keys": keys.tolist()}) + "\n")

    def _log_step(
        self,
        stats: StepStats,
        active: tuple[int, ...],
        lr: float,
        grad_norm: float | None,
        elapsed: float,
        precision: dict[str, Any],
    ) -> dict[str, Any]:
        """One metrics.jsonl record from the reduced sums (means over accumulation × world micro-batches); returns
        it. `precision`: the fp16 loss scaler's bookkeeping (`step_precision_record`)."""
        n = self.layout.grad_accum * self.world
        tokens, masked, padded = float(stats.tokens), float(stats.masked), float(stats.padded)
        record: dict[str, Any] = {
            "step": self.step,
            "loss": float(stats.loss) / n,
            "active_exits": list(active),
            "group": (self.step - 1) % len(self.groups),
            "consumed_samples": self.consumed,
            "lr": lr,
            "grad_norm": float(grad_norm) if grad_norm is not None else None,
            **stats.exit_means(n),
            "tokens": int(tokens),
            "tokens_per_s": tokens / elapsed,
            "padding_fraction": 1.0 - tokens / padded if padded else 0.0,
            "data_wait_s": float(stats.data_wait_s) / self.world,
            **({"comm_s": float(stats.comm_s) / self.world} if self.comm_timer.enabled else {}),
            "step_time_s": elapsed,
            "time": time.time(),
            "world_size": self.world,
            **precision,
        }
        if self.rank == 0:
            record["samples_digest"] = batch_digest(self.order, self.step - 1, self.layout.global_batch)
        if self.peak:
            record["mfu"] = model_flops_utilization(
                self.model_config, active, tokens, masked, self.layout.global_batch, elapsed, self.peak, self.world
            )
        self.metrics.step(record)
        return record

    def _stop_diverged(self, problem: str) -> None:
        """A non-finite step: record it and stop every rank (they all see the same reduced values) unsaved."""
        latest = read_latest(self.ckpt_dir)
        self.metrics.event("diverged", step=self.step, problem=problem, latest=latest)
        raise TrainingDiverged(
            f"{problem} at step {self.step}: training stopped without saving; {self.ckpt_dir / LATEST} stays on "
            f"{latest or '(no checkpoint yet)'}, and nothing after a non-finite step is ever checkpointed. Lower "
            "optim.lr, check the data, or resume from an older checkpoint (rerunning resumes from latest and "
            "meets the same step again)"
        )

    # -------------------------------------------------------------------------------------- checkpoints
    def _save_for_preemption(self) -> int:
        signame = signal.Signals(self.preempt.signum).name if self.preempt.signum else "peer"
        self.metrics.write(f"preemption ({signame}): saving at step {self.step} and exiting with {EXIT_PREEMPTED}")
        self.save()
        self.metrics.event("preempted", step=self.step, signal=signame)
        return EXIT_PREEMPTED

    def save(self) -> None:
        """The commit protocol of pretrain.checkpoint: a leftover of the same tag removed, DeepSpeed files (every
        rank), client_state.json and export files (rank 0), checksums (every rank hashes its share, rank 0 writes),
        `latest`, pruning. A failed write on any rank stops every rank before `latest` moves (RunWriteError)."""
        tag = tag_for(self.step)
        if read_latest(self.ckpt_dir) == tag:
            self.last_saved = self.step  # committed already: never rewrite the files `latest` names
            return
        self._refuse_nonfinite_weights()
        t0 = time.perf_counter()
        if self.rank == 0:
            discard_uncommitted(self.ckpt_dir, tag)
        self.dist.barrier()
        problems = self._write_checkpoint(tag)
        removed: list[str] = []
        if not problems and self.rank == 0:
            problems, removed = self._commit(tag)
        problems = self._broadcast(problems)
        if problems:
            if self.rank == 0:
                discard_uncommitted(self.ckpt_dir, tag)  # free the space; never the tag `latest` names
            latest = read_latest(self.ckpt_dir)
            raise RunWriteError(
                f"checkpoint {self.ckpt_dir / tag} could not be written: {'; '.join(problems[:4])}. "
                f"{self.ckpt_dir / LATEST} stays on {latest or '(none)'}; free space or fix the filesystem, then "
                "rerun the same command to resume from it"
            )
        seconds = time.perf_counter() - t0
        memory = self._memory_summary()
        if self.rank == 0:
            n_files = len(self._checksums)
            self.metrics.event(
                "checkpoint", step=self.step, tag=tag, seconds=seconds, files=n_files, removed=removed, memory=memory
            )
        self.last_saved = self.step

    def _client_state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "consumed_samples": self.consumed,
            "group_cursor": self.step % len(self.groups),
            "config_hash": self.config_hash,
            "world_size": self.world,
            "zero_stage": self.zero_stage,
            "micro_batch": self.layout.micro_batch,
            "precision": self.precision,
        }

    def _write_checkpoint(self, tag: str) -> list[str]:
        """Every file of the checkpoint but `latest`; returns the write problems of all ranks (agreed)."""
        tag_dir = self.ckpt_dir / tag
        state = self._client_state()
        error = self._save_deepspeed_files(tag, state)
        if error is None and self.rank == 0:
            try:
                self._write_export_files(tag_dir / "export")
                full = {**state, "config": self.cfg.to_dict(), "time": time.time()}
                atomic_write_text(tag_dir / CLIENT_STATE, json.dumps(full, indent=2))
            except OSError as e:
                error = f"rank 0: {describe_write_error(e)}"
        self.dist.barrier()
        names = self._broadcast(list_files(tag_dir) if self.rank == 0 else None)
        entries: dict[str, Any] = {}
        if error is None:
            try:
                entries = hash_files(tag_dir, share_of(names, self.rank, self.world))
            except OSError as e:
                error = f"rank {self.rank}: hashing: {describe_write_error(e)}"
        gathered = self._all_gather((error, entries))
        self._checksums = {k: v for _, part in gathered for k, v in part.items()}
        return [e for e, _ in gathered if e]

    def _save_deepspeed_files(self, tag: str, state: dict[str, Any]) -> str | None:
        try:
            self.engine.save_checkpoint(str(self.ckpt_dir), tag=tag, client_state=dict(state), save_latest=False)
        except (OSError, RuntimeError) as e:
            if self.world > 1:
                self.dist.barrier()  # the barrier DeepSpeed's save ends with, which this rank skipped
            return f"rank {self.rank}: {describe_write_error(e)}"
        return None

    def _commit(self, tag: str) -> tuple[list[str], list[str]]:
        """Rank 0: checksums.json, then `latest`, then pruning; returns (problems, removed tags)."""
        try:
            write_checksums(self.ckpt_dir / tag, self._checksums)
            commit_latest(self.ckpt_dir, tag)
        except OSError as e:
            return [f"rank 0: {describe_write_error(e)}"], []
        return [], prune(self.ckpt_dir, self.cfg.checkpoint.keep_last)

    def _refuse_nonfinite_weights(self) -> None:
        """Never save NaN/inf weights (a corrupt optimizer state turns the weights non-finite one step before the
        loss shows it): every rank counts its own tensors (ZeRO-3: its partitions), the counts are summed."""
        params = [getattr(p, "ds_tensor", p) if self.zero_stage == 3 else p for p in self.engine.module.parameters()]
        bad = torch.tensor(
            [sum(1 for t in params if t.numel() and not bool(torch.isfinite(t).all()))],
            dtype=torch.float64,
            device=self.engine.device,
        )
        if self.world > 1:
            self.dist.all_reduce(bad)
        if bad.item():
            self._stop_diverged(f"{int(bad.item())} weight tensor(s) hold NaN/inf")

    def _write_export_files(self, out: Path) -> None:
        """What `export` needs besides the weights: the HF config and the tokenizer files."""
        out.mkdir(parents=True, exist_ok=True)
        self.model_config.to_json_file(str(out / "config.json"))
        tdir = self.data.tokenizer_dir
        if tdir is not None and tdir.is_dir():
            tok = out / "tokenizer"
            tok.mkdir(exist_ok=True)
            for f in tdir.iterdir():
                if f.is_file():
                    shutil.copy2(f, tok / f.name)

    def dump_weights(self, path: Path) -> None:
        """The in-memory weights, gathered from all ranks under ZeRO-3, as fp32 safetensors (rank 0 writes)."""
        from safetensors.torch import save_file

        params = list(self.engine.module.parameters())
        if self.zero_stage == 3:
            import deepspeed

            with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
                sd = {k: v.detach().float().clone() for k, v in self.engine.module.state_dict().items()}
        else:
            sd = {k: v.detach().float().clone() for k, v in self.engine.module.state_dict().items()}
        if self.rank == 0:
            with atomic_path(path) as tmp:
                save_file(sd, str(tmp))
        self.dist.barrier()

    # --------------------------------------------------------------------------------------------- eval
    def evaluate(self) -> dict[str, Any] | None:
        """All exits on a fixed slice of the held-out split: per-exit MLM loss/accuracy (token-weighted) and SOP
        loss/accuracy. Every rank runs the same number of micro-batches (ZeRO-3 gathers need everyone)."""
        micro = self.cfg.eval.micro_batch_size or self.layout.micro_batch
        mine = self._eval_keys(micro)
        if not mine:
            self.metrics.write("validation skipped: held-out split smaller than one batch per rank")
            return None
        exits = tuple(range(1, self.model_config.num_hidden_layers + 1))
        sums = self._eval_sums(mine, micro, exits).all_reduce(self.dist)
        record = {"step": self.step, "exits": list(exits), **sums.means()}
        self.metrics.eval(record)
        self.metrics.write(
            f"valid @ step {self.step}: MLM loss by exit "
            + " ".join(f"{x:.3f}" for x in record["mlm_loss"])
            + f"; SOP acc (top) {record['sop_accuracy'][-1]:.3f}"
        )
        return record

    def _eval_keys(self, micro: int) -> list[tuple[int, int]]:
        """This rank's share of the first `eval.max_samples` held-out samples, in whole batches on every rank."""
        keys = [(k, i) for k, d in enumerate(self.data.valid) for i in range(len(d))]
        n = min(len(keys), self.cfg.eval.max_samples) // (micro * self.world) * (micro * self.world)
        per_rank = n // self.world
        return keys[self.rank * per_rank : (self.rank + 1) * per_rank]

    def _eval_sums(self, keys: list[tuple[int, int]], micro: int, exits: tuple[int, ...]) -> EvalSums:
        sums = EvalSums.zeros(len(exits), self.engine.device)
        pad = int(self.data.special_ids.get("pad", 0))
        was_training = self.engine.module.training
        self.engine.eval()
        with torch.no_grad():
            for start in range(0, len(keys), micro):
                items = [self.data.valid[k][i] for k, i in keys[start : start + micro]]
                batch = {name: t.to(self.engine.device) for name, t in collate(items, pad).items()}
                out = self.engine(**batch, active_exits=exits, gradient_equilibrium=False)
                sums.add_batch(out, batch)
        if was_training:
            self.engine.train()
        return sums


def train(
    cfg: RunConfig,
    run_dir: Path,
    ds_config_path: str | None = None,
    force_resume: bool = False,
    verify_checksums: bool = True,
) -> int:
    """Entry point used by the CLI: returns the exit code."""
    return Trainer(cfg, run_dir, ds_config_path, force_resume, verify_checksums).run()
