"""Shared machinery of the two pre-training experiments (pretrain_exits.py: claim 1; grouping.py: claim 2).

Both continue pre-training the MiniLM checkpoint (`model.init_from=minilm`, the paper's "initialise from BERT
weights" setting) on Gutenberg + WikiText with the project's own CLIs (`data_prep tokenize`, `pretrain train`,
`pretrain export`, `finetune train`), so the numbers come from the shipped code paths. Every finished unit of work
(one chunk of a pre-training arm, one export, one held-out evaluation, one probe, one fine-tune) leaves a small JSON
under `WORK/units/`, written atomically; a rerun skips it, so a kill costs only the unit in flight, and a
pre-training arm killed mid-chunk resumes from its last checkpoint (`pretrain train` resumes from `latest`).

Every unit records its wall and CPU seconds (this process and its children), so the budget is stated in CPU time,
which on this shared 2-core machine means more than wall time.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from experiments.common import GLUE_DIR, REPO, SHARED_DATA, cpu_seconds, run_cli, write_json

CORPUS_ROOT = SHARED_DATA / "corpus"
AUTOCAST_DS_CONFIG = REPO / "experiments" / "ds_cpu_bf16_autocast.json"  # cpu_fp32.json + DeepSpeed torch_autocast
FP32_DS_CONFIG = REPO / "ds_configs" / "cpu_fp32.json"
MINILM_SHAPE = {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536}
MODEL_LAYERS = MINILM_SHAPE["num_hidden_layers"]
HELDOUT_MASK_SEED = 0  # masking of the held-out samples: identical for every model
HELDOUT_SAMPLE_SEED = 0  # sample index (packing) of the held-out split


@dataclass(frozen=True)
class FinetuneBudget:
    """One task's static fine-tune (`finetune train --layers l`, linear exit); every value passed explicitly."""

    train_examples: int | None  # None: the full training set
    dev_examples: int | None  # None: the full dev set
    max_length: int
    epochs: float
    lr: float
    batch_size: int
    warmup: float = 0.1
    weight_decay: float = 0.01
    dropout: float = 0.1
    grad_clip: float = 1.0


@dataclass(frozen=True)
class ProbeBudget:
    """Linear probes on frozen features: a seeded training subset per seed, the dev set, C chosen by CV on train."""

    train_examples: dict[str, int]  # per task: size of each seed's training subset
    dev_examples: int | None  # None: the full dev sets
    max_length: dict[str, int]
    cs: tuple[float, ...] = (0.01, 0.1, 1.0, 10.0)  # inverse regularisation grid, picked by CV on train
    cv_folds: int = 3


@dataclass(frozen=True)
class TimingBudget:
    """Interleaved per-step timing (in-process, one thread): model shapes, batch per shape, rounds."""

    shapes: dict[str, dict[str, int]]  # name -> hidden_size, num_hidden_layers, num_attention_heads, ...
    batch: dict[str, int]
    seq_len: int
    rounds: int


@dataclass(frozen=True)
class Scale:
    """Every size an experiment depends on; written into results.json so a table says what produced it."""

    corpus_inputs: tuple[str, ...]  # under ../shared/data/corpus, tokenised once (data_prep --doc-boundary file)
    valid_fraction: float  # held-out documents (whole books): never trained on, used for every held-out number
    split_seed: int
    seq_len: int
    global_batch: int
    steps: int  # every claim-1 arm; claim 2's G=1 arm too (equal steps)
    export_at: tuple[int, ...]  # steps at which an arm is exported (learning curves); the last is `steps`
    lr: float
    warmup_steps: int
    betas: tuple[float, float]
    weight_decay: float
    precision: str  # "bf16-autocast" | "fp32": the arms' precision (chosen by the precision check, stated)
    precision_check_steps: int  # arm (a) in fp32 vs bf16 autocast over its first N steps
    eval_interval: int  # the trainer's validation (per-exit MLM loss on the held-out split) every N steps
    eval_samples: int
    heldout_samples: int  # the final per-exit held-out MLM loss: evenly spaced over the held-out split
    probe: ProbeBudget
    finetune: dict[str, FinetuneBudget]
    ft_layers: tuple[int, ...]
    ft_tasks: tuple[str, ...]  # tasks whose budget lets MiniLM's layer 6 clear the majority class (the others: probes)
    timing: TimingBudget
    seeds: tuple[int, ...] = (1, 2, 3)
    notes: dict[str, str] = field(default_factory=dict)

    def tokens_slots(self, steps: int) -> int:
        return steps * self.global_batch * self.seq_len


