"""The trainer's start-up phases, before its loop (`pretrain.trainer`) runs.

Order of work: everything that can fail on bad input (config, DeepSpeed JSON, run directory, data, checkpoint
compatibility) is checked before the process group exists (`TrainerStartup.__init__`), so a mistake costs seconds
and prints one clear message instead of a hung or half-started job; then, with the process group (`_setup`): the
model, the DeepSpeed engine (resumed from the checkpoint if any), the data loader and the loggers; last, the run's
first lines and its `start` event with every rank's start-up phases and memory (`_announce`).
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from common.deepspeed_import import import_deepspeed, quiet_deepspeed
from common.dist import DistEnv, resolve_env
from common.run_dir import RunLock, prepare_run_dir, release_inherited_locks

from .checkpoint import check_resume_data, data_changes
from .checkpointer import Checkpointer
from .collation import Collator
from .config import RunConfig, validate, write_resolved_configs
from .corpora import open_data
from .data import RankBatches, SampleOrder, batch_digests, train_loader
from .ds_config import fill_ds_config, load_ds_json
from .ds_runtime import set_op_build_arch
from .guards import refuse_stale_build_locks
from .metrics import MetricsLogger
from .mfu import peak_flops
from .model_setup import build_model, init_source, param_groups
from .precision import DeviceCaps, choose_precision, describe_precision, precision_of
from .preemption import PreemptionFlag, ignore_preemption_signals
from .rank_report import CommTimer, StartupClock, gather_startup, host_memory_mb, summarize_memory
from .stats import Group


def _worker_init(worker_id: int) -> None:
    """DataLoader workers: survive the preemption signals, and do not hold the run directory's lock."""
    ignore_preemption_signals(worker_id)
    release_inherited_locks()


class TrainerStartup:
    """The state the loop runs on, built in phases: checks without a process group (`__init__`), set-up with one
    (`_setup`), the announcement (`_announce`). `pretrain.trainer.Trainer` adds the loop."""

    def __init__(
        self,
        cfg: RunConfig,
        run_dir: Path,
        ds_config_path: str | None,
        force_resume: bool,
        verify_checksums: bool = True,
        resume_on_new_data: bool = False,
    ) -> None:
        """Every check that needs no process group: config, DeepSpeed JSON, run directory and its lock, data,
        checkpoint (compatibility, the data it was trained on, this rank's share of its files)."""
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
            self._check_inputs(force_resume or cfg.checkpoint.force_resume, resume_on_new_data)
        except BaseException:
            self.lock.release()
            raise

    def _check_inputs(self, force_resume: bool, resume_on_new_data: bool) -> None:
        """Data, then the checkpoint to resume from (its config, then its data: `_check_resume_data`), then the
        resolved configs, written once everything passed."""
        cfg = self.cfg
        if cfg.model.init_from is not None:
            init_source(cfg.model.init_from)  # a hub name not in the cache fails here, before the process group
        self.data = open_data(cfg, self.run_dir, need_valid=cfg.eval.interval > 0)
        self.clock.mark("data_ready")
        self.groups = cfg.exit_groups()
        self.end_step = cfg.train.end_step()
        self.config_hash = cfg.semantic_hash()
        self.point = self.checkpoints.find(self.config_hash, cfg.to_dict(), force_resume)
        self._check_resume_data(resume_on_new_data or cfg.checkpoint.resume_on_new_data)
        if self.rank == 0:
            write_resolved_configs(self.run_dir, cfg, self.ds_cfg)

    def _check_resume_data(self, accept_new: bool) -> None:
        """The corpora are the data the checkpoint was trained on (`check_resume_data`), or, accepted, new data: the
        sample order then starts over on it at the resume point (`data_start`, in samples, recorded by every later
        checkpoint with the history of such changes, `data_changes`)."""
        self.data_start, self.data_history, self.new_data = 0, [], []
        if self.point is None:
            return
        state = self.point.state
        self.data_start = int(state.get("data_start_samples", 0))
        self.data_history = list(state.get("data_changes", []))
        if data_changes(self.point, self.data.fingerprints) is None:
            self.data.notes.append(
                f"checkpoint {self.point.tag} records no corpus fingerprints (written before they were): the data it "
                "was trained on is not compared with this run's"
            )
            return
        self.new_data = check_resume_data(self.point, self.data.fingerprints, accept_new)
        if self.new_data:
            self.data_start = self.point.consumed_samples
            change = {"step": self.point.step, "consumed_samples": self.data_start, "corpora": self.new_data}
            self.data_history.append(change)

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
        on_data = self.consumed - self.data_start  # samples read of these corpora: the order's position
        batches = RankBatches(self.order, on_data, lay.global_batch, lay.micro_batch, self.rank, self.world)
        pad_id = int(self.data.special_ids.get("pad", 0))  # compiled: every batch at max_length (one static shape)
        self.collator = Collator(pad_id, d.max_length if self.cfg.train.compile else 8, d.packing, d.max_length)
        self.loader = train_loader(self.data.train, batches, self.collator, d.num_workers, _worker_init)
        lg = self.cfg.logging
        self.metrics = MetricsLogger(
            self.run_dir, self.rank == 0, lg.tensorboard, lg.progress, self.end_step, self.step, lg.tb_interval
        )
        first = self.data_start // lay.global_batch  # the step the order started at (0 unless the data changed)
        self.metrics.digests = lambda steps: batch_digests(
            self.order, range(steps.start - first, steps.stop - first), lay.global_batch
        )
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
            lines += [
                f"  resuming on new data (--resume-on-new-data): data.corpora[{c['corpus']}] ({c['path']}) fingerprint "
                f"{(c['before'] or {}).get('fingerprint')} -> {c['now']['fingerprint']}; the sample order starts over "
                f"at step {self.step}"
                for c in self.new_data
            ]
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
            corpora=self.data.fingerprints,
            data_start_samples=self.data_start,
            new_data=self.new_data,
            startup=startup,
            memory=self._memory_summary(),
        )

    def _memory_summary(self) -> dict[str, Any]:
        """Peak host memory over the ranks (every rank calls this: it is a collective)."""
        return summarize_memory(self.group.all_gather(host_memory_mb()), self.hosts)
