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
"""

from __future__ import annotations

import math
import random
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from tqdm.auto import tqdm

from common.dist import resolve_env
from common.errors import ConfigError
from common.hub import resolve_pretrained
from common.integrity import seal
from common.io import atomic_path, atomic_write_json, read_object
from common.run_dir import RunWriteError
from elasticbert import ElasticBertForSequenceClassification, LoadReport

from .acl_grad import AngleRecord, ExitTerms, gated_backward
from .config import DataConfig, FinetuneConfig, save_run_config
from .data import (
    UNK_SAMPLE,
    EncodedSplit,
    check_vocabulary_fits,
    iterate_batches,
    load_tokenizer,
    subsample,
    unk_counts,
    unk_refusal,
)
from .evaluation import per_exit_scores, predict_exits
from .methods import Phase, build_phases, exit_weights
from .model import (
    backbone_modules,
    build_model,
    exit_modules,
    exit_parameters,
    freshly_initialised_exits,
    label_embeddings,
    model_device,
    resolve_device,
    set_frozen,
)
from .objectives import acl_cl_loss, acl_embed_loss, kd_loss, scl_loss, task_loss
from .plots import plot_layer_curve
from .run_dir import check_run_dir, claim_run_dir
from .tasks import Example, TaskSpec, get_task, load_split

ExitOutputs = dict[int, tuple[torch.Tensor, torch.Tensor]]  # layer -> (representation h^e, logits)


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


def exit_terms(
    model: ElasticBertForSequenceClassification,
    cfg: FinetuneConfig,
    phase: Phase,
    step: int,
    outputs: ExitOutputs,
    labels: torch.Tensor,
) -> list[ExitTerms]:
    """Each trained exit's task term ((1−β)·CE + β·KD for students) and contrastive term (per `cfg.objective`)."""
    obj = cfg.objective
    exits = phase.exits_at(step)
    weights = exit_weights(exits, cfg.method.jt_weights)
    kd_weight = obj.kd_weight if obj.kd_weight is not None else (0.5 if phase.freeze_backbone else 0.0)
    teacher = phase.teacher
    terms = []
    for layer in exits:
        rep, logits = outputs[layer]
        task = task_loss(logits, labels)
        student = teacher is not None and layer != teacher
        if student and kd_weight > 0:
            task = (1.0 - kd_weight) * task + kd_weight * kd_loss(logits, outputs[teacher][1], obj.kd_temperature)
        contrastive = None
        if obj.name == "ce+scl":
            contrastive = scl_loss(rep, labels, obj.tau, obj.contrastive_reduction)
        elif obj.name == "acl" or (obj.name == "acl-cl" and not student):
            embeddings = label_embeddings(model, layer)
            contrastive = acl_embed_loss(rep, labels, embeddings, obj.tau, obj.contrastive_reduction)
        elif obj.name == "acl-cl":
            contrastive = acl_cl_loss(
                rep,
                labels,
                label_embeddings(model, layer),
                outputs[teacher][0],
                label_embeddings(model, teacher),
                obj.tau,
                obj.contrastive_reduction,
            )
        terms.append(ExitTerms(layer, weights[layer], task, contrastive, rep, exit_parameters(model, layer)))
    return terms