SCALES = {
    "smoke": Scale(
        corpus_inputs=(
            "gutenberg/pg7256.txt",
            "gutenberg/pg1080.txt",
            "gutenberg/1952-0.txt",
            "gutenberg/Collected_Speeches_FrederickDouglass.txt",
        ),
        valid_fraction=0.3,
        split_seed=5,  # puts pg1080 in the held-out split, the other three in training
        seq_len=64,
        global_batch=4,
        steps=2,
        export_at=(2,),
        lr=1e-4,
        warmup_steps=1,
        betas=(0.9, 0.999),
        weight_decay=0.01,
        precision="bf16-autocast",
        precision_check_steps=1,
        eval_interval=1,
        eval_samples=8,
        heldout_samples=8,
        probe=ProbeBudget(
            train_examples={"SST-2": 48, "MRPC": 48}, dev_examples=32, max_length={"SST-2": 32, "MRPC": 48}, cv_folds=2
        ),
        finetune={
            "SST-2": FinetuneBudget(32, 32, 32, 1, 1e-4, 16),
            "MRPC": FinetuneBudget(32, 32, 48, 1, 1e-4, 16),
        },
        ft_layers=(1, 6),
        ft_tasks=("SST-2",),
        timing=TimingBudget(
            shapes={
                "minilm": MINILM_SHAPE,
                "base": {
                    "hidden_size": 128,
                    "num_hidden_layers": 3,
                    "num_attention_heads": 2,
                    "intermediate_size": 512,
                },
            },
            batch={"minilm": 2, "base": 2},
            seq_len=32,
            rounds=1,
        ),
        seeds=(1,),
    ),
    "report": Scale(
        corpus_inputs=("gutenberg", "wikitext-2-raw"),
        valid_fraction=0.05,
        # split seed 0 would hold out WikiText (one document with --doc-boundary file); 1 is the first seed that
        # keeps it in training (10 books, 5.0 MB, held out). Chosen from the split alone, before any training.
        split_seed=1,
        seq_len=128,
        global_batch=32,
        steps=800,  # 800 x 32 x 128 = 3.28 M token slots (~3.1 M real tokens): >= 100x the previous 33 k
        export_at=(400, 800),
        lr=1e-4,
        warmup_steps=32,  # 4 % of the steps, as the paper
        betas=(0.9, 0.999),  # the paper's Adam betas and weight decay
        weight_decay=0.01,
        precision="bf16-autocast",
        precision_check_steps=64,
        eval_interval=100,
        eval_samples=256,
        heldout_samples=512,
        probe=ProbeBudget(
            train_examples={"SST-2": 4000, "MRPC": 3000}, dev_examples=None, max_length={"SST-2": 64, "MRPC": 128}
        ),
        finetune={
            "SST-2": FinetuneBudget(2000, None, 64, 1, 5e-5, 32),
            "MRPC": FinetuneBudget(2000, None, 128, 2, 5e-5, 32),
        },
        ft_layers=(1, 2, 3, 6),
        ft_tasks=("SST-2",),
        timing=TimingBudget(
            shapes={
                "minilm": MINILM_SHAPE,
                "base": {
                    "hidden_size": 768,
                    "num_hidden_layers": 12,
                    "num_attention_heads": 12,
                    "intermediate_size": 3072,
                },
            },
            batch={"minilm": 32, "base": 8},
            seq_len=128,
            rounds=3,
        ),
    ),
}


