"""Shared machinery of the two pre-training experiments (pretrain_exits.py, grouping.py).

Both continue pre-training the MiniLM checkpoint on Project Gutenberg with the project's own CLIs (`data_prep
tokenize`, `pretrain train`, `pretrain export`, `finetune train`), so the numbers come from the shipped code paths.
Every finished unit of work (one pre-training arm, one held-out evaluation, one fine-tune) leaves a small JSON under
`WORK/units/`, written atomically; a rerun skips it, so a crash or a kill costs only the unit in flight.

The BERT-style baseline arm (MLM + SOP at the last layer only) is `pretrain train` with
`exits.last_layer_only=true`.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from experiments.common import GLUE_DIR, REPO, SHARED_DATA, run_cli, write_json

GUTENBERG = SHARED_DATA / "corpus" / "gutenberg"
MODEL_LAYERS = 6  # MiniLM: 6 layers, hidden 384, 12 heads, FFN 1536
HELDOUT_MASK_SEED = 0  # masking of the held-out samples: identical for every arm
HELDOUT_SAMPLE_SEED = 0  # sample index (packing) of the held-out books


@dataclass(frozen=True)
class Scale:
    """Every size an experiment depends on; written into results.json so a table says what produced it."""

    train_books: tuple[str, ...]  # Gutenberg files used for pre-training
    heldout_books: tuple[str, ...]  # other books: held-out MLM loss (never trained on)
    seq_len: int
    global_batch: int
    pretrain_steps: int
    lr: float
    warmup_steps: int
    heldout_samples: int
    sst2_train: int
    sst2_dev: int | None  # None: the full dev set (872)
    sst2_max_length: int
    mrpc_train: int
    mrpc_dev: int | None  # None: the full dev set (408)
    mrpc_max_length: int
    ft_epochs: int
    ft_lr: float
    ft_batch: int
    layers: tuple[int, ...]


SCALES = {
    "smoke": Scale(
        train_books=("11-0.txt", "1952-0.txt"),
        heldout_books=("41-0.txt",),
        seq_len=64,
        global_batch=4,
        pretrain_steps=2,
        lr=2e-4,
        warmup_steps=1,
        heldout_samples=8,
        sst2_train=32,
        sst2_dev=32,
        sst2_max_length=32,
        mrpc_train=32,
        mrpc_dev=32,
        mrpc_max_length=48,
        ft_epochs=1,
        ft_lr=1.5e-4,
        ft_batch=16,
        layers=(1, 6),
    ),
    "report": Scale(
        train_books=("11-0.txt", "1155-0.txt", "120-0.txt", "1237-0.txt", "140-0.txt", "16-0.txt"),
        heldout_books=("41-0.txt", "43-0.txt", "46-0.txt"),
        seq_len=128,
        global_batch=16,
        pretrain_steps=16,
        lr=2e-4,
        warmup_steps=2,
        heldout_samples=128,
        sst2_train=320,
        sst2_dev=200,
        sst2_max_length=40,
        mrpc_train=320,
        mrpc_dev=200,
        mrpc_max_length=56,
        ft_epochs=1,
        ft_lr=1.5e-4,
        ft_batch=8,
        layers=(1, 2, 3, 4, 5, 6),
    ),
}


def data_available() -> str | None:
    """None when the shared data is present, else why the experiments cannot run (tests skip with it)."""
    for path in (GUTENBERG, GLUE_DIR / "SST-2", GLUE_DIR / "MRPC"):
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


def unit(work: Path, name: str, compute: callable) -> dict:
    """Result of one unit of work, computed once: WORK/units/NAME.json is the proof it finished."""
    path = work / "units" / f"{name}.json"
    if path.is_file():
        return json.loads(path.read_text())
    result = compute()
    write_json(path, result)
    return result


# -------------------------------------------------------------------------------------------------------- data


def prepare_corpus(work: Path, name: str, books: tuple[str, ...]) -> Path:
    """Tokenise books once with the MiniLM (bert-base-uncased) vocab; shared by every arm and seed."""
    out = work / "data" / name
    if (out / "manifest.json").is_file():
        return out
    run_cli(
        "data_prep",
        [
            "tokenize",
            *[GUTENBERG / b for b in books],
            "--output",
            out,
            "--tokenizer",
            minilm_path() / "vocab.txt",
            "--workers",
            "1",
            "--valid-fraction",
            "0.01",
            "--no-progress",
        ],
        work / "logs" / f"data_{name}.log",
    )
    return out


# ---------------------------------------------------------------------------------------------------- pretrain


@dataclass(frozen=True)
class Arm:
    """One pre-training configuration. `exits="last"`: MLM+SOP at the top layer only (BERT-style baseline)."""

    exits: str  # "grouped" | "last"
    num_groups: int = 2
    gradient_equilibrium: bool = True
    steps: int | None = None  # None: the scale's pretrain_steps

    def key(self, scale: Scale) -> str:
        steps = self.steps or scale.pretrain_steps
        if self.exits == "last":
            return f"last_s{steps}"
        return f"G{self.num_groups}{'ge' if self.gradient_equilibrium else 'noge'}_s{steps}"


MULTI_EXIT_G2 = Arm("grouped", num_groups=2, gradient_equilibrium=True)
LAST_LAYER_ONLY = Arm("last", num_groups=1, gradient_equilibrium=False)


def pretrain_args(arm: Arm, scale: Scale, seed: int, data: Path, run_dir: Path) -> list[str]:
    """`pretrain train` arguments: tiny_cpu.yaml with the demo's MiniLM overrides; only exits and seed vary."""
    steps = arm.steps or scale.pretrain_steps
    sets = [
        "model.init_from=minilm",
        "model.hidden_size=384",
        f"model.num_hidden_layers={MODEL_LAYERS}",
        "model.num_attention_heads=12",
        "model.intermediate_size=1536",
        "model.max_position_embeddings=512",
        f"data.corpora=[{{name: gutenberg, path: {data}, weight: 1.0}}]",
        f"data.max_seq_len={scale.seq_len}",
        f"train.train_steps={steps}",
        f"train.global_batch_size={scale.global_batch}",
        f"train.micro_batch_size={scale.global_batch}",
        f"train.seed={seed}",
        f"optim.lr={scale.lr}",
        f"optim.warmup_steps={min(scale.warmup_steps, steps)}",
        f"exits.num_groups={arm.num_groups}",
        f"exits.gradient_equilibrium={str(arm.gradient_equilibrium).lower()}",
        f"exits.last_layer_only={str(arm.exits == 'last').lower()}",
        f"checkpoint.interval={steps}",
        "checkpoint.keep_last=1",
        "eval.interval=0",
        "logging.progress=false",
        "logging.tensorboard=false",
    ]
    args = ["train", "--config", "configs/tiny_cpu.yaml", "--output", str(run_dir)]
    for s in sets:
        args += ["--set", s]
    return args


