"""The GPU half of bench/gpu_check.sh: what the project's figures look like on an accelerator, in ≤ ~4 minutes.

1. Pre-training step at ElasticBERT-base size (hidden 768, 12 layers, bert-base vocab): seq 128 and 512, MLM logits
   at masked positions only (the model's own sparse head), bf16 autocast where the GPU has it (else fp16 autocast),
   fused AdamW; G=2 (the default grouping: the groups alternate step by step) vs G=1 (all 12 exits every step);
   tokens/s and useful FLOP/s (`elasticbert.flops.training_flops_per_token`) against the device's dense peak
   (`pretrain.mfu`), timed with CUDA events after warm-up; and the first seq at G=2 with `train.compile`'s path.
2. Early exit: a base-size classifier with six MHA exits (random weights whose exit heads are scaled up, so the
   entropy rule spreads samples over the exits: the speed-up ratio needs exits, not accuracy), entropy thresholds
   picked for ≈ 1.5×, 2× and 3× fewer FLOPs; wall-time speed-up ÷ FLOPs speed-up at batch 1 and 32, the full
   model's own forward on the same batches as the reference.
`--device cpu --quick` runs the same code at toy sizes (CI's smoke test of bench/gpu_check.sh).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import queued_gpu  # noqa: E402
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
    cfg = ElasticBertConfig(
        vocab_size=30522,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        max_position_embeddings=512,
    )
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
    from elasticbert import ElasticBertForSequenceClassification
    from elasticbert.flops import sample_flops
    from finetune.early_exit import make_rule, per_sample_flops, run_batch

    hidden, layers, heads, n = (64, 6, 2, 64) if quick else (768, 6, 12, 512)
    cfg = ElasticBertConfig(
        vocab_size=30522,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        num_labels=2,
        exit_layers=list(range(1, layers + 1)),
        exit_type="mha",
    )
    torch.manual_seed(0)
    model = ElasticBertForSequenceClassification(cfg).eval().to(device)
    with torch.no_grad():
        for param in model.exits.parameters():
            param.normal_(0.0, 0.6)
    lengths = torch.randint(16, 128, (n,))
    ids = torch.randint(1000, 30522, (n, 128)) * (torch.arange(128)[None] < lengths[:, None])
    mask = (ids != 0).long()
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


def report(results: dict) -> str:
    lines = [f"# GPU check — {results['environment'].get('name', results['environment']['device'])}", ""]
    tests = results.get("tests", {})
    if tests:
        lines += [
            f"Tests: {sum(c['state'] == 'passed' for c in tests['cases'])} passed, {tests['failed']} failed, "
            f"{sum(c['state'] == 'skipped' for c in tests['cases'])} skipped",
            "",
        ]
        lines += [f"- {c['test']}: {c['state']} {c.get('message', '')}" for c in tests["cases"]] + [""]
    lines += [
        "| seq | G | compiled | batch | step | tokens/s | useful TFLOP/s | MFU | dtype |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["pretrain"]:
        mfu = f"{r['mfu']:.0%}" if r["mfu"] is not None else "–"
        lines.append(
            f"| {r['seq']} | {r['groups']} | {'yes' if r['compiled'] else 'no'} | {r['batch']} | "
            f"{r['step_s'] * 1e3:.1f} ms | {r['tokens_per_s']:,.0f} | {r['useful_tflops']:.1f} | {mfu} | {r['dtype']} |"
        )
    for seq in sorted({r["seq"] for r in results["pretrain"]}):
        g = {(r["groups"], r["compiled"]): r for r in results["pretrain"] if r["seq"] == seq}
        if (1, False) in g and (2, False) in g:
            lines.append(f"\nseq {seq}: G=2 step {g[1, False]['step_s'] / g[2, False]['step_s']:.2f}× faster than G=1")
        if (2, True) in g and (2, False) in g:
            lines.append(f"seq {seq}: train.compile step {g[2, False]['step_s'] / g[2, True]['step_s']:.2f}× eager")
    lines += ["", "| batch | entropy τ | FLOPs speed-up | wall speed-up | wall ÷ FLOPs |", "|---|---|---|---|---|"]
    for r in results["early_exit"]:
        lines.append(
            f"| {r['batch']} | {r['threshold']} | {r['flops_speedup']:.2f}× | {r['wall_speedup']:.2f}× | "
            f"{r['ratio']:.2f} |"
        )
    lines += queued_gpu.report_lines(results.get("early_exit_queued") or [])
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="toy sizes (the CPU smoke test)")
    ap.add_argument(
        "--tests-junit",
        type=Path,
        nargs="*",
        default=None,
        help="pytest -m gpu's junit XML files, folded into the report",
    )
    ap.add_argument("--output", type=Path, required=True)
    args = ap.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    results = {"environment": environment(args.device), "tests": test_results(args.tests_junit)}
    seqs = (32,) if args.quick else (128, 512)
    results["pretrain"] = [pretrain_step(args.device, seq, g, args.quick) for seq in seqs for g in (2, 1)]
    results["pretrain"].append(pretrain_step(args.device, seqs[0], 2, args.quick, compiled=True))
    results["early_exit"] = early_exit_ratios(args.device, args.quick)
    results["early_exit_queued"] = queued_gpu.queued_early_exit_ratios(args.device, args.quick)  # issue 48
    (args.output / "gpu_check.json").write_text(json.dumps(results, indent=1))
    (args.output / "gpu_check.md").write_text(report(results))
    print(report(results))
    return 1 if results["tests"].get("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