def data_available() -> str | None:
    """None when the shared data is present, else why the experiments cannot run (tests skip with it)."""
    for path in (CORPUS_ROOT / "gutenberg", CORPUS_ROOT / "wikitext-2-raw", GLUE_DIR / "SST-2", GLUE_DIR / "MRPC"):
        if not path.is_dir():
            return f"{path} not found (../shared/data is part of the environment, never copied into the repo)"
    return None


def limit_threads() -> None:
    """One thread everywhere: the machine is shared, and timings are only comparable at a fixed thread count."""
    os.environ.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"})
    import torch

    torch.set_num_threads(1)


def minilm_path() -> Path:
    from elasticbert import minilm_dir

    return Path(minilm_dir())


# ------------------------------------------------------------------------------------------------------- units


def unit(work: Path, name: str, compute: Callable[[], dict]) -> dict:
    """Result of one unit of work, computed once: WORK/units/NAME.json is the proof it finished. Adds the unit's
    wall and CPU seconds (`unit_wall_s`, `unit_cpu_s`) as measured when it ran."""
    path = work / "units" / f"{name}.json"
    if path.is_file():
        return json.loads(path.read_text())
    print(f"[{time.strftime('%H:%M:%S')}] unit {name} ...", flush=True)
    wall0, cpu0 = time.perf_counter(), cpu_seconds()
    result = compute()
    result = {**result, "unit_wall_s": time.perf_counter() - wall0, "unit_cpu_s": cpu_seconds() - cpu0}
    write_json(path, result)
    print(
        f"[{time.strftime('%H:%M:%S')}] unit {name} done: {result['unit_wall_s']:.0f} s wall, "
        f"{result['unit_cpu_s']:.0f} s CPU",
        flush=True,
    )
    return result


def work_totals(work: Path) -> dict:
    """Wall and CPU seconds of every finished unit under WORK/units (what the whole experiment cost so far)."""
    wall = cpu = 0.0
    count = 0
    for path in sorted((work / "units").glob("*.json")):
        r = json.loads(path.read_text())
        wall += r.get("unit_wall_s", 0.0)
        cpu += r.get("unit_cpu_s", 0.0)
        count += 1
    return {"units": count, "wall_s": wall, "cpu_s": cpu}


# -------------------------------------------------------------------------------------------------------- data


def prepare_corpus(work: Path, scale: Scale) -> Path:
    """Tokenise the corpus once (MiniLM's bert-base-uncased vocab, one book = one document); every arm shares it.
    The held-out split (whole documents) is never trained on."""
    out = work / "data" / "corpus"

    def compute() -> dict:
        args = [
            "tokenize",
            *[CORPUS_ROOT / p for p in scale.corpus_inputs],
            "--output",
            out,
            "--tokenizer",
            minilm_path() / "vocab.txt",
            "--workers",
            "1",
            "--doc-boundary",
            "file",
            "--valid-fraction",
            str(scale.valid_fraction),
            "--split-seed",
            str(scale.split_seed),
            "--no-progress",
        ]
        run_cli("data_prep", args, work / "logs" / "data_corpus.log")
        manifest = json.loads((out / "manifest.json").read_text())
        return {
            "path": str(out),
            "command": "python -m data_prep " + " ".join(map(str, args)),
            "splits": {k: {"docs": v["docs"], "tokens": v["tokens"]} for k, v in manifest["splits"].items()},
            "heldout_documents": heldout_documents(manifest),
        }

    unit(work, "corpus", compute)
    return out


def heldout_documents(manifest: dict) -> list[str]:
    """Which input files the split hash sent to the held-out split (one file = one document here)."""
    from data_prep.workers import _is_valid_doc

    cfg = manifest["config"]
    return [
        s["key"]
        for s in manifest["sources"]
        if _is_valid_doc(s["key"], s["start"], cfg["split_seed"], cfg["valid_fraction"])
    ]


# ---------------------------------------------------------------------------------------------------- pretrain