def pretrain(work: Path, scale: Scale, arm: Arm, seed: int, data: Path) -> dict:
    """Pre-train one arm from MiniLM (1 process, DeepSpeed CPU fp32), export it; per-step times and losses."""

    def compute() -> dict:
        name = f"{arm.key(scale)}_seed{seed}"
        run_dir = work / "runs" / name
        hf_dir = work / "hf" / name
        log = work / "logs" / f"pretrain_{name}.log"
        args = pretrain_args(arm, scale, seed, data, run_dir)
        wall = run_cli("pretrain", args, log)
        run_cli("pretrain", ["export", "--checkpoint", run_dir / "checkpoints", "--output", hf_dir, "--overwrite"], log)
        from pretrain.metrics import latest_per_step, read_jsonl

        steps = latest_per_step(read_jsonl(run_dir / "metrics.jsonl"))
        records = [steps[k] for k in sorted(steps)]
        step_times = [r["step_time_s"] for r in records]
        return {
            "arm": asdict(arm),
            "seed": seed,
            "hf_dir": str(hf_dir),
            "process_wall_s": wall,
            "train_s": sum(step_times),
            "step_time_s": step_times,
            # step 1 pays one-off costs (allocations, first DataLoader batch): left out of the typical step
            "median_step_s": statistics.median(step_times[1:] or step_times),
            "loss": [r["loss"] for r in records],
            "active_exits": [r["active_exits"] for r in records],
            "final_train_mlm_loss": records[-1]["mlm_loss"],
            "command": "python -m pretrain " + " ".join(args),
        }

    return unit(work, f"pretrain_{arm.key(scale)}_seed{seed}", compute)


# --------------------------------------------------------------------------------------------- held-out MLM loss


