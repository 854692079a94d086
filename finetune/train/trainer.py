"""The fine-tuning loop: phases (methods.py) × objectives (objectives.py) × ACL-Grad (acl_grad.py).

A train step, top-down: forward the exits this step needs → per-exit loss terms → (gated) backward → optimizer step.
Dev evaluation scores every exit; the best state of each phase (mean main metric over the exits the phase trains) is
kept in memory, restored at the end of the phase (so 2ST's stage 2 starts from the best stage 1) and written to
RUN_DIR/best at the end. Early stopping (`early_stopping_patience` = N): a phase ends after N evaluations in a row
without a better selection score (the official ElasticBERT `--early_stop_steps`); its best weights are kept.

Run directory: best/ (model + tokenizer, `save_pretrained`), run_config.json, dev_scores.json (per-exit dev scores of
the best checkpoint + history), layer_curve.png, tensorboard/ (events), acl_diagnostics.json (when a contrastive
objective runs). `best/` and then `dev_scores.json` are written last, each atomically: a run killed before that leaves
neither (see `run_dir.py` for what a new run does with such a directory, or with a finished or running run).

Preemption (`common.preemption`): SIGTERM / SIGUSR1 set a flag; before each optimizer step the ranks agree on it, and
a signalled run saves a resume checkpoint (checkpoint.py: weights, optimizer, schedule, random states, dev history,
the phase's best) and exits 75; the same command resumes it and ends with the same weights and scores, bit for bit.
A signal after the last step lets the run finish writing its results instead (less work than a checkpoint): exit 0.

`Trainer` is the loop, read top-down; the components it calls live beside it: phases.py (a phase's length, batches
and frozen modules), dev_eval.py (dev bookkeeping: best, history, early stopping), metrics.py (TensorBoard, ACL
angles), resume.py (when to save and where a resumed run continues; the files: checkpoint.py) and run_dir.py.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from tqdm.auto import tqdm

from common.config import warmup_for
from common.dist import resolve_env, stop_with_launcher
from common.ds_config import load_ds_json
from common.errors import ConfigError
from common.hub import resolve_pretrained
from common.integrity import seal
from common.io import atomic_path, atomic_write_json
from common.preemption import PreemptionFlag
from common.run_dir import RunWriteError
from elasticbert import ElasticBertForSequenceClassification, LoadReport

from ..config import DataConfig, FinetuneConfig, save_run_config
from ..data import UNK_SAMPLE, EncodedSplit, check_vocabulary_fits, load_tokenizer, subsample, unk_counts, unk_refusal
from ..model import build_model, freshly_initialised_exits, model_device, resolve_device, set_frozen
from ..plots import plot_layer_curve
from ..results import with_data_files
from ..score.evaluation import per_exit_scores, predict_exits
from ..tasks import Example, TaskSpec, get_task, load_split
from .acl_grad import gated_backward
from .checkpoint import (
    Ranks,
    ResumePoint,
    Snapshot,
    check_resume_point,
    find_resume_point,
    finish,
    load_best,
    load_training_state,
    load_weights,
    state_json,
)
from .dev_eval import DevTracker, EvalResult
from .methods import Phase, build_optimizer, build_phases, deepspeed_engine, linear_schedule
from .methods import ds_config as finetune_ds_config
from .metrics import TrainMetrics
from .objectives import ExitOutputs, exit_terms
from .phases import frozen_modules, phase_batches, phase_steps, train_mode
from .resume import Resumption
from .run_dir import check_run_dir, claim_run_dir


def set_seed(seed: int) -> None:
    """Seed Python, NumPy and torch: fresh exit heads, dropout and the data order follow from `--seed`."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def forward_exits(
    model: ElasticBertForSequenceClassification,
    batch: dict[str, torch.Tensor],
    exits: tuple[int, ...],
    phase: Phase,
    gradient_equilibrium: bool = False,
) -> ExitOutputs:
    """(h^e, logits) of each exit in `exits`; a frozen backbone (and teacher) runs without building a graph."""
    grad = torch.is_grad_enabled()
    with torch.set_grad_enabled(grad and not phase.freeze_backbone):
        encoded = model.elasticbert(
            batch["input_ids"],
            attention_mask=batch["attention_mask"],
            token_type_ids=batch["token_type_ids"],
            exit_layers=exits,
            gradient_equilibrium=gradient_equilibrium and not phase.freeze_backbone and len(exits) > 1,
        )
    outputs: ExitOutputs = {}
    for layer, hidden in zip(encoded.exit_layers, encoded.exit_hidden_states):
        frozen = phase.freeze_backbone and layer == phase.teacher
        with torch.set_grad_enabled(grad and not frozen):
            outputs[layer] = model.classify(layer, hidden, batch["attention_mask"])
    return outputs


