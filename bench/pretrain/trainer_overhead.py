"""The trainer's optimizer step against the model's own step, side by side in one run, with the host syncs of each.

For each (size, precision) it builds the real `pretrain.trainer.Trainer` (the real DeepSpeed engine, ZeRO-1, the
generated DeepSpeed config, metrics and TensorBoard as in a run) on a synthetic corpus, takes `2 x accumulation`
micro-batches from its loader, and times, in alternating rounds:

  trainer  `Trainer.optimizer_step`: everything a training step does (data from memory, host->device copies, the
           engine's forward/backward/step, the statistics, the one all-reduce and read, the guards, the record)
  bare     the same model (same initial weights), the same batches, precision and AdamW in a plain loop: forward,
           backward (loss / accumulation), gradient clipping, the optimizer step; bf16 / fp16 as autocast (the
           model's step as issue 51 measured it, bench/gpu/gpu_bench.py's), fp32 as it is; torch's fused AdamW on a GPU
           (what the trainer's default `optim.backend: torch` hands DeepSpeed), foreach on the CPU

at micro-batch 32 and gradient accumulation 2 (the 64-V100 layout: 32 x 2 x 64 ranks = 4,096), then counts the host
syncs of a few steps of each (`bench/pretrain/host_syncs.py`: per step, by origin, with where each comes from). Prints
the ratio trainer / bare (goal <= 1.10) and the MFU of both (useful FLOPs of the active exits over the device's peak).

    python bench/pretrain/trainer_overhead.py                                  # tiny and base, fp32 and bf16, CPU
    python bench/pretrain/trainer_overhead.py --sizes base --precisions bf16 --device cuda --output OUT
    python bench/pretrain/trainer_overhead.py --sizes tiny --precisions fp32 --quick        # CI smoke

Each configuration runs in its own process (one process group, one engine each); the parent prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import cycle, islice
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: bench.harness and the packages

from bench.harness import REPO, write_result  # noqa: E402

SIZES = {  # the run config each size starts from, and what it changes
    "tiny": ("configs/tiny_cpu.yaml", []),
    "base": ("configs/elasticbert_base_scratch.yaml", ["model.vocab_size=30522"]),
    "mid": (  # MiniLM-L6's shape with bert-base's vocabulary: base-like, and a CPU runs it in minutes
        "configs/elasticbert_base_scratch.yaml",
        ["model.vocab_size=30522", "model.hidden_size=384", "model.num_hidden_layers=6"]
        + ["model.num_attention_heads=6", "model.intermediate_size=1536"],
    ),
}
WORDS = 3000


def synthetic_corpus(root: Path, docs: int = 400, seed: int = 0) -> Path:
    """A prepared corpus made here, through data_prep itself (no ../shared on a GPU box): a WordPiece vocabulary
    of generated words and documents of sentences drawn from it."""
    import torch

    from data_prep import tokenize_corpus

    root.mkdir(parents=True, exist_ok=True)
    rng = torch.Generator().manual_seed(seed)
    words = [f"w{i}" for i in range(WORDS)]
    specials = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    (root / "vocab.txt").write_text("\n".join(specials + [".", ","] + words) + "\n", encoding="utf-8")
    texts = []
    for _ in range(docs):
        sentences = []
        for _ in range(int(torch.randint(2, 12, (1,), generator=rng))):
            n = int(torch.randint(4, 30, (1,), generator=rng))
            ids = torch.randint(0, WORDS, (n,), generator=rng).tolist()
            sentences.append(" ".join(words[i] for i in ids).capitalize() + ".")
        texts.append(" ".join(sentences))
    (root / "text.txt").write_text("\n\n".join(texts) + "\n", encoding="utf-8")
    out = root / "prepared"
    if not (out / "manifest.json").is_file():
        tokenize_corpus(
            [str(root / "text.txt")], out, tokenizer=str(root / "vocab.txt"), workers=1, valid_fraction=0.05
        )
    return out


def run_config(size: str, precision: str, corpus: Path, micro: int, accum: int, seq: int) -> list[str]:
    config, extra = SIZES[size]
    sets = [
        f"data.corpora=[{{name: synthetic, path: {corpus}, weight: 1.0}}]",
        f"data.max_length={seq}",
        "data.num_workers=0",
        "data.verify=false",
        f"train.micro_batch_size={micro}",
        f"train.global_batch_size={micro * accum}",
        "train.train_steps=1000000",
        f"train.precision={precision}",
        "train.ds_config=ds_configs/zero1.json",
        "checkpoint.interval=1000000",
        "eval.interval=0",
        "logging.tensorboard=true",
        "logging.tb_interval=10",
        "logging.progress=false",
        *extra,
    ]
    return [config, *sets]


class BareLoop:
    """The model's own optimizer step, as issue 51 measured it (and bench/gpu/gpu_bench.py does): fp32 weights under
    autocast in bf16 / fp16 (fp16 with a gradient scaler), the loss / accumulation backward per micro-batch, gradient
    clipping, torch's AdamW (fused on a GPU, foreach on the CPU), no DeepSpeed, no trainer."""

    def __init__(self, model: Any, precision: str, device: str, optim: Any, accum: int, equilibrium: bool) -> None:
        import torch

        from pretrain.model_setup import param_groups

        self.torch, self.device, self.accum, self.equilibrium = torch, device, accum, equilibrium
        self.model = model.to(device).train()
        self.clip = float(optim.grad_clip)
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        self.scaler = torch.amp.GradScaler(device.split(":")[0], enabled=precision == "fp16")
        groups = param_groups(self.model, optim.weight_decay)
        self.params = [p for g in groups for p in g["params"]]
        cuda = device.startswith("cuda")
        self.optimizer = torch.optim.AdamW(
            groups,
            lr=optim.lr,
            betas=tuple(optim.betas),
            eps=optim.eps,
            fused=cuda or None,
            foreach=None if cuda else True,
        )

    def step(self, micro_batches: list[dict[str, Any]], active: tuple[int, ...]) -> None:
        torch = self.torch
        kind = self.device.split(":")[0]
        for batch in micro_batches:
            batch = {k: t.to(self.device, non_blocking=True) for k, t in batch.items() if k != "keys"}
            with torch.autocast(kind, dtype=self.dtype or torch.float32, enabled=self.dtype is not None):
                out = self.model(**batch, active_exits=active, gradient_equilibrium=self.equilibrium)
            self.scaler.scale(out.loss / self.accum).backward()
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.params, self.clip, foreach=True)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """One (size, precision) in this process: both arms timed in alternating rounds, then their host syncs."""
    import torch

    from bench.pretrain.host_syncs import count_host_syncs
    from pretrain.config import load_config
    from pretrain.mfu import model_flops_utilization, peak_flops
    from pretrain.model_setup import build_model
    from pretrain.trainer import Trainer

    if args.threads:
        torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="eb_overhead_"))
    corpus = synthetic_corpus(work / "corpus") if args.data is None else Path(args.data)
    config, *sets = run_config(args.size, args.precision, corpus, args.micro_batch, args.accumulation, args.seq)
    cfg = load_config(REPO / config, sets)
    trainer = Trainer(cfg, work / "run", None, force_resume=False)
    try:
        trainer._setup()
        trainer._announce()
        device = str(trainer.engine.device)
        loader = iter(trainer.loader)
        micro = [next(loader) for _ in range(2 * args.accumulation)]  # two steps' worth, cycled
        model, _ = build_model(cfg, int(trainer.data.special_ids["vocab_size"]), trainer.data.tokenizer_dir)
        bare = BareLoop(model, trainer.precision, device, cfg.optim, args.accumulation, cfg.exits.gradient_equilibrium)
        groups = trainer.groups
        feed = cycle(micro)
        step_n = [0]

        def bare_step() -> None:
            bare.step(list(islice(feed, args.accumulation)), groups[step_n[0] % len(groups)])
            step_n[0] += 1

        arms = {"trainer": lambda: trainer.optimizer_step(feed), "bare": bare_step}
        for arm in arms.values():
            for _ in range(args.warmup):
                arm()
        _sync(device)
        times: dict[str, list[float]] = {name: [] for name in arms}
        for i in range(args.steps):  # one step of each, alternating which goes first: pairs taken under one load
            for name in list(arms)[:: 1 if i % 2 == 0 else -1]:
                _sync(device)
                t0 = time.perf_counter()
                arms[name]()
                _sync(device)
                times[name].append(time.perf_counter() - t0)
        syncs = {}
        for name, arm in arms.items():
            with count_host_syncs() as counter:
                for _ in range(args.count_steps):
                    with counter.step():
                        arm()
            syncs[name] = {
                "per_step": {o: counter.per_step(o) for o in ("trainer", "model", "deepspeed", "torch", "other")},
                "report": counter.report(),
                "how": counter.how,
            }
        tokens = sum(float(b["attention_mask"].sum()) for b in micro) / 2
        masked = sum(float((b["mlm_labels"] != -100).sum()) for b in micro) / 2
        peak = peak_flops(cfg.logging.peak_tflops, "cuda" if device.startswith("cuda") else "cpu", trainer.precision)
        mean = {name: statistics.median(ts) for name, ts in times.items()}
        active = groups[0]
        mfu = {
            name: model_flops_utilization(
                trainer.model_config,
                active,
                tokens,
                masked,
                micro[0]["input_ids"].shape[0] * args.accumulation,
                seconds,
                peak,
                1,
            )
            if peak
            else None
            for name, seconds in mean.items()
        }
        return {
            "size": args.size,
            "precision": trainer.precision,
            "device": device,
            "micro_batch": args.micro_batch,
            "accumulation": args.accumulation,
            "seq": args.seq,
            "hidden": trainer.model_config.hidden_size,
            "layers": trainer.model_config.num_hidden_layers,
            "step_s": mean,
            "steps_s": times,
            "ratio": statistics.median(t / b for t, b in zip(times["trainer"], times["bare"])),
            "pair_ratios": [t / b for t, b in zip(times["trainer"], times["bare"])],
            "mfu": mfu,
            "peak_tflops": round(peak / 1e12, 2) if peak else None,
            "syncs": syncs,
        }
    finally:
        trainer.metrics.close()
        trainer.group.leave()
        trainer.lock.release()


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| size | precision | device | micro x accum | trainer step | bare step | ratio: median (quartiles) | "
        "MFU trainer / bare | "
        "host syncs per step: trainer's code / model / DeepSpeed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        s = r["syncs"]["trainer"]["per_step"]
        per = "/".join(f"{statistics.fmean(s[o]):.0f}" for o in ("trainer", "model", "deepspeed"))
        mfu = " / ".join(f"{v:.1%}" if v is not None else "–" for v in r["mfu"].values())
        q = statistics.quantiles(r["pair_ratios"], n=4) if len(r["pair_ratios"]) > 1 else [r["ratio"]] * 3
        rounds = f"{q[0]:.2f}-{q[2]:.2f}"
        lines.append(
            f"| {r['size']} (h{r['hidden']}, L{r['layers']}, seq {r['seq']}) | {r['precision']} | {r['device']} | "
            f"{r['micro_batch']} x {r['accumulation']} | {r['step_s']['trainer'] * 1e3:.1f} ms | "
            f"{r['step_s']['bare'] * 1e3:.1f} ms | **{r['ratio']:.2f}x** ({rounds}) | {mfu} | {per} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["tiny", "base"], choices=sorted(SIZES))
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16", "fp16", "auto"])
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--micro-batch", type=int, default=32)
    ap.add_argument("--accumulation", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None, help="timed steps per arm, alternated (default 8; quick 3)")
    ap.add_argument("--count-steps", type=int, default=2, help="steps whose host syncs are counted, per arm")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (default 1: steadier on a shared box)")
    ap.add_argument("--quick", action="store_true", help="1 warm-up step, 3 timed (CI smoke)")
    ap.add_argument("--data", default=None, help="a prepared corpus (default: a synthetic one made here)")
    ap.add_argument("--output", type=Path, default=None, help="write trainer_overhead.json (+ .md) here")
    ap.add_argument("--one", nargs=2, metavar=("SIZE", "PRECISION"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    args.steps = args.steps if args.steps is not None else (3 if args.quick else 8)
    if args.one:
        args.size, args.precision = args.one
        print("RESULT " + json.dumps(measure(args)), flush=True)
        return 0
    return run_all(args)


def run_all(args: argparse.Namespace) -> int:
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    env = {**os.environ, "DS_ACCELERATOR": device, "PYTHONUNBUFFERED": "1"}
    env.pop("RANK", None)
    passed = _drop_values(sys.argv[1:], ("--sizes", "--precisions", "--output", "--device"))
    results = []
    for size in args.sizes:
        for precision in args.precisions:
            cmd = [sys.executable, __file__, *passed, "--one", size, precision]
            run = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
            found = [line[7:] for line in run.stdout.splitlines() if line.startswith("RESULT ")]
            if run.returncode != 0 or not found:
                print(f"{size} {precision}: failed (exit {run.returncode})\n{run.stdout[-3000:]}{run.stderr[-3000:]}")
                return 1
            result = json.loads(found[0])
            results.append(result)
            print(f"\n== {size}, {result['precision']} on {result['device']}: trainer {result['ratio']:.2f}x bare")
            for arm in ("trainer", "bare"):
                print(f"-- {arm}: {result['syncs'][arm]['report']}")
    print("\n" + table(results))
    if args.output:
        args.output.mkdir(parents=True, exist_ok=True)
        write_result(args.output / "trainer_overhead.json", results)
        (args.output / "trainer_overhead.md").write_text(table(results) + "\n")
    return 0


def _drop_values(argv: list[str], options: tuple[str, ...]) -> list[str]:
    """argv without the given options and their values (the parent's choices, not the child's)."""
    out, skipping = [], False
    for a in argv:
        if a.startswith("--"):
            skipping = a.split("=")[0] in options
            if skipping:
                continue
        elif skipping:
            continue
        out.append(a)
    return out


if __name__ == "__main__":
    sys.exit(main())