def heldout_mlm_loss(work: Path, scale: Scale, name: str, hf_dir: Path, heldout: Path) -> dict:
    """Per-exit MLM loss and accuracy (token-weighted) on the same masked samples of books never trained on."""

    def compute() -> dict:
        import torch

        from elasticbert import ElasticBertForPreTraining, load_pretrained
        from pretrain.corpora import open_corpus
        from pretrain.data import MaskingConfig, PretrainingDataset, collate, load_or_build_index

        corpus = open_corpus(heldout, "train")  # every sample of these books is held out
        index, _, _ = load_or_build_index(
            corpus, "train", scale.seq_len, 0.0, HELDOUT_SAMPLE_SEED, [heldout / "index_cache"]
        )
        dataset = PretrainingDataset(corpus, index, MaskingConfig(scale.seq_len, seed=HELDOUT_MASK_SEED))
        # evenly spaced samples across the books, the same for every model
        picks = [int(i) for i in torch.linspace(0, len(dataset) - 1, scale.heldout_samples).round().tolist()]
        model, _ = load_pretrained(ElasticBertForPreTraining, hf_dir)
        model.eval()
        exits = tuple(range(1, model.config.num_hidden_layers + 1))
        loss_sum = torch.zeros(len(exits), dtype=torch.float64)
        correct_sum = torch.zeros(len(exits), dtype=torch.float64)
        masked = 0.0
        start = time.perf_counter()
        with torch.no_grad():
            for b in range(0, len(picks), 16):
                batch = collate([dataset[i] for i in picks[b : b + 16]], int(corpus.special_ids["pad"]))
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
            "seconds": time.perf_counter() - start,
        }

    return unit(work, f"heldout_{name}", compute)


# -------------------------------------------------------------------------------------------------- fine-tuning

TASK_SIZES = {
    "SST-2": ("sst2_train", "sst2_dev", "sst2_max_length"),
    "MRPC": ("mrpc_train", "mrpc_dev", "mrpc_max_length"),
}


def finetune_args(scale: Scale, model_dir: Path, task: str, layers: int, seed: int, output: Path) -> list[str]:
    train_n, dev_n, max_len = (getattr(scale, f) for f in TASK_SIZES[task])
    args = [
        "train",
        "--model",
        str(model_dir),
        "--task",
        task,
        "--data-dir",
        str(GLUE_DIR),
        "--output",
        str(output),
        "--layers",
        str(layers),
        "--max-train-examples",
        str(train_n),
        "--max-length",
        str(max_len),
        "--epochs",
        str(scale.ft_epochs),
        "--lr",
        str(scale.ft_lr),
        "--batch-size",
        str(scale.ft_batch),
        "--seed",
        str(seed),
        "--no-progress",
    ]
    if dev_n is not None:  # each seed its own dev rows: how the committed results were made
        args += ["--max-dev-examples", str(dev_n), "--dev-subset-seed", str(seed)]
    return args


def finetune_static(
    work: Path, scale: Scale, model_name: str, model_dir: Path, task: str, layers: int, seed: int
) -> dict:
    """Static fine-tune of the first `layers` layers; dev score at the end of training (one evaluation).

    Runs `finetune train` in this process (same argument parser, same code) instead of a subprocess: with ~100
    fine-tunes the ~10 s interpreter + torch start-up of a subprocess would be a third of the CPU budget."""

    def compute() -> dict:
        import shutil

        from finetune.__main__ import main as finetune_main

        output = work / "ft" / f"{model_name}_{task}_L{layers}_seed{seed}"
        shutil.rmtree(output, ignore_errors=True)  # a half-written run from a killed attempt
        args = finetune_args(scale, model_dir, task, layers, seed, output)
        log = work / "logs" / f"finetune_{model_name}_{task}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        with open(log, "a", encoding="utf-8") as f:
            f.write("$ python -m finetune " + " ".join(args) + "\n")
        code = _quietly(lambda: finetune_main(args), log)
        if code:
            raise RuntimeError(f"finetune {' '.join(args)} failed with {code}; see {log}")
        seconds = time.perf_counter() - start
        scores = json.loads((output / "dev_scores.json").read_text())
        final = scores["history"][-1]["exits"][str(layers)]
        shutil.rmtree(output / "best", ignore_errors=True)  # weights: tens of MB each, not needed again
        return {
            "model": model_name,
            "task": task,
            "layers": layers,
            "seed": seed,
            "seconds": seconds,
            "dev_examples": scores["dev_examples"],
            "train_examples": scores["train_examples"],
            **{k: float(v) for k, v in final.items()},
        }

    return unit(work, f"ft_{model_name}_{task}_L{layers}_seed{seed}", compute)


def majority_baseline(scale: Scale, task: str, seed: int) -> dict:
    """Dev metrics of the best constant prediction on the exact dev subset a fine-tune with this seed sees
    (`finetune` subsamples dev with the run's seed): the floor a score must clear to show any learning."""
    import numpy as np

    from finetune.data import subsample
    from finetune.tasks import compute_metrics, get_task, load_split

    spec = get_task(task)
    _, dev_n, _ = (getattr(scale, f) for f in TASK_SIZES[task])
    dev = subsample(load_split(spec, GLUE_DIR, "dev"), dev_n, seed)
    labels = np.array([e.label for e in dev])
    constant = [compute_metrics(spec, np.full(len(dev), c), labels) for c in range(spec.num_labels)]
    return {k: float(v) for k, v in max(constant, key=lambda m: m["score"]).items()}


def _quietly(fn: callable, log: Path) -> int:
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