@dataclass
class RunRecord:
    """What run_config.json says besides the config: the source of every value, the paths names resolved to."""

    sources: dict[str, str]
    resolved: dict[str, str]


class Trainer:
    """Runs every phase of a method on one task and writes the run directory."""

    def __init__(
        self,
        cfg: FinetuneConfig,
        task: TaskSpec,
        model: ElasticBertForSequenceClassification,
        tokenizer: object,
        train: list[Example],
        dev: list[Example],
        run_dir: Path,
        record: RunRecord | None = None,
        preempt: PreemptionFlag | None = None,
        resume: ResumePoint | None = None,
    ) -> None:
        """`preempt`: the installed signal flag (`run_training`'s; a trainer built without one never stops early);
        `resume`: the checked resume checkpoint to continue from."""
        self.cfg, self.task, self.model, self.tokenizer = cfg, task, model, tokenizer
        self.train_examples, self.dev_examples = train, dev
        self.run_dir, self.record = run_dir, record or RunRecord({}, {})
        env = resolve_env(export=False)
        self.rank, self.world = env.rank, env.world_size
        self.resumption = Resumption(run_dir, Ranks(self.rank, self.world), preempt or PreemptionFlag(), resume)
        self.dev = DevTracker(task, cfg.train.early_stopping_patience, self.rank)
        self.metrics = TrainMetrics()
        self.global_step = 0
        self.engine = None

    # ------------------------------------------------------------------------------------------------ top level
    def fit(self) -> dict:
        """Train all phases; returns the summary that dev_scores.json holds."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.rank == 0:
            self.metrics.open(self.run_dir)
            save_run_config(self.run_dir / "run_config.json", self.cfg, self.record.sources, **self.record.resolved)
        self.started = time.time()
        phases = build_phases(self.cfg.method.name, list(self.model.exit_layers))
        try:
            for index, phase in enumerate(phases):
                if index >= self.resumption.first_phase:  # earlier phases are in the resume checkpoint's weights
                    self.run_phase(phase, index)
        except BaseException:  # preempted (or interrupted): the events so far reach the disk
            self.metrics.close()
            raise
        # What `load_finetuned` reads to tell trained exits from random ones.
        self.model.config.trained_exits = sorted({layer for phase in phases for layer in phase.trained_exits})
        summary = self.summary(self.elapsed())
        if self.rank == 0:
            self.save(summary)
            finish(self.run_dir)  # the results are committed: the resume checkpoint has nothing left to give
        self.metrics.close()
        return summary

    def elapsed(self) -> float:
        """Seconds of training, over every start of a resumed run."""
        return self.resumption.seconds_before + time.time() - self.started

    def run_phase(self, phase: Phase, index: int = 0) -> None:
        """Train one phase (the `index`-th of the method), evaluating every `eval_every` steps (default: every
        epoch) and at its end; before each step, a preemption signal saves the run and stops it (`Preempted`)."""
        total, steps_per_epoch = phase_steps(self.cfg, phase, len(self.train_examples), self.world)
        optimizer, scheduler = self.start_phase(phase, total)
        start = self.restore(optimizer, scheduler) if self.resumption.resumes(index) else 0
        eval_every = self.cfg.train.eval_every or steps_per_epoch
        bar = tqdm(
            total=total,
            initial=start,
            desc=f"{self.task.name} {phase.name}",
            disable=not self.cfg.train.progress or self.rank,
        )
        shard = (self.rank, self.world)
        for step, batch in enumerate(
            phase_batches(self.cfg, self.tokenizer, self.train_examples, shard, total, start), start=start + 1
        ):
            self.preemption_point(phase, index, step - 1, total, optimizer, scheduler)
            device = model_device(self.model)  # read each step: a DeepSpeed engine places the model itself
            batch = {key: value.to(device) for key, value in batch.items()}
            stats = self.train_step(phase, step, batch, optimizer, scheduler)
            bar.update(1)
            bar.set_postfix(loss=f"{stats['loss']:.4f}")
            if step % eval_every == 0 or step == total:
                self.evaluate(phase, step)
                train_mode(self.model, phase)
                if self.dev.should_stop(phase, step, total):
                    break
        bar.close()
        self.end_phase(phase)

    def start_phase(self, phase: Phase, total: int) -> tuple[torch.optim.Optimizer, object]:
        """Freeze what the phase freezes, then a fresh optimizer and schedule over what stays trainable."""
        set_frozen(frozen_modules(self.model, phase), True)
        optimizer = build_optimizer(self.model, self.cfg)
        o = self.cfg.optim
        scheduler = linear_schedule(optimizer, total, warmup_for(o.warmup_steps, o.warmup_fraction, total))
        if self.cfg.train.ds_config:
            self.engine, optimizer, scheduler = deepspeed_engine(self.model, optimizer, scheduler, self.cfg)
        self.dev.start_phase()
        train_mode(self.model, phase)
        return optimizer, scheduler

    def end_phase(self, phase: Phase) -> None:
        """Restore the phase's best weights (2ST's stage 2 starts from the best stage 1) and unfreeze."""
        if self.dev.best is not None:
            self.model.load_state_dict(self.dev.best_state)
        set_frozen(frozen_modules(self.model, phase), False)
        self.engine = None

    def train_step(
        self,
        phase: Phase,
        step: int,
        batch: dict[str, torch.Tensor],
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
    ) -> dict:
        """One optimizer step: forward → per-exit terms → (ACL-Grad) backward → clip → update."""
        cfg = self.cfg
        self.global_step += 1
        outputs = forward_exits(self.model, batch, phase.forward_exits(step), phase, cfg.method.gradient_equilibrium)
        terms = exit_terms(self.model, cfg, phase, step, outputs, batch["labels"])
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        loss, record = gated_backward(
            terms,
            cfg.objective.lam if cfg.objective.name != "ce" else 0.0,
            backward=self.engine.backward if self.engine else torch.Tensor.backward,
            enabled=cfg.objective.acl_grad,
            scope=cfg.objective.acl_grad_scope,
            threshold=cfg.objective.acl_grad_threshold,
            granularity=cfg.objective.acl_grad_granularity,
            measure=cfg.objective.log_angles,
            trainable=trainable,
            assign_grads=self.engine is None,
        )
        if self.engine is not None:
            self.engine.step()
        else:
            if cfg.optim.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(trainable, cfg.optim.grad_clip)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
        stats = {"loss": float(loss), "lr": scheduler.get_last_lr()[0]}
        self.metrics.log_step(phase, step, self.global_step, terms, record, stats)
        return stats

    def evaluate(self, phase: Phase, step: int) -> EvalResult:
        """Score every exit on the dev set; the tracker keeps the phase's best (and says when to stop)."""
        logits, labels = predict_exits(
            self.model, self.tokenizer, self.dev_examples, self.cfg.train.eval_batch_size, self.cfg.data.max_length
        )
        scores = per_exit_scores(self.task, logits, labels)
        result = self.dev.record(phase, step, self.global_step, scores, self.model)
        self.metrics.log_dev(phase, scores, result.selection, self.global_step)
        return result

    # ------------------------------------------------------------------------------------ preemption and resume
    def preemption_point(
        self,
        phase: Phase,
        index: int,
        done: int,
        total: int,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
    ) -> None:
        """A step boundary (`done` steps of the phase behind): when any rank was signalled, every rank saves the
        run (unless the newest resume checkpoint holds this very position) and raises `Preempted`."""

        def snapshot(tag: str) -> Snapshot:
            snap = Snapshot(tag, self.resume_state(phase, index, done, total), self.model.state_dict(), None, None)
            snap.best = self.dev.best_state if self.dev.best is not None else None
            if self.engine is not None:
                snap.engine = self.engine
            else:
                snap.trainer = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
            return snap

        device = model_device(self.model)
        self.resumption.stop_if_signalled(device, phase.name, done, total, self.global_step > 0, snapshot)

    def resume_state(self, phase: Phase, index: int, done: int, total: int) -> dict:
        """state.json of a resume checkpoint: the position, the config it must resume under, the bookkeeping."""
        dev = self.dev.state()
        return state_json(
            config=self.cfg.to_dict(),
            world_size=self.world,
            phase=phase.name,
            phase_index=index,
            step=done,
            phase_steps=total,
            signal=self.resumption.preempt.name,
            seconds=self.elapsed(),
            global_step=self.global_step,
            history=dev.pop("history"),
            angles=self.metrics.angles,
            **dev,
        )

    def restore(self, optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler) -> int:
        """Continue the resumed phase where the checkpoint left it (after `start_phase` built its optimizer);
        returns the phase's steps done."""
        point = self.resumption.resume
        state = point.state
        load_weights(point, self.model)
        self.global_step = state["global_step"]
        self.metrics.angles = state["angles"]
        self.dev.load_state(state, load_best(point) if state["best"] is not None else None)
        load_training_state(point, optimizer, scheduler, self.engine, self.rank)  # random states last
        return int(state["step"])

    # ----------------------------------------------------------------------------------------------- results
    def summary(self, seconds: float) -> dict:
        return {
            "task": self.task.name,
            "main_metric": self.task.main_metric,
            "method": self.cfg.method.name,
            "exit_type": self.cfg.model.exit_type,
            "objective": self.cfg.objective.name,
            "exit_layers": list(self.model.exit_layers),
            "train_examples": len(self.train_examples),
            "dev_examples": len(self.dev_examples),
            "seconds": round(seconds, 1),
            "best": self.dev.best_json(),
            "trained_exits": getattr(self.model.config, "trained_exits", None),
            "stopped_early": self.dev.stopped_early,
            "history": self.dev.history,
        }

    def save(self, summary: dict) -> None:
        """best/ (model + tokenizer, swapped in whole), dev_scores.json, the layer curve, acl_diagnostics.json."""
        try:
            with atomic_path(self.run_dir / "best") as best_dir:
                self.model.save_pretrained(best_dir)
                self.tokenizer.save_pretrained(best_dir)
                seal(best_dir)  # checked whenever the model is loaded (evaluate, predict, early exit)
            atomic_write_json(self.run_dir / "dev_scores.json", with_data_files(summary, self.task, self.cfg.data.dir))
        except (OSError, SafetensorError) as err:  # the temporaries are gone: nothing that looks complete
            reason = getattr(err, "strerror", None) or err
            raise RunWriteError(
                f"{self.run_dir}: cannot write the run's results ({reason}); nothing half-written was "
                "kept. Free space (or fix the filesystem) and rerun the same command"
            ) from err
        if summary["best"]["exits"]:
            scores = {int(k): v for k, v in summary["best"]["exits"].items()}
            plot_layer_curve(self.task, scores, self.run_dir / "layer_curve.png", title=self.run_dir.name)
        if self.metrics.angles:
            atomic_write_json(
                self.run_dir / "acl_diagnostics.json", self.metrics.angle_summary(self.cfg.objective), indent=1
            )