def linear_schedule(optimizer: torch.optim.Optimizer, total: int, warmup: float) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup over `warmup`·total steps, then linear decay to 0 (BERT's schedule)."""
    warm = int(round(warmup * total))

    def factor(step: int) -> float:
        if warm and step < warm:
            return (step + 1) / warm
        return max(0.0, (total - step) / max(1, total - warm))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def build_optimizer(model: ElasticBertForSequenceClassification, cfg: FinetuneConfig) -> torch.optim.AdamW:
    """AdamW over the trainable parameters; no weight decay on biases and LayerNorm; exits may get `exit_lr`."""
    head_ids = {id(p) for layer in model.exit_layers for p in exit_parameters(model, layer)}
    groups: dict[tuple[bool, bool], list[torch.nn.Parameter]] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        no_decay = param.ndim < 2 or "LayerNorm" in name
        groups.setdefault((id(param) in head_ids, no_decay), []).append(param)
    param_groups = [
        {
            "params": params,
            "weight_decay": 0.0 if no_decay else cfg.optim.weight_decay,
            "lr": (cfg.optim.exit_lr if cfg.optim.exit_lr is not None else cfg.optim.lr) if is_head else cfg.optim.lr,
        }
        for (is_head, no_decay), params in groups.items()
    ]
    return torch.optim.AdamW(param_groups, lr=cfg.optim.lr)


@dataclass
class EvalResult:
    step: int
    scores: dict[int, dict[str, float]]
    selection: float


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
    ) -> None:
        self.cfg, self.task, self.model, self.tokenizer = cfg, task, model, tokenizer
        self.train_examples, self.dev_examples = train, dev
        self.run_dir, self.record = run_dir, record or RunRecord({}, {})
        env = resolve_env(export=False)
        self.rank, self.world = env.rank, env.world_size
        self.global_step = 0
        self.history: list[dict] = []
        self.angles: list[dict] = []
        self.best: EvalResult | None = None
        self.evals_without_improvement = 0
        self.stopped_early: list[dict] = []
        self.writer = None
        self.engine = None

    # ------------------------------------------------------------------------------------------------ top level
    def fit(self) -> dict:
        """Train all phases; returns the summary that dev_scores.json holds."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.rank == 0:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.run_dir / "tensorboard"))
            save_run_config(self.run_dir / "run_config.json", self.cfg, self.record.sources, **self.record.resolved)
        start = time.time()
        phases = build_phases(self.cfg.method.name, list(self.model.exit_layers))
        for phase in phases:
            self.run_phase(phase)
        # What `load_finetuned` reads to tell trained exits from random ones.
        self.model.config.trained_exits = sorted({layer for phase in phases for layer in phase.trained_exits})
        summary = self.summary(time.time() - start)
        if self.rank == 0:
            self.save(summary)
        if self.writer is not None:
            self.writer.close()
        return summary

    def run_phase(self, phase: Phase) -> None:
        """Train one phase, evaluating every `eval_every` steps (default: every epoch) and at its end."""
        total, steps_per_epoch = self.phase_steps(phase)
        optimizer, scheduler = self.start_phase(phase, total)
        eval_every = self.cfg.train.eval_every or steps_per_epoch
        bar = tqdm(total=total, desc=f"{self.task.name} {phase.name}", disable=not self.cfg.train.progress or self.rank)
        for step, batch in enumerate(self.batches(total), start=1):
            device = model_device(self.model)  # read each step: a DeepSpeed engine places the model itself
            batch = {key: value.to(device) for key, value in batch.items()}
            stats = self.train_step(phase, step, batch, optimizer, scheduler)
            bar.update(1)
            bar.set_postfix(loss=f"{stats['loss']:.4f}")
            if step % eval_every == 0 or step == total:
                self.evaluate(phase, step)
                self.train_mode(phase)
                if self.should_stop(phase, step, total):
                    break
        bar.close()
        self.end_phase(phase)

    def should_stop(self, phase: Phase, step: int, total: int) -> bool:
        """Early stopping: `early_stopping_patience` evaluations in a row without a better selection score."""
        patience = self.cfg.train.early_stopping_patience
        if patience is None or step == total or self.evals_without_improvement < patience:
            return False
        record = {"phase": phase.name, "step": step, "of": total, "patience": patience, "best_step": self.best.step}
        self.stopped_early.append(record)
        if self.rank == 0:
            print(
                f"{self.task.name} {phase.name}: stopped early at step {step}/{total}: {patience} evaluations "
                f"without a better dev score (best at step {self.best.step})",
                file=sys.stderr,
                flush=True,
            )
        return True

    def phase_steps(self, phase: Phase) -> tuple[int, int]:
        """(optimizer steps of the phase, steps per epoch)."""
        cfg = self.cfg
        steps_per_epoch = max(1, math.ceil(len(self.train_examples) / (cfg.train.batch_size * self.world)))
        epochs = cfg.value(phase.epochs_key)
        epochs = cfg.train.epochs if epochs is None else epochs
        return cfg.train.max_steps or max(1, int(math.ceil(epochs * steps_per_epoch))), steps_per_epoch

    def start_phase(self, phase: Phase, total: int) -> tuple[torch.optim.Optimizer, object]:
        """Freeze what the phase freezes, then a fresh optimizer and schedule over what stays trainable."""
        set_frozen(self.frozen_modules(phase), True)
        optimizer = build_optimizer(self.model, self.cfg)
        scheduler = linear_schedule(optimizer, total, self.cfg.optim.warmup)
        if self.cfg.train.ds_config:
            self.engine, optimizer, scheduler = self._deepspeed(optimizer, scheduler)
        self.best = None
        self.evals_without_improvement = 0
        self.train_mode(phase)
        return optimizer, scheduler

    def end_phase(self, phase: Phase) -> None:
        """Restore the phase's best weights (2ST's stage 2 starts from the best stage 1) and unfreeze."""
        if self.best is not None:
            self.model.load_state_dict(self.best_state)
        set_frozen(self.frozen_modules(phase), False)
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
        self.log_step(phase, step, terms, record, stats)
        return stats

    # ------------------------------------------------------------------------------------------------- helpers
    def batches(self, total: int) -> Iterator[dict[str, torch.Tensor]]:
        """`total` training batches: seeded reshuffle each epoch; rank r of R takes every R-th batch."""
        cfg, epoch, produced = self.cfg, 0, 0
        while True:
            stream = iterate_batches(
                self.tokenizer,
                self.train_examples,
                cfg.train.batch_size,
                cfg.data.max_length,
                shuffle=True,
                seed=cfg.train.seed * 1000 + epoch,
                shard=(self.rank, self.world),
            )
            for batch in stream:
                yield batch
                produced += 1
                if produced == total:
                    return
            epoch += 1

    def train_mode(self, phase: Phase) -> None:
        """Training mode, except frozen modules (2ST stage 2's backbone and teacher), which stay in eval mode."""
        self.model.train()
        for module in self.frozen_modules(phase):
            module.eval()

    def frozen_modules(self, phase: Phase) -> list[torch.nn.Module]:
        """2ST stage 2 freezes the backbone and the teacher (last) exit; other phases freeze nothing."""
        if not phase.freeze_backbone or phase.teacher is None:
            return []
        return backbone_modules(self.model) + exit_modules(self.model, phase.teacher)

    def evaluate(self, phase: Phase, step: int) -> EvalResult:
        logits, labels = predict_exits(
            self.model, self.tokenizer, self.dev_examples, self.cfg.train.eval_batch_size, self.cfg.data.max_length
        )
        scores = per_exit_scores(self.task, logits, labels)
        main = self.task.main_metric
        selection = float(np.mean([scores[layer][main] for layer in phase.trained_exits]))
        result = EvalResult(step, scores, selection)
        self.history.append(
            {
                "phase": phase.name,
                "step": step,
                "global_step": self.global_step,
                "selection": selection,
                "exits": {str(k): v for k, v in scores.items()},
            }
        )
        if self.writer is not None:
            for layer, metrics in scores.items():
                for name, value in metrics.items():
                    self.writer.add_scalar(f"dev/{name}/layer_{layer}", value, self.global_step)
            self.writer.add_scalar(f"dev/selection/{phase.name}", selection, self.global_step)
        if self.best is None or selection > self.best.selection:
            self.best = result
            self.best_phase = phase.name
            self.best_state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
            self.evals_without_improvement = 0
        else:
            self.evals_without_improvement += 1
        return result

    def log_step(
        self, phase: Phase, step: int, terms: list[ExitTerms], record: AngleRecord | None, stats: dict
    ) -> None:
        if record is not None:
            self.angles.append(
                {
                    "phase": phase.name,
                    "step": step,
                    "global_step": self.global_step,
                    "angle": record.angle,
                    "per_exit": {str(k): v for k, v in record.per_exit.items()},
                    "dropped": record.dropped,
                    "num_exits": record.num_exits,
                }
            )
        if self.writer is None:
            return
        g = self.global_step
        self.writer.add_scalar(f"train/loss/{phase.name}", stats["loss"], g)
        self.writer.add_scalar("train/lr", stats["lr"], g)
        for t in terms:
            self.writer.add_scalar(f"train/task_loss/layer_{t.layer}", float(t.task.detach()), g)
            if t.contrastive is not None:
                self.writer.add_scalar(f"train/contrastive_loss/layer_{t.layer}", float(t.contrastive.detach()), g)
        if record is not None:
            if record.angle is not None:
                self.writer.add_scalar("acl/angle", record.angle, g)
            for layer, angle in record.per_exit.items():
                if angle is not None:
                    self.writer.add_scalar(f"acl/angle/layer_{layer}", angle, g)
            self.writer.add_scalar("acl/dropped", float(record.dropped_batch), g)

    def angle_summary(self) -> dict:
        """Fraction of batches whose CE/contrastive angle exceeds 90°, ACL-Grad's drop rate, and the raw records."""
        measured = [r["angle"] for r in self.angles if r["angle"] is not None]
        pairs = sum(r["num_exits"] for r in self.angles)
        return {
            "scope": self.cfg.objective.acl_grad_scope,
            "granularity": self.cfg.objective.acl_grad_granularity,
            "threshold": self.cfg.objective.acl_grad_threshold,
            "acl_grad": self.cfg.objective.acl_grad,
            "batches": len(self.angles),
            "mean_angle": float(np.mean(measured)) if measured else None,
            "fraction_over_90": float(np.mean([a > 90.0 for a in measured])) if measured else None,
            "drop_rate": float(np.mean([bool(r["dropped"]) for r in self.angles])) if self.angles else None,
            "exit_drop_rate": sum(len(r["dropped"]) for r in self.angles) / pairs if pairs else None,
            "records": self.angles,
        }

    def summary(self, seconds: float) -> dict:
        best = self.best
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
            "best": {
                "phase": getattr(self, "best_phase", None),
                "step": best.step if best else None,
                "selection": best.selection if best else None,
                "exits": {str(k): v for k, v in best.scores.items()} if best else {},
            },
            "trained_exits": getattr(self.model.config, "trained_exits", None),
            "stopped_early": self.stopped_early,
            "history": self.history,
        }

    def save(self, summary: dict) -> None:
        """best/ (model + tokenizer, swapped in whole), dev_scores.json, the layer curve, acl_diagnostics.json."""
        try:
            with atomic_path(self.run_dir / "best") as best_dir:
                self.model.save_pretrained(best_dir)
                self.tokenizer.save_pretrained(best_dir)
                seal(best_dir)  # checked whenever the model is loaded (evaluate, predict, early exit)
            atomic_write_json(self.run_dir / "dev_scores.json", summary)
        except (OSError, SafetensorError) as err:  # the temporaries are gone: nothing that looks complete
            reason = getattr(err, "strerror", None) or err
            raise RunWriteError(
                f"{self.run_dir}: cannot write the run's results ({reason}); nothing half-written was "
                "kept. Free space (or fix the filesystem) and rerun the same command"
            ) from err
        if summary["best"]["exits"]:
            scores = {int(k): v for k, v in summary["best"]["exits"].items()}
            plot_layer_curve(self.task, scores, self.run_dir / "layer_curve.png", title=self.run_dir.name)
        if self.angles:
            atomic_write_json(self.run_dir / "acl_diagnostics.json", self.angle_summary(), indent=1)

    def _deepspeed(self, optimizer: torch.optim.Optimizer, scheduler: object) -> tuple:
        """Wrap model/optimizer/schedule in a DeepSpeed engine (single process needs no launcher)."""
        import deepspeed

        resolve_env()  # exports RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT (rank 0 of 1 without a launcher)
        ds_config = read_deepspeed_config(self.cfg.train.ds_config)
        ds_config["train_micro_batch_size_per_gpu"] = self.cfg.train.batch_size
        ds_config.pop("train_batch_size", None)
        ds_config["gradient_accumulation_steps"] = 1
        ds_config["gradient_clipping"] = self.cfg.optim.grad_clip
        ds_config.pop("optimizer", None)
        ds_config.pop("scheduler", None)
        engine, optimizer, _, scheduler = deepspeed.initialize(
            model=self.model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config
        )
        return engine, optimizer, scheduler


