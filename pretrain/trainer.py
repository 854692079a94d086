"""The DeepSpeed training loop: grouped exits, gradient equilibrium, exact resume, agreed preemption saves.

Order of work at start-up: everything that can fail on bad input (config, DeepSpeed JSON, run directory, data,
checkpoint compatibility) is checked before the process group exists, so a mistake costs seconds and prints one
clear message instead of a hung or half-started job.

One optimizer step t:
  active exits = group t mod G; lr = schedule(t) written into the param groups;
  for each of the `accum` micro-batches: dropout RNG <- f(seed, t, global micro index); forward; backward; step;
  one all-reduce carries the step's statistics *and* the preemption flag, so all ranks stop at the same step.
Everything a resumed run needs is (step, consumed_samples) + DeepSpeed's model/optimizer state: data order,
masking (per-sample seed), dropout (per-micro-step seed), lr (function of step) and the exit group (step mod G)
are all recomputed, not restored.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import signal
import time
import warnings
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .checkpoint import (
    CLIENT_STATE,
    LATEST,
    ResumeError,
    ResumePoint,
    atomic_write_text,
    check_compatible,
    convert_to_universal,
    find_resume_point,
    prune,
    tag_for,
)
from .config import ConfigError, RunConfig, save_config, validate
from .data import (
    BlendedDataset,
    Collator,
    MaskingConfig,
    PretrainingDataset,
    RankBatches,
    SampleOrder,
    collate,
    load_or_build_index,
)
from .distributed import DistEnv, resolve_env
from .ds_config import fill_ds_config, load_ds_json, precision_of
from .metrics import MetricsLogger
from .preemption import EXIT_PREEMPTED, PreemptionFlag
from .schedule import learning_rate

log = logging.getLogger("pretrain")


class RunDirError(ValueError):
    """The run directory cannot be created or written."""


# -------------------------------------------------------------------------------------------------------- data


@dataclass
class DataBundle:
    train: list[PretrainingDataset]
    valid: list[PretrainingDataset]
    special_ids: dict
    tokenizer_dir: Path | None
    index_paths: list[str]


def open_corpus(path: Path, split: str) -> Any:
    """data_prep's reader (its errors, DataPrepError, carry data_prep verify's messages)."""
    from data_prep.reader import PreparedCorpus

    return PreparedCorpus(path, split=split)


def verify_corpus(path: Path, caches: list[Path]) -> None:
    """`data_prep verify` (every shard re-hashed) unless a stamp says this exact corpus already passed it.

    The stamp (manifest hash + size and mtime of every file) lives beside the sample index, so a corpus is
    re-hashed once per version, not at every restart; its problems are raised verbatim as DataPrepError.
    """
    from data_prep.errors import DataPrepError
    from data_prep.verify import verify_dir

    manifest = path / "manifest.json"
    files = sorted(p for p in path.rglob("*") if p.is_file() and "index_cache" not in p.parts
                   and ".work" not in p.parts)
    key = hashlib.sha256(manifest.read_bytes() if manifest.is_file() else b"")
    for f in files:
        st = f.stat()
        key.update(f"{f.relative_to(path)}:{st.st_size}:{st.st_mtime_ns}".encode())
    name = f"verified_{key.hexdigest()[:16]}.json"
    if any((Path(c) / name).is_file() for c in caches):
        return
    problems = verify_dir(path)
    if problems:
        raise DataPrepError(f"{path} failed data_prep verify:\n" + "\n".join(f"  - {p}" for p in problems))
    for c in caches:
        try:
            Path(c).mkdir(parents=True, exist_ok=True)
            atomic_write_text(Path(c) / name, json.dumps({"verified": str(path), "time": time.time()}))
            return
        except OSError:
            continue


def _tokenizer_fingerprint(corpus: Any) -> str:
    tdir = Path(corpus.tokenizer_dir) if getattr(corpus, "tokenizer_dir", None) else None
    h = hashlib.sha256(json.dumps(corpus.special_ids, sort_keys=True).encode())
    if tdir is not None and tdir.is_dir():
        for name in ("vocab.txt", "tokenizer.json", "spm.model", "tokenizer.model"):
            if (tdir / name).is_file():
                h.update(name.encode() + (tdir / name).read_bytes())
                break
    return h.hexdigest()


def open_data(cfg: RunConfig, run_dir: Path, need_valid: bool) -> DataBundle:
    """Open every corpus (train and, if evaluating, valid), check they share one tokenizer, load/build indexes."""
    from .config import resolve_path

    masking = MaskingConfig(cfg.data.max_seq_len, cfg.data.masked_lm_prob, cfg.data.max_ngram, cfg.train.seed)
    train, valid, index_paths = [], [], []
    fingerprint = None
    special = None
    tokenizer_dir = None
    for k, c in enumerate(cfg.data.corpora):
        path = resolve_path(c.path)
        if "$" in str(path):
            raise ConfigError(f"data.corpora[{k}].path={c.path!r}: environment variable not set "
                              "(export it, or --set data.corpora.{k}.path=DIR)".replace("{k}", str(k)))
        corpus = open_corpus(path, "train")
        caches = [resolve_path(cfg.data.index_cache_dir)] if cfg.data.index_cache_dir else [path / "index_cache",
                                                                                        run_dir / "index_cache"]
        if cfg.data.verify:
            verify_corpus(path, caches)
        fp = _tokenizer_fingerprint(corpus)
        if fingerprint is None:
            fingerprint, special = fp, dict(corpus.special_ids)
            tokenizer_dir = Path(corpus.tokenizer_dir) if getattr(corpus, "tokenizer_dir", None) else None
        elif fp != fingerprint:
            raise ConfigError(f"data.corpora[{k}] ({path}) uses a different tokenizer than data.corpora[0]; "
                              "blended corpora must be prepared with the same vocabulary")
        for split, sink in (("train", train), ("valid", valid)):
            if split == "valid":
                if not need_valid:
                    continue
                corpus = open_corpus(path, "valid")
            index, where, _ = load_or_build_index(
                corpus, split, cfg.data.max_seq_len, cfg.data.short_seq_prob, cfg.train.seed, caches
            )
            if len(index) == 0:
                raise ConfigError(f"data.corpora[{k}] ({path}, split {split}) yields no samples: documents need at "
                                  "least two sentences for sentence-order prediction")
            index_paths.append(str(where) if where else f"(in memory) {path} {split}")
            sink.append(PretrainingDataset(corpus, index, masking, corpus_id=k))
    return DataBundle(train, valid, special or {}, tokenizer_dir, index_paths)


# ------------------------------------------------------------------------------------------------------- model


def build_model(cfg: RunConfig, vocab_size: int, tokenizer_dir: Path | None) -> tuple[torch.nn.Module, str]:
    """From scratch (seeded) or from a BERT / ElasticBERT checkpoint; returns the model and a one-line origin."""
    from elasticbert import ElasticBertConfig, ElasticBertForPreTraining, load_pretrained, minilm_dir

    m = cfg.model
    torch.manual_seed(cfg.train.seed)
    if m.init_from is None:
        mcfg = ElasticBertConfig(
            vocab_size=m.vocab_size or vocab_size,
            hidden_size=m.hidden_size,
            num_hidden_layers=m.num_hidden_layers,
            num_attention_heads=m.num_attention_heads,
            intermediate_size=m.intermediate_size,
            max_position_embeddings=m.max_position_embeddings,
            hidden_dropout_prob=m.hidden_dropout_prob,
            attention_probs_dropout_prob=m.attention_probs_dropout_prob,
        )
        model = ElasticBertForPreTraining(mcfg)
        origin = "from scratch"
    else:
        from .config import resolve_path

        src = minilm_dir() if m.init_from == "minilm" else resolve_path(m.init_from)
        _check_same_vocab(Path(src), tokenizer_dir)
        model, report = load_pretrained(
            ElasticBertForPreTraining, src,
            hidden_dropout_prob=m.hidden_dropout_prob, attention_probs_dropout_prob=m.attention_probs_dropout_prob,
        )
        origin = str(report)
    mc = model.config
    if mc.vocab_size < vocab_size:
        raise ConfigError(f"model vocabulary ({mc.vocab_size}) is smaller than the data's ({vocab_size})")
    if cfg.data.max_seq_len > mc.max_position_embeddings:
        raise ConfigError(f"data.max_seq_len={cfg.data.max_seq_len} exceeds the model's max_position_embeddings="
                          f"{mc.max_position_embeddings}")
    if m.init_from is not None and mc.num_hidden_layers != m.num_hidden_layers:
        raise ConfigError(f"model.num_hidden_layers={m.num_hidden_layers} but {m.init_from} has "
                          f"{mc.num_hidden_layers} layers; set model.num_hidden_layers={mc.num_hidden_layers}")
    if m.activation_checkpointing:
        model.gradient_checkpointing_enable()
    return model, origin


def _check_same_vocab(init_dir: Path, tokenizer_dir: Path | None) -> None:
    a = init_dir / "vocab.txt"
    b = tokenizer_dir / "vocab.txt" if tokenizer_dir else None
    if a.is_file() and b is not None and b.is_file() and a.read_bytes() != b.read_bytes():
        raise ConfigError(f"model.init_from={init_dir} was trained with another vocabulary than the data "
                          f"({b}); prepare the data with --vocab {a}")


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """No weight decay on biases and LayerNorm weights (as BERT); tied weights appear once."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or "LayerNorm" in name or name.endswith(".bias") else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