def run_training(
    cfg: FinetuneConfig, output: str | Path, overwrite: bool = False, sources: Mapping[str, str] | None = None
) -> dict:
    """Everything `finetune train` does: validate, check the run directory `output` (a finished run there is replaced
    only with `overwrite`; a preempted one is resumed, or started over with `overwrite`), load model, tokenizer and
    data, train, write the run directory (locked while the run lasts; `sources`: where each config value came from,
    saved in run_config.json). From the first line on, SIGTERM / SIGUSR1 mean "save at the next step boundary and
    raise `Preempted`" (exit 75)."""
    with PreemptionFlag() as preempt:
        stop_with_launcher(resolve_env(export=False))  # a killed torchrun: its workers save and stop, like Slurm's
        summary = _run_training(cfg, Path(output), overwrite, sources, preempt)
    if preempt.requested and resolve_env(export=False).rank == 0:
        print(
            f"finetune: {preempt.name} arrived after the last training step: the run finished writing its results "
            f"in {output} instead of saving a resume checkpoint (nothing to resume)",
            file=sys.stderr,
            flush=True,
        )
    return summary


def _run_training(
    cfg: FinetuneConfig,
    run_dir: Path,
    overwrite: bool,
    sources: Mapping[str, str] | None,
    preempt: PreemptionFlag,
) -> dict:
    task = get_task(cfg.data.task)
    cfg.validate(task.num_labels)
    env = resolve_env(export=False)
    if cfg.train.ds_config:  # refused before anything loads: a missing file, or a value the run config disagrees with
        finetune_ds_config(load_ds_json(cfg.train.ds_config), cfg, env.world_size)
    refuse_ranks_without_deepspeed(env.world_size, env.launcher, cfg.train.ds_config)
    device = resolve_device(cfg.train.device, env.local_rank)  # no GPU for `--device cuda`: refused before loading
    rank0 = env.rank == 0
    if rank0:
        check_run_dir(run_dir, overwrite)  # before anything is loaded
    resume = None if overwrite else find_resume_point(run_dir)
    if resume is not None:  # another config, another world size, damaged files: refused before anything loads
        check_resume_point(resume, cfg.to_dict(), env.world_size)
    set_seed(cfg.train.seed)  # fresh exit heads are initialised from it
    model, report = build_model(cfg, task)  # first: checkpoint problems surface before data is read
    model.to(device)
    if rank0:
        print(load_summary(report), file=sys.stderr, flush=True)
    tokenizer = cfg.model.tokenizer
    tokenizer_dir = resolve_pretrained(tokenizer, what="--tokenizer") if tokenizer else Path(report.source)
    tokenizer = load_tokenizer(tokenizer_dir, type_vocab_size=model.config.type_vocab_size)
    train = subsample(load_split(task, cfg.data.dir, "train"), cfg.data.max_train_examples, cfg.train.seed)
    dev = subsample(load_split(task, cfg.data.dir, "dev"), cfg.data.max_dev_examples, cfg.data.dev_subset_seed)
    check_tokenizer_fits(tokenizer, model.config.vocab_size, tokenizer_dir, train, cfg.data)
    record = RunRecord(
        dict(sources or {}),
        {
            "model_path": str(report.source),
            "tokenizer_path": str(tokenizer_dir),
            "tokenizer_identity": model.config.tokenizer_identity,
        },
    )
    set_seed(cfg.train.seed)
    trainer = Trainer(cfg, task, model, tokenizer, train, dev, run_dir, record, preempt, resume)
    if not rank0:
        summary = trainer.fit()
    else:
        with claim_run_dir(run_dir, overwrite, resume):
            summary = trainer.fit()
    summary["load_report"] = str(report)
    return summary


