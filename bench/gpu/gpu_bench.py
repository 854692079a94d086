"""The GPU half of bench/gpu/gpu_check.sh: what the project's figures look like on an accelerator, and the check's
report.

1. Pre-training step at ElasticBERT-base size (hidden 768, 12 layers, bert-base vocab): seq 128 and 512, MLM logits
   at masked positions only (the model's own sparse head), bf16 autocast where the GPU has it (else fp16 autocast),
   fused AdamW; G=2 (the default grouping: the groups alternate step by step) vs G=1 (all 12 exits every step);
   tokens/s and useful FLOP/s (`elasticbert.flops.training_flops_per_token`) against the device's dense peak
   (`pretrain.mfu`), timed with CUDA events after warm-up; and the first seq at G=2 with `train.compile`'s path.
2. Early exit: a base-size classifier with six MHA exits (random weights whose exit heads are scaled up, so the
   entropy rule spreads samples over the exits: the speed-up ratio needs exits, not accuracy), entropy thresholds
   picked for ≈ 1.5×, 2× and 3× fewer FLOPs; wall-time speed-up ÷ FLOPs speed-up at batch 1 and 32, the full
   model's own forward on the same batches as the reference.
`--device cpu --quick` runs the same code at toy sizes (CI's smoke test of bench/gpu/gpu_check.sh). `--parts` picks what
runs (none: only the report, gpu_check.sh --fast).

The report (OUTPUT/gpu_check.md, printed) ends with ONE table, the check's verdict: every test (pass / fail / skip,
seconds), the trainer's optimizer step against the bare model step (bench/pretrain/trainer_overhead.py: the ratio, goal
<= 1.10; host syncs per step; MFU of both), and the model step's MFU when measured here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: bench.harness and the packages

from bench.gpu import queued_gpu  # noqa: E402
from bench.harness import bert_size, write_result  # noqa: E402
from elasticbert import ElasticBertConfig, ElasticBertForPreTraining, exit_groups  # noqa: E402
from elasticbert.flops import training_flops_per_token  # noqa: E402
from pretrain.model_setup import compile_model  # noqa: E402


class Timer:
    """Wall time of a block: CUDA events on a GPU (device time, no host sync inside), perf_counter on the CPU."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")

    def __enter__(self) -> Timer:
        if self.cuda:
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.cuda:
            self.end.record()
            torch.cuda.synchronize()
            self.seconds = self.start.elapsed_time(self.end) / 1e3
        else:
            self.seconds = time.perf_counter() - self.t0


def autocast_dtype(device: str) -> torch.dtype | None:
    if not device.startswith("cuda"):
        return None
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def peak_flops(device: str, dtype: torch.dtype | None) -> float | None:
    from pretrain.mfu import GPU_PEAK_TFLOPS

    if not device.startswith("cuda"):
        return None
    name = torch.cuda.get_device_name()
    for key, tflops in GPU_PEAK_TFLOPS.items():
        if key in name:
            return tflops * 1e12
    return None