# ----------------------------------------------------------------------------------------------------- helpers


def prepare_run_dir(run_dir: Path, rank: int) -> None:
    """Create RUN/ and prove every rank can write there (shared filesystems differ per node)."""
    try:
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write_probe_{rank}_{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise RunDirError(f"run directory {run_dir} is not writable: {e.strerror or e}") from None


def micro_seed(seed: int, step: int, global_micro: int) -> int:
    """Dropout seed of global micro-batch j of step t: the same for a given micro-batch whatever the world size
    (j = rank * accum + m holds the same samples for a fixed micro-batch size)."""
    return int(np.random.SeedSequence([seed, 3, step, global_micro]).generate_state(1, np.uint64)[0] >> 1)


def batch_digest(order: SampleOrder, step: int, global_batch: int) -> str:
    corpus, sample = order(np.arange(step * global_batch, (step + 1) * global_batch))
    return hashlib.sha1(np.stack([corpus, sample]).tobytes()).hexdigest()[:16]


def measure_peak_flops(dtype: torch.dtype, n: int = 1024, reps: int = 4) -> float:
    """Matmul FLOP/s of this process on CPU (its threads): the MFU denominator when no peak is configured."""
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    a @ b
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - t0)


GPU_PEAK_TFLOPS = {"A100": 312.0, "H100": 989.0, "H200": 989.0, "V100": 125.0, "A10": 125.0, "L40": 181.0}