def refuse_ranks_without_deepspeed(world_size: int, launcher: str, ds_config: str | None) -> None:
    """Several processes train one model only through DeepSpeed (it averages their gradients); without it each would
    train its own model on its share of the data, and rank 0's would be saved as the run's result."""
    if world_size > 1 and not ds_config:
        raise ConfigError(
            f"{world_size} processes ({launcher}) but no --ds-config: without DeepSpeed they would train "
            f"{world_size} separate models on {world_size} shards of the data; pass --ds-config FILE (a DeepSpeed "
            "JSON, ZeRO 0-2) or run one process"
        )


def check_tokenizer_fits(
    tokenizer: object, vocab_size: int, source: Path, train: list[Example], data: DataConfig
) -> None:
    """A tokenizer of another vocabulary is refused before training (it used to train to the end on 72 % [UNK]):
    its size against the model's embeddings, and the [UNK] share of the first training examples."""
    check_vocabulary_fits(tokenizer, vocab_size, source)
    sample = EncodedSplit.from_examples(tokenizer, train[:UNK_SAMPLE], data.max_length)
    what = f"the first {len(sample):,} training examples"
    refusal = unk_refusal(*unk_counts(tokenizer, sample.input_ids), data.max_unk_fraction, what, source)
    if refusal is not None:
        raise refusal


def load_summary(report: LoadReport) -> str:
    """One line on what the checkpoint gave: tensors loaded, and the exits this run trains from random weights."""
    fresh = freshly_initialised_exits(report)
    exits = f"; exits {fresh} start from random weights (trained by this run)" if fresh else ""
    return f"model {report.source} ({report.layout} layout): {len(report.mapped)} tensors loaded{exits}"