@dataclass(frozen=True)
class Arm:
    """One pre-training configuration. `last_layer_only`: MLM + SOP at the top layer only (BERT-style control)."""

    name: str
    num_groups: int = 2
    gradient_equilibrium: bool = True
    last_layer_only: bool = False
    steps: int | None = None  # None: the scale's `steps`

    def total_steps(self, scale: Scale) -> int:
        return self.steps or scale.steps

    def stops(self, scale: Scale, extra: tuple[int, ...] = ()) -> list[int]:
        """Where the arm's `pretrain train` chunks end: the export points (and `extra`), then the last step."""
        total = self.total_steps(scale)
        points = {p for p in (*scale.export_at, *extra) if p < total} | {total}
        return sorted(points)

    def exports(self, scale: Scale) -> list[int]:
        total = self.total_steps(scale)
        return sorted({p for p in scale.export_at if p < total} | {total})


MULTI_EXIT_G2 = Arm("G2_ge", num_groups=2, gradient_equilibrium=True)
LAST_LAYER_ONLY = Arm("last_only", num_groups=1, gradient_equilibrium=False, last_layer_only=True)
MULTI_EXIT_G1 = Arm("G1_ge", num_groups=1, gradient_equilibrium=True)


def pretrain_args(arm: Arm, scale: Scale, seed: int, data: Path, run_dir: Path, ds_config: Path, stop: int) -> list:
    """`pretrain train` arguments: every value that changes what a step computes is set here, not inherited."""
    steps = arm.total_steps(scale)
    sets = [
        "model.init_from=minilm",
        *(f"model.{k}={v}" for k, v in MINILM_SHAPE.items()),
        "model.max_position_embeddings=512",
        "model.hidden_dropout_prob=0.1",
        "model.attention_probs_dropout_prob=0.1",
        f"data.corpora=[{{name: gutenberg_wikitext, path: {data}, weight: 1.0}}]",
        f"data.max_length={scale.seq_len}",
        "data.short_seq_prob=0.1",
        "data.masked_lm_prob=0.15",
        "data.max_ngram=3",
        "data.num_workers=0",
        f"exits.num_groups={arm.num_groups}",
        f"exits.gradient_equilibrium={str(arm.gradient_equilibrium).lower()}",
        f"exits.last_layer_only={str(arm.last_layer_only).lower()}",
        "optim.name=adamw",
        f"optim.lr={scale.lr}",
        f"optim.betas=[{scale.betas[0]}, {scale.betas[1]}]",
        "optim.eps=1e-6",
        f"optim.weight_decay={scale.weight_decay}",
        f"optim.warmup_steps={min(scale.warmup_steps, steps)}",
        "optim.decay=linear",
        "optim.min_lr_ratio=0.0",
        "optim.grad_clip=1.0",
        f"train.train_steps={steps}",
        f"train.stop_after_steps={stop}",
        f"train.global_batch_size={scale.global_batch}",
        f"train.micro_batch_size={scale.global_batch}",
        f"train.seed={seed}",
        f"train.ds_config={ds_config}",
        f"checkpoint.interval={max(1, min(100, steps))}",
        "checkpoint.keep_last=1",
        f"eval.interval={scale.eval_interval}",
        f"eval.max_samples={scale.eval_samples}",
        f"eval.micro_batch_size={min(32, scale.eval_samples)}",
        "logging.progress=false",
        "logging.tensorboard=false",
        "logging.peak_tflops=1.0",  # MFU is not used here; skips the start-up matmul-peak measurement
    ]
    args = ["train", "--config", "configs/tiny_cpu.yaml", "--output", str(run_dir)]
    for s in sets:
        args += ["--set", s]
    return args


def ds_config_for(precision: str) -> Path:
    return AUTOCAST_DS_CONFIG if precision == "bf16-autocast" else FP32_DS_CONFIG


def arm_run_name(arm: Arm, scale: Scale, seed: int, precision: str) -> str:
    suffix = "" if precision == scale.precision else f"_{precision}"
    return f"{arm.name}_s{arm.total_steps(scale)}_seed{seed}{suffix}"