def peak_flops(cfg: RunConfig, device: str, precision: str) -> float | None:
    if cfg.logging.peak_tflops:
        return cfg.logging.peak_tflops * 1e12
    if device == "cuda":
        name = torch.cuda.get_device_name()
        for key, tf in GPU_PEAK_TFLOPS.items():
            if key in name:
                return tf * 1e12 if precision != "fp32" else tf * 1e12 / 16  # tf32-less fp32 is far lower
        return None
    return measure_peak_flops(torch.bfloat16 if precision == "bf16" else torch.float32)


def _quiet_deepspeed() -> None:
    os.environ.setdefault("DS_ACCELERATOR", "cpu" if not torch.cuda.is_available() else "cuda")
    warnings.filterwarnings("ignore", message=r".*deprecated.*", category=FutureWarning)
    warnings.filterwarnings("ignore", message=r".*torch\.distributed.*deprecated.*")
    warnings.filterwarnings("ignore", category=UserWarning, module=r"deepspeed.*")
    for name in ("DeepSpeed", "deepspeed", "torch.distributed"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _ignore_signals_in_worker(_: int) -> None:
    """DataLoader workers share the job's process group: a preemption SIGTERM must not kill them mid-save."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


# ------------------------------------------------------------------------------------------------------- train


class Trainer:
    """Holds the engine and the loop state; `run()` returns the process exit code (0 done, 75 preempted)."""

    def __init__(self, cfg: RunConfig, run_dir: Path, ds_config_path: str | None, force_resume: bool) -> None:
        _quiet_deepspeed()
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.env: DistEnv = resolve_env()
        self.rank, self.world = self.env.rank, self.env.world_size
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.preempt = PreemptionFlag()

        # 1. Checks that need no process group.
        validate(cfg, world_size=self.world)
        raw = load_ds_json(ds_config_path or cfg.train.ds_config)
        self.ds_cfg, self.layout = fill_ds_config(raw, cfg, self.world, self.device)
        self.precision = precision_of(self.ds_cfg)
        self.zero_stage = int(self.ds_cfg.get("zero_optimization", {}).get("stage", 0))
        prepare_run_dir(self.run_dir, self.rank)
        need_valid = cfg.eval.interval > 0
        self.data = open_data(cfg, self.run_dir, need_valid)
        self.groups = cfg.exit_groups()
        self.config_hash = cfg.semantic_hash()
        self.point: ResumePoint | None = find_resume_point(self.ckpt_dir)
        self.config_diffs: list[str] = []
        if self.point is not None:
            self.config_diffs = check_compatible(self.point, self.config_hash, cfg.to_dict(),
                                                 force_resume or cfg.checkpoint.force_resume)
        if self.rank == 0:
            save_config(cfg, self.run_dir / "config.yaml")
            atomic_write_text(self.run_dir / "ds_config.json", json.dumps(self.ds_cfg, indent=2))

    # ------------------------------------------------------------------ setup that needs the process group
    def _setup(self) -> None:
        import deepspeed

        deepspeed.init_distributed(dist_backend="nccl" if self.device == "cuda" else "gloo",
                                   timeout=timedelta(minutes=60), verbose=False)
        if self.device == "cuda":
            torch.cuda.set_device(self.env.local_rank)
        self.dist = torch.distributed
        vocab = int(self.data.special_ids["vocab_size"])
        model, self.origin = build_model(self.cfg, vocab, self.data.tokenizer_dir)
        self.model_config = model.config

        self.load_tag = None
        if self.point is not None:
            self.load_tag = self.point.tag
            old_world = int(self.point.state.get("world_size", self.world))
            old_stage = int(self.point.state.get("zero_stage", self.zero_stage))
            if (old_world != self.world or old_stage != self.zero_stage) and max(old_stage, self.zero_stage) > 0:
                # ZeRO shards are laid out for one data-parallel size: go through DeepSpeed's universal format.
                if self.rank == 0:
                    self.load_tag = convert_to_universal(self.ckpt_dir, self.point.tag)
                else:
                    self.load_tag = f"{self.point.tag}_universal"
                self.dist.barrier()
                self.ds_cfg.setdefault("checkpoint", {})["load_universal"] = True

        self.engine, *_ = deepspeed.initialize(
            model=model, model_parameters=param_groups(model, self.cfg.optim.weight_decay), config=self.ds_cfg
        )
        self.step = 0
        self.consumed = 0
        if self.point is not None:
            path, client = self.engine.load_checkpoint(
                str(self.ckpt_dir), tag=self.load_tag, load_lr_scheduler_states=False
            )
            if path is None:
                raise ResumeError(f"DeepSpeed could not load checkpoint {self.ckpt_dir / self.load_tag}")
            self.step, self.consumed = self.point.step, self.point.consumed_samples
            if client and int(client.get("step", self.step)) != self.step:
                raise ResumeError(f"{self.load_tag}: client state step {client.get('step')} != {self.step}")
            if self.ds_cfg.get("checkpoint", {}).get("load_universal"):
                # Later saves are ordinary checkpoints for the new world size.
                self.engine._config.load_universal_checkpoint = False
        self.last_saved = self.step if self.point is not None else -1

        self.order = SampleOrder([len(d) for d in self.data.train], [c.weight for c in self.cfg.data.corpora],
                                 self.cfg.train.seed, self.cfg.data.blend_block)
        self.dataset = BlendedDataset(self.data.train)
        pad = int(self.data.special_ids.get("pad", 0))
        self.collator = Collator(pad)
        batches = RankBatches(self.order, self.consumed, self.layout.global_batch, self.layout.micro_batch,
                              self.rank, self.world)
        nw = self.cfg.data.num_workers
        self.loader = torch.utils.data.DataLoader(
            self.dataset, batch_sampler=batches, collate_fn=self.collator, num_workers=nw,
            worker_init_fn=_ignore_signals_in_worker if nw else None,
            prefetch_factor=4 if nw else None, persistent_workers=False,
        )
        self.end_step = min(self.cfg.train.train_steps, self.cfg.train.stop_after_steps or self.cfg.train.train_steps)
        self.metrics = MetricsLogger(self.run_dir, self.rank == 0, self.cfg.logging.tensorboard,
                                     self.cfg.logging.progress, self.end_step, self.step, self.cfg.logging.tb_interval)
        self.peak = peak_flops(self.cfg, self.device, self.precision)
        self.samples_log = (open(self.run_dir / f"samples_rank{self.rank}.jsonl", "a", encoding="utf-8")
                            if self.cfg.logging.log_samples else None)

    def _announce(self) -> None:
        n_params = sum(p.numel() for p in self.engine.module.parameters())
        if self.zero_stage == 3:
            n_params = sum(getattr(p, "ds_numel", p.numel()) for p in self.engine.module.parameters())
        lines = [
            f"ElasticBERT pre-training: {self.world} process(es) via {self.env.launcher}, device {self.device}, "
            f"ZeRO-{self.zero_stage}, {self.precision}",
            f"  batch: {self.layout}",
            f"  model: {self.model_config.num_hidden_layers} layers, hidden {self.model_config.hidden_size}, "
            f"{n_params / 1e6:.2f}M parameters, {self.origin}",
            f"  exit groups (step t trains group t mod {len(self.groups)}): {self.groups}",
            f"  data: {sum(len(d) for d in self.data.train)} train samples in {len(self.data.train)} corpora; "
            f"index {'; '.join(self.data.index_paths)}",
        ]
        if self.point is not None:
            lines.append(f"  resuming from {self.point.tag} (step {self.step}, consumed_samples {self.consumed})"
                         + (f" via {self.load_tag}" if self.load_tag != self.point.tag else ""))
            for d in self.config_diffs:
                lines.append(f"  forced resume despite config change: {d}")
        for line in lines:
            self.metrics.write(line)
        self.metrics.event(
            "start", step=self.step, consumed_samples=self.consumed, world_size=self.world,
            launcher=self.env.launcher, zero_stage=self.zero_stage, precision=self.precision,
            micro_batch=self.layout.micro_batch, grad_accum=self.layout.grad_accum,
            global_batch=self.layout.global_batch, resumed_from=self.point.tag if self.point else None,
            load_tag=self.load_tag, config_hash=self.config_hash, forced_diffs=self.config_diffs,
        )

    # ------------------------------------------------------------------------------------------- the loop
    def run(self) -> int:
        self.preempt.install()  # from here on a SIGTERM/SIGUSR1 means "save at the next step boundary"
        try:
            self._setup()
            self._announce()
            return self._loop()
        finally:
            self.preempt.restore()
            if hasattr(self, "metrics"):
                self.metrics.close()
            if getattr(self, "samples_log", None):
                self.samples_log.close()

    def _loop(self) -> int:
        it = iter(self.loader)
        k_max = max(len(g) for g in self.groups)
        ge = self.cfg.exits.gradient_equilibrium
        accum = self.layout.grad_accum
        while self.step < self.end_step:
            t0 = time.perf_counter()
            active = self.groups[self.step % len(self.groups)]
            k = len(active)
            lr = learning_rate(self.step, self.cfg.train.train_steps, self.cfg.optim)
            for group in self.engine.optimizer.param_groups:
                group["lr"] = lr
            # [loss, mlm_loss*k_max, sop_loss*k_max, mlm_acc*k_max, sop_acc*k_max, tokens, masked, padded, wait, flag]
            # kept on the engine's device: one host sync per step, and NCCL needs device tensors
            stats = torch.zeros(1 + 4 * k_max + 5, dtype=torch.float64, device=self.engine.device)
            wait = 0.0
            for m in range(accum):
                tw = time.perf_counter()
                batch = next(it)
                wait += time.perf_counter() - tw
                keys = batch.pop("keys")
                if self.samples_log is not None:
                    self.samples_log.write(json.dumps({"step": self.step, "micro": m, "keys": keys.tolist()}) + "\n")
                batch = {name: t.to(self.engine.device) for name, t in batch.items()}
                torch.manual_seed(micro_seed(self.cfg.train.seed, self.step, self.rank * accum + m))
                out = self.engine(**batch, active_exits=active, gradient_equilibrium=ge)
                if tuple(out.exit_layers) != tuple(active):
                    raise RuntimeError(f"model trained exits {out.exit_layers}, expected group {active}")
                self.engine.backward(out.loss)
                self.engine.step()
                stats[0] += out.loss.detach().double()
                stats[1:1 + k] += out.mlm_loss.double()
                stats[1 + k_max:1 + k_max + k] += out.sop_loss.double()
                stats[1 + 2 * k_max:1 + 2 * k_max + k] += out.mlm_accuracy.double()
                stats[1 + 3 * k_max:1 + 3 * k_max + k] += out.sop_accuracy.double()
                stats[-5] += batch["attention_mask"].sum()
                stats[-4] += (batch["mlm_labels"] != -100).sum()
                stats[-3] += batch["input_ids"].numel()
            stats[-2] += wait
            stats[-1] = 1.0 if self.preempt.requested else 0.0
            self.dist.all_reduce(stats)  # also the preemption vote: > 0 if any rank was signalled
            stats = stats.cpu()
            grad_norm = self.engine.get_global_grad_norm()
            self.step += 1
            self.consumed += self.layout.global_batch
            self._log_step(stats, active, k_max, lr, grad_norm, time.perf_counter() - t0)

            if stats[-1] > 0:
                signame = signal.Signals(self.preempt.signum).name if self.preempt.signum else "peer"
                self.metrics.write(f"preemption ({signame}): saving at step {self.step} and exiting "
                                   f"with {EXIT_PREEMPTED}")
                self.save()
                self.metrics.event("preempted", step=self.step, signal=signame)
                return EXIT_PREEMPTED
            if self.step % self.cfg.checkpoint.interval == 0 or self.step == self.end_step:
                self.save()
            if self.cfg.eval.interval and (self.step % self.cfg.eval.interval == 0 or self.step == self.end_step):
                self.evaluate()
        if self.last_saved != self.step:
            self.save()
        if self.cfg.checkpoint.dump_final_weights:
            self.dump_weights(self.run_dir / "final_weights.safetensors")
        self.metrics.event("end", step=self.step, consumed_samples=self.consumed)
        return 0

    def _log_step(self, stats: torch.Tensor, active: tuple[int, ...], k_max: int, lr: float,
                  grad_norm: float | None, elapsed: float) -> None:
        n = self.layout.grad_accum * self.world
        k = len(active)
        tokens, masked, padded, wait = (float(stats[i]) for i in (-5, -4, -3, -2))
        record: dict[str, Any] = {
            "step": self.step,
            "loss": float(stats[0]) / n,
            "active_exits": list(active),
            "group": (self.step - 1) % len(self.groups),
            "consumed_samples": self.consumed,
            "lr": lr,
            "grad_norm": float(grad_norm) if grad_norm is not None else None,
            "mlm_loss": (stats[1:1 + k] / n).tolist(),
            "sop_loss": (stats[1 + k_max:1 + k_max + k] / n).tolist(),
            "mlm_accuracy": (stats[1 + 2 * k_max:1 + 2 * k_max + k] / n).tolist(),
            "sop_accuracy": (stats[1 + 3 * k_max:1 + 3 * k_max + k] / n).tolist(),
            "tokens": int(tokens),
            "tokens_per_s": tokens / elapsed,
            "padding_fraction": 1.0 - tokens / padded if padded else 0.0,
            "data_wait_s": wait / self.world,
            "step_time_s": elapsed,
            "world_size": self.world,
        }
        if self.rank == 0:
            record["samples_digest"] = batch_digest(self.order, self.step - 1, self.layout.global_batch)
        if self.peak:
            from elasticbert.flops import training_flops_per_token

            seq = tokens / self.layout.global_batch
            fpt = training_flops_per_token(self.model_config, active, max(int(round(seq)), 1),
                                           masked / tokens if tokens else 0.15)
            record["mfu"] = fpt * tokens / elapsed / (self.peak * self.world)
        if not math.isfinite(record["loss"]):
            self.metrics.write(f"warning: non-finite loss at step {self.step}")
        self.metrics.step(record)

    # -------------------------------------------------------------------------------------- checkpoints
    def save(self) -> None:
        """DeepSpeed files on every rank, then (rank 0) client_state.json and export files, then `latest`."""
        tag = tag_for(self.step)
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
        t0 = time.perf_counter()
        self.engine.save_checkpoint(str(self.ckpt_dir), tag=tag, client_state=dict(state), save_latest=False)
        if self.rank == 0:
            self._write_export_files(self.ckpt_dir / tag / "export")
            full = {**state, "config": self.cfg.to_dict(), "time": time.time()}
            atomic_write_text(self.ckpt_dir / tag / CLIENT_STATE, json.dumps(full, indent=2))
        self.dist.barrier()
        if self.rank == 0:
            atomic_write_text(self.ckpt_dir / LATEST, tag)
            removed = prune(self.ckpt_dir, self.cfg.checkpoint.keep_last)
            self.metrics.event("checkpoint", step=self.step, tag=tag, seconds=time.perf_counter() - t0,
                               removed=removed)
        self.dist.barrier()
        self.last_saved = self.step

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
            tmp = path.with_name(f".{path.name}.tmp")
            save_file(sd, str(tmp))
            os.replace(tmp, path)
        self.dist.barrier()

    # --------------------------------------------------------------------------------------------- eval
    def evaluate(self) -> dict[str, Any] | None:
        """All exits on a fixed slice of the held-out split: per-exit MLM loss/accuracy (token-weighted) and SOP
        accuracy. Every rank runs the same number of micro-batches (ZeRO-3 gathers need everyone)."""
        micro = self.cfg.eval.micro_batch_size or self.layout.micro_batch
        keys = [(k, i) for k, d in enumerate(self.data.valid) for i in range(len(d))]
        n = min(len(keys), self.cfg.eval.max_samples) // (micro * self.world) * (micro * self.world)
        if n == 0:
            self.metrics.write("validation skipped: held-out split smaller than one batch per rank")
            return None
        per_rank = n // self.world
        mine = keys[self.rank * per_rank:(self.rank + 1) * per_rank]
        layers = self.model_config.num_hidden_layers
        exits = tuple(range(1, layers + 1))
        # per exit: MLM loss·masked, MLM correct, SOP loss·samples, SOP correct; then masked total, samples total
        sums = torch.zeros(4 * layers + 2, dtype=torch.float64, device=self.engine.device)
        was_training = self.engine.module.training
        self.engine.eval()
        with torch.no_grad():
            for start in range(0, len(mine), micro):
                items = [self.data.valid[k][i] for k, i in mine[start:start + micro]]
                batch = {n_: t.to(self.engine.device) for n_, t in collate(items, int(self.data.special_ids.get(
                    "pad", 0))).items()}
                out = self.engine(**batch, active_exits=exits, gradient_equilibrium=False)
                nm = (batch["mlm_labels"] != -100).sum().double()
                b = float(batch["input_ids"].shape[0])
                sums[0:layers] += out.mlm_loss.double() * nm
                sums[layers:2 * layers] += out.mlm_accuracy.double() * nm
                sums[2 * layers:3 * layers] += out.sop_loss.double() * b
                sums[3 * layers:4 * layers] += out.sop_accuracy.double() * b
                sums[-2] += nm
                sums[-1] += b
        if was_training:
            self.engine.train()
        self.dist.all_reduce(sums)
        sums = sums.cpu()
        nm, b = float(sums[-2]), float(sums[-1])
        record = {
            "step": self.step,
            "exits": list(exits),
            "samples": int(b),
            "mlm_loss": (sums[0:layers] / max(nm, 1)).tolist(),
            "mlm_accuracy": (sums[layers:2 * layers] / max(nm, 1)).tolist(),
            "sop_loss": (sums[2 * layers:3 * layers] / b).tolist(),
            "sop_accuracy": (sums[3 * layers:4 * layers] / b).tolist(),
        }
        self.metrics.eval(record)
        self.metrics.write(f"valid @ step {self.step}: MLM loss by exit "
                           + " ".join(f"{x:.3f}" for x in record["mlm_loss"])
                           + f"; SOP acc (top) {record['sop_accuracy'][-1]:.3f}")
        return record


def train(cfg: RunConfig, run_dir: Path, ds_config_path: str | None = None, force_resume: bool = False) -> int:
    """Entry point used by the CLI: returns the exit code."""
    return Trainer(cfg, run_dir, ds_config_path, force_resume).run()