def pretrain_step(device: str, seq: int, groups: int, quick: bool, compiled: bool = False) -> dict:
    """Tokens/s and MFU of the training step at one (seq, G), fused AdamW, autocast as the trainer uses it;
    `compiled`: after `train.compile`'s `compile_model` (the warm-up steps compile every group)."""
    hidden, layers, heads, batch = (64, 4, 2, 4) if quick else (768, 12, 12, 32 if seq == 128 else 8)
    cfg = ElasticBertConfig(**bert_size(hidden, layers, heads), max_position_embeddings=512)
    torch.manual_seed(0)
    model = ElasticBertForPreTraining(cfg).to(device).train()
    if compiled:
        compile_model(model, groups)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.startswith("cuda"))
    group_list = exit_groups(layers, groups)
    ids = torch.randint(1000, 30522, (batch, seq), device=device)
    labels = torch.full_like(ids, -100)
    masked = torch.rand(batch, seq, device=device) < 0.15
    labels[masked] = ids[masked]
    batch_kw = dict(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        token_type_ids=torch.zeros_like(ids),
        mlm_labels=labels,
        sop_labels=torch.zeros(batch, dtype=torch.long, device=device),
    )
    dtype = autocast_dtype(device)
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)

    def step(t: int) -> None:
        with torch.autocast(device.split(":")[0], dtype=dtype or torch.float32, enabled=dtype is not None):
            out = model(**batch_kw, active_exits=group_list[t % len(group_list)], gradient_equilibrium=True)
        scaler.scale(out.loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    warm, timed = (2, 4) if quick else (5, 20)
    for t in range(warm):
        step(t)
    with Timer(device) as timer:
        for t in range(timed):
            step(t)
    seconds = timer.seconds / timed
    tokens = batch * seq
    useful = sum(training_flops_per_token(cfg, group_list[t % len(group_list)], seq) for t in range(timed)) / timed
    peak = peak_flops(device, dtype)
    return {
        "seq": seq,
        "groups": groups,
        "compiled": compiled,
        "batch": batch,
        "hidden": hidden,
        "step_s": seconds,
        "tokens_per_s": tokens / seconds,
        "useful_tflops": useful * tokens / seconds / 1e12,
        "mfu": useful * tokens / seconds / peak if peak else None,
        "dtype": str(dtype).replace("torch.", "") if dtype else "fp32",
    }


def early_exit_ratios(device: str, quick: bool) -> list[dict]:
    """Wall ÷ FLOPs speed-up of the entropy rule at ≈ 1.5/2/3× fewer FLOPs, batch 1 and 32."""
    from elasticbert.flops import sample_flops
    from finetune.serve.early_exit import make_rule, per_sample_flops, run_batch

    n = 64 if quick else 512
    model, ids, mask, lengths = queued_gpu.bench_classifier(device, quick, n)
    cfg, layers = model.config, model.config.num_hidden_layers
    full = sum(sample_flops(cfg, int(m), layers).total for m in lengths)

    def run(rule: object, batch: int) -> tuple[float, float]:
        order = torch.argsort(lengths, descending=True)
        flops, seconds = 0.0, 0.0
        with torch.inference_mode():
            for start in range(0, n, batch):
                rows = order[start : start + batch]
                m = int(lengths[rows].max())
                args = [t[rows, :m].to(device) for t in (ids, mask, torch.zeros_like(ids))]
                with Timer(device) as timer:
                    if rule is None:
                        model(*args[:1], attention_mask=args[1], token_type_ids=args[2], exit_layers=[layers])
                    else:
                        result = run_batch(model, *args, rule)
                seconds += timer.seconds
                flops += float(per_sample_flops(cfg, result)[0].sum()) if rule is not None else 0.0
        return seconds, flops

    run(None, 32)  # warm-up
    rows = []
    for batch in (1, 32):
        reference, _ = run(None, batch)
        for tau in (0.005, 0.01, 0.02, 0.05, 0.1, 0.2):
            seconds, flops = run(make_rule("entropy", tau, 2), batch)
            rows.append(
                {
                    "batch": batch,
                    "threshold": tau,
                    "flops_speedup": full / flops,
                    "wall_speedup": reference / seconds,
                    "ratio": (reference / seconds) / (full / flops),
                }
            )
    return rows


def test_results(junits: list[Path] | None) -> dict:
    found = [j for j in junits or [] if j.is_file()]
    if not found:
        return {}
    cases = []
    for junit in found:
        cases += _cases(junit)
    return {"cases": cases, "failed": sum(c["state"] in ("failed", "error") for c in cases)}


def _cases(junit: Path) -> list[dict]:
    root = ET.parse(junit).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    cases = []
    for case in suite.iter("testcase"):
        state = "passed"
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                state = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                cases.append({"test": case.get("name"), "state": state, "message": (node.get("message") or "")[:300]})
                break
        else:
            cases.append({"test": case.get("name"), "state": state})
        cases[-1]["seconds"] = float(case.get("time") or 0)
    return cases


def environment(device: str) -> dict:
    env = {"torch": torch.__version__, "device": device}
    if device.startswith("cuda"):
        env.update(
            name=torch.cuda.get_device_name(),
            capability=".".join(map(str, torch.cuda.get_device_capability())),
            cuda=torch.version.cuda,
            bf16=torch.cuda.is_bf16_supported(),
            memory_gb=torch.cuda.get_device_properties(0).total_memory / 2**30,
        )
    return env


CHECK_NAMES = {  # test -> the check it is in the table
    "test_the_preflight_passes_on_this_node": "preflight on this node (pretrain preflight)",
    "test_deepspeed_steps_train_and_resume_exactly[bf16-False]": "bf16 train -> resume through the CLI",
    "test_deepspeed_steps_train_and_resume_exactly[fp16-False]": "fp16 train -> resume through the CLI",
    "test_deepspeed_steps_train_and_resume_exactly[bf16-True]": "bf16 compiled train -> resume",
    "test_the_export_loads": "export -> load",
    "test_early_exit_agrees_between_cpu_and_gpu": "early exit: CPU and GPU agree",
    "test_fused_adam_is_built_for_this_gpu_and_takes_the_default_optimizers_step": "FusedAdam built for this GPU",
    "test_attention_needs_no_flash_kernel_in_fp16": "fp16 attention without flash (V100's kernels)",
}
RATIO_GOAL = 1.10


def _detail_tables(results: dict) -> list[str]:
    lines: list[str] = []
    if results.get("pretrain"):
        lines += [
            "Model step alone (fused AdamW, autocast):",
            "",
            "| seq | G | compiled | batch | step | tokens/s | useful TFLOP/s | MFU | dtype |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in results["pretrain"]:
            mfu = f"{r['mfu']:.0%}" if r["mfu"] is not None else "–"
            lines.append(
                f"| {r['seq']} | {r['groups']} | {'yes' if r['compiled'] else 'no'} | {r['batch']} | "
                f"{r['step_s'] * 1e3:.1f} ms | {r['tokens_per_s']:,.0f} | {r['useful_tflops']:.1f} | {mfu} | "
                f"{r['dtype']} |"
            )
        for seq in sorted({r["seq"] for r in results["pretrain"]}):
            g = {(r["groups"], r["compiled"]): r for r in results["pretrain"] if r["seq"] == seq}
            if (1, False) in g and (2, False) in g:
                lines.append(
                    f"\nseq {seq}: G=2 step {g[1, False]['step_s'] / g[2, False]['step_s']:.2f}× faster than G=1"
                )
            if (2, True) in g and (2, False) in g:
                lines.append(f"seq {seq}: train.compile step {g[2, False]['step_s'] / g[2, True]['step_s']:.2f}× eager")
        lines.append("")
    if results.get("early_exit"):
        lines += ["| batch | entropy τ | FLOPs speed-up | wall speed-up | wall ÷ FLOPs |", "|---|---|---|---|---|"]
        for r in results["early_exit"]:
            lines.append(
                f"| {r['batch']} | {r['threshold']} | {r['flops_speedup']:.2f}× | {r['wall_speedup']:.2f}× | "
                f"{r['ratio']:.2f} |"
            )
        lines.append("")
    lines += queued_gpu.report_lines(results.get("early_exit_queued") or [])
    return lines


def verdict_rows(results: dict) -> list[tuple[str, str, str, str]]:
    """(check, result, detail, seconds) for the final table."""
    rows = []
    for c in results.get("tests", {}).get("cases", []):
        state = {"passed": "pass", "failed": "FAIL", "error": "FAIL", "skipped": "skip"}[c["state"]]
        detail = c.get("message", "")[:160].replace("|", "/").replace("\n", " ")
        rows.append((CHECK_NAMES.get(c["test"], c["test"]), state, detail, f"{c.get('seconds', 0):.0f}"))
    for r in results.get("overhead", []):
        shape = f"{r['precision']}, h{r['hidden']} L{r['layers']}, seq {r['seq']}, "
        shape += f"micro {r['micro_batch']} x {r['accumulation']}"
        met = "pass" if r["ratio"] <= RATIO_GOAL else "over goal"
        step = f"trainer {r['step_s']['trainer'] * 1e3:.1f} ms, model {r['step_s']['bare'] * 1e3:.1f} ms"
        rows.append(
            (f"trainer step ÷ model step ({shape})", f"{met}: {r['ratio']:.2f}x (goal <= {RATIO_GOAL})", step, "")
        )
        per = r["syncs"]["trainer"]["per_step"]
        mean = {o: sum(v) / max(len(v), 1) for o, v in per.items()}
        ours = "pass" if mean["trainer"] <= 1 else "FAIL"
        counts = f"{mean['trainer']:.0f} / {mean['model']:.0f} / {mean['deepspeed']:.0f}"
        rows.append(
            (
                "host syncs per step: trainer's code / model / DeepSpeed",
                f"{ours}: {counts}",
                r["syncs"].get("how", ""),
                "",
            )
        )
        mfu = " / ".join(f"{v:.1%}" if v is not None else "–" for v in (r["mfu"]["trainer"], r["mfu"]["bare"]))
        rows.append((f"MFU trainer / model ({r['precision']})", mfu, f"peak {r.get('peak_tflops') or '?'} TFLOP/s", ""))
    best = [r for r in results.get("pretrain") or [] if r["mfu"] is not None]
    if best:
        top = max(best, key=lambda r: r["mfu"])
        rows.append(("model step MFU, best shape", f"{top['mfu']:.1%}", f"seq {top['seq']}, G={top['groups']}", ""))
    for name, seconds, code in results.get("parts", []):
        rows.append((f"part: {name}", "pass" if code == 0 else f"FAIL (exit {code})", "", f"{seconds:.0f}"))
    return rows


def report(results: dict) -> str:
    env = results["environment"]
    lines = [f"# GPU check — {env.get('name', env['device'])} ({env.get('mode', 'full')})", ""]
    lines += _detail_tables(results)
    lines += ["| check | result | detail | s |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in verdict_rows(results)]
    return "\n".join(lines) + "\n"


def failed(results: dict) -> bool:
    """A test that failed, a part that crashed, or the trainer's code making more than one host sync a step."""
    return any(row[1].startswith("FAIL") for row in verdict_rows(results))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="toy sizes (the CPU smoke test)")
    ap.add_argument("--parts", nargs="*", default=["model", "early_exit"], choices=["model", "early_exit"])
    ap.add_argument("--mode", default="full", help="the gpu_check.sh mode, for the report's title")
    ap.add_argument("--tests-junit", type=Path, nargs="*", default=None, help="pytest -m gpu's junit XML files")
    ap.add_argument(
        "--overhead", type=Path, default=None, help="bench/pretrain/trainer_overhead.py's trainer_overhead.json"
    )
    ap.add_argument("--timings", type=Path, default=None, help="gpu_check.sh's parts: NAME<TAB>SECONDS<TAB>EXIT lines")
    ap.add_argument("--output", type=Path, required=True)
    args = ap.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    results = {"environment": {**environment(args.device), "mode": args.mode}, "tests": test_results(args.tests_junit)}
    if args.overhead is not None and args.overhead.is_file():
        results["overhead"] = json.loads(args.overhead.read_text())
    if args.timings is not None and args.timings.is_file():
        rows = [line.split("\t") for line in args.timings.read_text().splitlines() if line.strip()]
        results["parts"] = [(name, float(seconds), int(code)) for name, seconds, code in rows]
    seqs = (32,) if args.quick else (128, 512)
    if "model" in args.parts:
        results["pretrain"] = [pretrain_step(args.device, seq, g, args.quick) for seq in seqs for g in (2, 1)]
        results["pretrain"].append(pretrain_step(args.device, seqs[0], 2, args.quick, compiled=True))
    if "early_exit" in args.parts:
        results["early_exit"] = early_exit_ratios(args.device, args.quick)
        results["early_exit_queued"] = queued_gpu.queued_early_exit_ratios(args.device, args.quick)  # issue 48
    write_result(args.output / "gpu_check.json", results)
    (args.output / "gpu_check.md").write_text(report(results))
    print(report(results))
    return 1 if failed(results) else 0


if __name__ == "__main__":
    sys.exit(main())