def pretrain_chunk(
    work: Path, scale: Scale, arm: Arm, seed: int, data: Path, stop: int, precision: str | None = None
) -> dict:
    """Train `arm` up to step `stop` (resuming its run directory from `latest`), one unit per chunk."""
    precision = precision or scale.precision
    name = arm_run_name(arm, scale, seed, precision)
    run_dir = work / "runs" / name

    def compute() -> dict:
        args = pretrain_args(arm, scale, seed, data, run_dir, ds_config_for(precision), stop)
        wall = run_cli("pretrain", args, work / "logs" / f"pretrain_{name}.log")
        return {"run": name, "stop": stop, "process_wall_s": wall, "command": "python -m pretrain " + " ".join(args)}

    return unit(work, f"pretrain_{name}_to{stop}", compute)


def export(work: Path, scale: Scale, arm: Arm, seed: int, step: int) -> Path:
    """`pretrain export` of the arm's checkpoint at `step` (the chunk that ended there must have run)."""
    name = arm_run_name(arm, scale, seed, scale.precision)
    hf_dir = work / "hf" / f"{name}_step{step}"

    def compute() -> dict:
        from pretrain.__main__ import main as pretrain_main
        from pretrain.checkpoint import tag_for

        ckpt = work / "runs" / name / "checkpoints"
        args = ["export", "--checkpoint", str(ckpt), "--tag", tag_for(step), "--output", str(hf_dir), "--overwrite"]
        log = work / "logs" / f"pretrain_{name}.log"
        with open(log, "a", encoding="utf-8") as f:
            f.write("$ python -m pretrain " + " ".join(args) + "\n")
        code = _quietly(lambda: pretrain_main(args), log)  # in this process: no second torch start-up
        if code:
            raise RuntimeError(f"pretrain {' '.join(args)} failed with {code}; see {log}")
        return {"hf_dir": str(hf_dir), "step": step}

    unit(work, f"export_{name}_step{step}", compute)
    return hf_dir


def model_name(arm: Arm, scale: Scale, step: int) -> str:
    """The name an arm's export at `step` goes by in unit names and tables, e.g. G2_ge_s800@400."""
    return f"{arm.name}_s{arm.total_steps(scale)}@{step}"


def arm_of(name: str) -> str:
    """The arm a model name belongs to ("minilm" for the untouched weights)."""
    return name if name == "minilm" else name.split("@")[0].rsplit("_s", 1)[0]


def pretrain_arm(work: Path, scale: Scale, arm: Arm, seed: int, data: Path) -> dict[int, Path]:
    """Every chunk of an arm, exporting at each export point; returns {step: exported HF dir}."""
    exports = {}
    for stop in arm.stops(scale):
        pretrain_chunk(work, scale, arm, seed, data, stop)
        if stop in arm.exports(scale):
            exports[stop] = export(work, scale, arm, seed, stop)
    return exports


def run_summary(work: Path, scale: Scale, arm: Arm, seed: int, precision: str | None = None) -> dict:
    """Tokens, steps, per-step time and losses of a finished arm, from its metrics.jsonl / eval.jsonl."""
    from pretrain.metrics import latest_per_step, read_jsonl

    name = arm_run_name(arm, scale, seed, precision or scale.precision)
    run_dir = work / "runs" / name
    steps = latest_per_step(read_jsonl(run_dir / "metrics.jsonl"))
    records = [steps[k] for k in sorted(steps)]
    times = [r["step_time_s"] for r in records]
    evals = {}
    if (run_dir / "eval.jsonl").is_file():
        for r in read_jsonl(run_dir / "eval.jsonl"):
            evals[r["step"]] = {"mlm_loss": r["mlm_loss"], "sop_accuracy": r.get("sop_accuracy")}
    chunks = [json.loads(p.read_text()) for p in sorted((work / "units").glob(f"pretrain_{name}_to*.json"))]
    return {
        "run": name,
        "arm": asdict(arm),
        "seed": seed,
        "steps": len(records),
        "tokens": int(sum(r["tokens"] for r in records)),
        "token_slots": scale.tokens_slots(len(records)),
        "train_s": sum(times),  # sum of step times (excludes start-up, checkpoints, evaluation)
        "median_step_s": statistics.median(times[1:] or times),
        "process_wall_s": sum(c["process_wall_s"] for c in chunks),
        "process_cpu_s": sum(c.get("unit_cpu_s", 0.0) for c in chunks),
        "loss": [r["loss"] for r in records],
        "mlm_loss_active": [r["mlm_loss"] for r in records],
        "active_exits": [r["active_exits"] for r in records[:4]],
        "validation": {str(k): v for k, v in sorted(evals.items())},
        "commands": [c["command"] for c in chunks],
    }