def read_deepspeed_config(path: str) -> dict:
    """`--ds-config FILE` as a dict; a missing or malformed file names itself."""
    return read_object(path, ConfigError, "a JSON object", hint="the DeepSpeed config (--ds-config, train.ds_config)")


def run_training(
    cfg: FinetuneConfig, output: str | Path, overwrite: bool = False, sources: Mapping[str, str] | None = None
) -> dict:
    """Everything `finetune train` does: validate, check the run directory `output` (a finished run there is replaced
    only with `overwrite`), load model, tokenizer and data, train, write the run directory (locked while the run
    lasts; `sources`: where each config value came from, saved in run_config.json)."""
    run_dir = Path(output)
    task = get_task(cfg.data.task)
    cfg.validate(task.num_labels)
    if cfg.train.ds_config:
        read_deepspeed_config(cfg.train.ds_config)
    env = resolve_env(export=False)
    device = resolve_device(cfg.train.device, env.local_rank)  # no GPU for `--device cuda`: refused before loading
    rank0 = env.rank == 0
    if rank0:
        check_run_dir(run_dir, overwrite)  # before anything is loaded
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
    record = RunRecord(dict(sources or {}), {"model_path": str(report.source), "tokenizer_path": str(tokenizer_dir)})
    set_seed(cfg.train.seed)
    trainer = Trainer(cfg, task, model, tokenizer, train, dev, run_dir, record)
    if not rank0:
        summary = trainer.fit()
    else:
        with claim_run_dir(run_dir, overwrite):
            summary = trainer.fit()
    summary["load_report"] = str(report)
    return summary


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