# --------------------------------------------------------------------------------------------- held-out MLM loss


def heldout_mlm_loss(work: Path, scale: Scale, name: str, hf_dir: Path, corpus_dir: Path) -> dict:
    """Per-exit MLM loss and accuracy (token-weighted) on the same masked samples of the held-out split."""

    def compute() -> dict:
        import torch

        from elasticbert import ElasticBertForPreTraining, load_pretrained
        from pretrain.corpora import open_corpus
        from pretrain.data import MaskingConfig, PretrainingDataset, collate, load_or_build_index

        corpus = open_corpus(corpus_dir, "valid")
        index, _, _ = load_or_build_index(
            corpus, "valid", scale.seq_len, 0.0, HELDOUT_SAMPLE_SEED, [work / "heldout_index_cache"]
        )
        dataset = PretrainingDataset(corpus, index, MaskingConfig(scale.seq_len, seed=HELDOUT_MASK_SEED))
        picks = [int(i) for i in torch.linspace(0, len(dataset) - 1, scale.heldout_samples).round().tolist()]
        model, _ = load_pretrained(ElasticBertForPreTraining, hf_dir)
        model.eval()
        exits = tuple(range(1, model.config.num_hidden_layers + 1))
        loss_sum = torch.zeros(len(exits), dtype=torch.float64)
        correct_sum = torch.zeros(len(exits), dtype=torch.float64)
        masked = 0.0
        with torch.no_grad():
            for b in range(0, len(picks), 32):
                batch = collate([dataset[i] for i in picks[b : b + 32]], int(corpus.special_ids["pad"]))
                out = model(**batch, active_exits=exits, gradient_equilibrium=False)
                n = float((batch["mlm_labels"] != -100).sum())
                loss_sum += out.mlm_loss.double() * n
                correct_sum += out.mlm_accuracy.double() * n
                masked += n
        return {
            "model": name,
            "exits": list(exits),
            "samples": len(picks),
            "masked_tokens": int(masked),
            "mlm_loss": (loss_sum / masked).tolist(),
            "mlm_accuracy": (correct_sum / masked).tolist(),
        }

    return unit(work, f"heldout_{name}", compute)


# -------------------------------------------------------------------------------------------------- fine-tuning


def finetune_args(budget: FinetuneBudget, model_dir: Path, task: str, layers: int, seed: int, output: Path) -> list:
    """Every hyper-parameter explicit: `finetune train`'s defaults are not relied on."""
    args = [
        "train",
        "--model",
        str(model_dir),
        "--tokenizer",
        str(minilm_path()),  # the same bert-base-uncased vocabulary for every model
        "--task",
        task,
        "--data-dir",
        str(GLUE_DIR),
        "--output",
        str(output),
        "--layers",
        str(layers),
        "--exit-type",
        "linear",
        "--max-length",
        str(budget.max_length),
        "--epochs",
        str(budget.epochs),
        "--lr",
        str(budget.lr),
        "--exit-lr",
        str(budget.lr),
        "--batch-size",
        str(budget.batch_size),
        "--eval-batch-size",
        "64",
        "--warmup-fraction",
        str(budget.warmup),
        "--weight-decay",
        str(budget.weight_decay),
        "--dropout",
        str(budget.dropout),
        "--grad-clip",
        str(budget.grad_clip),
        "--objective",
        "ce",
        "--no-gradient-equilibrium",
        "--seed",
        str(seed),
        "--eval-every",
        "1000000",  # one dev evaluation, at the end: nothing is chosen on the dev rows
        "--no-progress",
    ]
    if budget.train_examples is not None:
        args += ["--max-train-examples", str(budget.train_examples)]
    if budget.dev_examples is not None:
        args += ["--max-dev-examples", str(budget.dev_examples), "--dev-subset-seed", "0"]
    return args


def finetune_static(
    work: Path, budget: FinetuneBudget, model_name: str, model_dir: Path, task: str, layers: int, seed: int
) -> dict:
    """Static fine-tune of the first `layers` layers; dev score at the end of training (no checkpoint selection).

    Runs `finetune train` in this process (same argument parser, same code) instead of a subprocess: with ~100
    fine-tunes the ~10 s interpreter + torch start-up of a subprocess would be a large share of the budget."""

    def compute() -> dict:
        import shutil

        from finetune.__main__ import main as finetune_main

        output = work / "ft" / finetune_unit_name(budget, model_name, task, layers, seed)
        shutil.rmtree(output, ignore_errors=True)  # a half-written run from a killed attempt
        args = finetune_args(budget, model_dir, task, layers, seed, output)
        log = work / "logs" / f"finetune_{model_name}_{task}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a", encoding="utf-8") as f:
            f.write("$ python -m finetune " + " ".join(args) + "\n")
        code = _quietly(lambda: finetune_main(args), log)
        if code:
            raise RuntimeError(f"finetune {' '.join(args)} failed with {code}; see {log}")
        scores = json.loads((output / "dev_scores.json").read_text())
        final = scores["history"][-1]["exits"][str(layers)]
        shutil.rmtree(output / "best", ignore_errors=True)  # weights: tens of MB each, not needed again
        return {
            "model": model_name,
            "task": task,
            "layers": layers,
            "seed": seed,
            "dev_examples": scores["dev_examples"],
            "train_examples": scores["train_examples"],
            **{k: float(v) for k, v in final.items()},
        }

    return unit(work, finetune_unit_name(budget, model_name, task, layers, seed), compute)


def finetune_unit_name(budget: FinetuneBudget, model_name: str, task: str, layers: int, seed: int) -> str:
    """The budget is part of the name: a changed budget never reuses a stale result."""
    size = budget.train_examples or "all"
    return f"ft_{model_name}_{task}_n{size}_e{budget.epochs:g}_lr{budget.lr:g}_L{layers}_seed{seed}"


def majority_baseline(task: str, dev_examples: int | None) -> dict:
    """Dev metrics of the best constant prediction on the dev rows the fine-tunes and probes are scored on."""
    import numpy as np

    from finetune.data import subsample
    from finetune.tasks import compute_metrics, get_task, load_split

    spec = get_task(task)
    dev = subsample(load_split(spec, GLUE_DIR, "dev"), dev_examples, 0)
    labels = np.array([e.label for e in dev])
    constant = [compute_metrics(spec, np.full(len(dev), c), labels) for c in range(spec.num_labels)]
    return {k: float(v) for k, v in max(constant, key=lambda m: m["score"]).items()}


def _quietly(fn: Callable[[], int | None], log: Path) -> int:
    """Run fn with stdout/stderr (file descriptors too: progress bars, warnings) appended to log."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log, "a", encoding="utf-8") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            return int(fn() or 0)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


# ---------------------------------------------------------------------------------------------------- reporting


def all_finite(values: list[float]) -> bool:
    return all(isinstance(v, int | float) and math.isfinite(v) for v in values)


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def verdict(out: Path) -> str:
    """The hand-written verdict (OUT/verdict.md), kept apart so regenerating section.md never loses it."""
    path = out / "verdict.md"
    if path.is_file():
        return path.read_text(encoding="utf-8").strip()
    return "**Verdict:** _not written yet: put it in verdict.md next to this file and rerun the script._"


def resolve_out(out: str | None, name: str) -> Path:
    from experiments.common import RESULTS_DIR

    if out is None:
        return RESULTS_DIR / name
    path = Path(out)
    return path if path.is_absolute() else REPO / path
