"""Static (calibrated) QDQ int8 for the early-exit ONNX steps, against fp32, the export's per-token int8 and
`quantize_dynamic`: per-layer latency, output errors, batch invariance, dev accuracy and the fused node types.

Why it exists: per-token int8 (`finetune/serve/onnx_export.py`) makes an input's answer independent of its batch but
costs 1.2-1.4x per layer against `quantize_dynamic`, whose one scale per tensor moves answers with the batch. Fixed
(calibrated) activation scales are batch-invariant too; this probe measures whether they are the cheaper way (answer,
2026-12-04: no — docs/serving.md). One thread everywhere.

    python bench/int8_static_probe.py build TASK --export SST-2=DIR --work-dir W   # quantize the steps
    python bench/int8_static_probe.py eval  TASK ...                                # errors, invariance, accuracy
    python bench/int8_static_probe.py time  TASK ...                                # per-layer latency

DIR: a format-2 early-exit export folder (`finetune export --layout onnx`; bench/serving.py leaves them under its
work dir as TASK/ee_onnx). Results are written as JSON into the work dir.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

WORK = Path("/tmp/int8_static_probe")  # set by --work-dir
EXPORTS: dict[str, Path] = {}  # task -> export folder, set by --export
GLUE = Path(__file__).resolve().parents[2] / "shared" / "data" / "glue"  # set by --glue
N_CALIB = 300
STATIC = (
    "static_minmax",
    "static_percentile",
    "static_entropy",
    "static_minmax_noout",
    "static_percentile_noout",
    "static_entropy_noout",
)
LAYERS = 6
ENTROPY_BINS = 2048


def session(path: Path) -> ort.InferenceSession:
    o = ort.SessionOptions()
    o.intra_op_num_threads, o.inter_op_num_threads = 1, 1
    o.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    o.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), o, providers=["CPUExecutionProvider"])


def read_tsv(task: str, split: str):
    path = GLUE / task / f"{split}.tsv"
    with open(path, encoding="utf-8-sig") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    head, rows = rows[0], rows[1:]
    if task == "SST-2":
        return [(r[0], None, int(r[1])) for r in rows]
    i1, i2, il = head.index("#1 String"), head.index("#2 String"), head.index("Quality")
    return [(r[i1], r[i2], int(r[il])) for r in rows if len(r) > max(i1, i2, il)]


def tokenize(task: str, examples, pad_to: int | None = None):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(EXPORTS[task] / "tokenizer.json"))
    max_len = json.loads((EXPORTS[task] / "onnx/manifest.json").read_text())["max_length"]
    tok.enable_truncation(max_len)
    if pad_to is None:
        tok.enable_padding()
    else:
        tok.enable_padding(length=pad_to)
    inputs = [(a, b) if b is not None else a for a, b, _ in examples]
    enc = tok.encode_batch(inputs)
    ids = np.array([e.ids for e in enc], np.int64)
    types = np.array([e.type_ids for e in enc], np.int64)
    mask = np.array([e.attention_mask for e in enc], np.int64)
    return ids, types, mask


def step_paths(task: str, variant: str) -> list[Path]:
    if variant == "fp32":
        return [EXPORTS[task] / "onnx" / f"step_{i}.onnx" for i in range(LAYERS)]
    if variant == "per_token":
        return [EXPORTS[task] / "onnx" / f"step_{i}.int8.onnx" for i in range(LAYERS)]
    return [WORK / task / variant / f"step_{i}.onnx" for i in range(LAYERS)]


def feeds_for(index: int, x, mask, exit_rows: int) -> dict:
    f = {"mask": mask, "exit_rows": np.array([exit_rows], np.int64)}
    if index == 0:
        f["input_ids"], f["token_type_ids"] = x
    else:
        f["hidden"] = x
    return f


def run_chain(sessions, ids, types, mask, keep_hidden=False):
    """All steps; exit only on the last. Returns (logits, [hidden after each step except last])."""
    x, hiddens = (ids, types), []
    for i, s in enumerate(sessions):
        last = i == len(sessions) - 1
        out = s.run(None, feeds_for(i, x, mask, mask.shape[0] if last else 0))
        if last:
            return out[-1], hiddens
        x = out[0]
        if keep_hidden:
            hiddens.append(x)
    raise AssertionError


class Reader:
    def __init__(self, feeds):
        self.feeds, self.i = feeds, 0

    def get_next(self):
        if self.i >= len(self.feeds):
            return None
        self.i += 1
        return self.feeds[self.i - 1]

    def rewind(self):
        self.i = 0


def calibration_feeds(task: str):
    """Per step: N_CALIB train inputs (one per batch, unpadded), as the fp32 steps see them."""
    rng = np.random.default_rng(0)
    train = read_tsv(task, "train")
    picked = [train[i] for i in rng.choice(len(train), N_CALIB, replace=False)]
    fp32 = [session(p) for p in step_paths(task, "fp32")]
    per_step = [[] for _ in range(LAYERS)]
    # one batch of all N_CALIB, padded to their longest: the histogram calibrators need one shape across batches
    for ex in [picked]:
        ids, types, mask = tokenize(task, ex)
        x = (ids, types)
        for i, s in enumerate(fp32):
            f = feeds_for(i, x, mask, mask.shape[0])
            per_step[i].append(f)
            if i < LAYERS - 1:
                x = s.run(["hidden_out"], f)[0]
    return per_step


def exit_nodes(model) -> list[str]:
    return [n.name for n in model.graph.node if n.name.startswith("exit/")]


def act_act_matmuls(model) -> list[str]:
    consts = {i.name for i in model.graph.initializer}
    return [n.name for n in model.graph.node if n.op_type == "MatMul" and n.input[1] not in consts]


def build(task: str, only: list[str] | None = None) -> None:
    import onnxruntime.quantization.quantize  # noqa: F401
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_dynamic, quantize_static

    qmod = sys.modules["onnxruntime.quantization.quantize"]

    original = qmod.create_calibrator

    def create_calibrator(*a, **k):  # quantize_static gives Entropy 128 bins = 128 quantized bins: MinMax's range
        if k.get("calibrate_method") == CalibrationMethod.Entropy:
            k["extra_options"] = {**(k.get("extra_options") or {}), "num_bins": ENTROPY_BINS}
        return original(*a, **k)

    qmod.create_calibrator = create_calibrator
    t0 = time.time()
    feeds = calibration_feeds(task)
    print(f"calibration feeds {time.time() - t0:.1f}s", flush=True)
    methods = {
        "static_minmax": CalibrationMethod.MinMax,
        "static_percentile": CalibrationMethod.Percentile,
        "static_entropy": CalibrationMethod.Entropy,
    }
    for v in ("dynamic", *STATIC, "static_minmax_attn"):
        (WORK / task / v).mkdir(parents=True, exist_ok=True)
    for i, src in enumerate(step_paths(task, "fp32")):
        # a self-contained copy (step 0 reads word_embeddings.bin beside it)
        model = onnx.load(str(src))  # loads external data
        src_copy = WORK / task / f"fp32_step_{i}.onnx"
        onnx.save(model, str(src_copy))
        ex, aa = exit_nodes(model), act_act_matmuls(model)
        out = step_paths(task, "dynamic")[i]
        if only is None:
            quantize_dynamic(
                str(src_copy),
                str(out),
                weight_type=QuantType.QInt8,
                per_channel=True,
                op_types_to_quantize=["MatMul"],
                nodes_to_exclude=ex,
            )
        for v in (*STATIC, "static_minmax_attn"):
            if only is not None and v not in only:
                continue
            t = time.time()
            excl = ex if v == "static_minmax_attn" else ex + aa  # attn variant also quantizes QK^T and PV
            method = methods["static_" + v.split("_")[1]]
            extra = {"CalibMovingAverage": False}
            if v.endswith("_noout"):
                extra["OpTypesToExcludeOutputQuantization"] = ["MatMul"]
            if method == CalibrationMethod.Percentile:
                extra["CalibPercentile"] = 99.99
            quantize_static(
                str(src_copy),
                str(step_paths(task, v)[i]),
                Reader(feeds[i]),
                quant_format=QuantFormat.QDQ,
                op_types_to_quantize=["MatMul"],
                per_channel=True,
                reduce_range=False,
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                nodes_to_exclude=excl,
                calibrate_method=method,
                extra_options=extra,
            )
            print(f"step {i} {v}: {time.time() - t:.1f}s", flush=True)
    print(f"build {task} done {time.time() - t0:.1f}s")


VARIANTS = ("fp32", "per_token", "dynamic", *STATIC, "static_minmax_attn")


def available(task):
    return [v for v in VARIANTS if all(p.is_file() for p in step_paths(task, v))]


def evaluate(task: str) -> None:
    dev = read_tsv(task, "dev")
    labels = np.array([e[2] for e in dev])
    res = {}
    variants = available(task)
    sess = {v: [session(p) for p in step_paths(task, v)] for v in variants}
    # full-model accuracy (last exit), batches of 32 in dev order, padded to the batch's longest
    ref_logits, ref_hidden = [], []
    for v in variants:
        (
            preds,
            logits_all,
            hid_err,
        ) = [], [], []
        for b in range(0, len(dev), 32):
            ids, types, mask = tokenize(task, dev[b : b + 32])
            logits, hidden = run_chain(sess[v], ids, types, mask, keep_hidden=True)
            preds.append(logits.argmax(-1))
            logits_all.append(logits)
            if v == "fp32":
                ref_hidden.append(hidden)
            else:
                ref = ref_hidden[b // 32]
                m = mask.astype(bool)
                hid_err.append([float(np.abs(h - r)[m].max()) for h, r in zip(hidden, ref)])
        logits_all = np.concatenate(logits_all)
        if v == "fp32":
            ref_logits = logits_all
        preds = np.concatenate(preds)
        acc = float((preds == labels).mean())
        r = {
            "accuracy": acc,
            "max_abs_logit_diff_vs_fp32": float(np.abs(logits_all - ref_logits).max()),
            "pred_flips_vs_fp32": int((preds != ref_logits.argmax(-1)).sum()),
        }
        if hid_err:
            r["max_abs_hidden_diff_per_step_vs_fp32(real tokens, chained)"] = [max(c) for c in zip(*hid_err)]
        # single-step error: step 2 fed the fp32 hidden state (not chained)
        ids, types, mask = tokenize(task, dev[:32])
        _, hidden = run_chain(sess["fp32"], ids, types, mask, keep_hidden=True)
        f = feeds_for(2, hidden[1], mask, 0)
        ref2 = sess["fp32"][2].run(["hidden_out"], f)[0]
        out2 = sess[v][2].run(["hidden_out"], f)[0]
        r["step2_isolated_max_abs_diff_vs_fp32"] = float(np.abs(out2 - ref2)[mask.astype(bool)].max())
        # batch invariance: row 0 alone (same padded length) vs inside the 32-batch, whole chain incl. logits
        lb, _ = run_chain(sess[v], ids, types, mask)
        la, _ = run_chain(sess[v], ids[:1], types[:1], mask[:1])
        r["batch_dependence_logits_row0"] = float(np.abs(lb[:1] - la).max())
        # and unpadded alone vs padded in batch (what serving really does)
        n = int(mask[0].sum())
        lu, _ = run_chain(sess[v], ids[:1, :n], types[:1, :n], mask[:1, :n])
        r["batch_dependence_logits_row0_unpadded"] = float(np.abs(lb[:1] - lu).max())
        # step-level, hidden_out of step 2 row 0, alone vs batch
        a2 = sess[v][2].run(["hidden_out"], feeds_for(2, hidden[1][:1], mask[:1], 0))[0]
        r["batch_dependence_step2_hidden_row0"] = float(np.abs(out2[:1] - a2).max())
        res[v] = r
        print(v, json.dumps(r), flush=True)
    (WORK / f"eval_{task}.json").write_text(json.dumps(res, indent=2))


def layer_only(task: str, v: str, index: int) -> Path:
    from onnx.utils import extract_model

    out = WORK / task / "layer_only" / f"{v}_step_{index}.onnx"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        src = step_paths(task, v)[index]
        if v in ("fp32", "per_token"):  # reuse fp32 self-contained copy for fp32; int8 steps are self-contained
            src = WORK / task / f"fp32_step_{index}.onnx" if v == "fp32" else src
        extract_model(str(src), str(out), ["hidden", "mask"], ["hidden_out"])
    return out


def optimized_ops(task: str, v: str, index: int = 2) -> dict:
    o = ort.SessionOptions()
    o.intra_op_num_threads = o.inter_op_num_threads = 1
    o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    path = WORK / task / "optimized" / f"{v}_layer{index}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    o.optimized_model_filepath = str(path)
    ort.InferenceSession(str(layer_only(task, v, index)), o, providers=["CPUExecutionProvider"])
    m = onnx.load(str(path))
    counts: dict = {}
    for n in m.graph.node:
        counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return counts


def timing(task: str, index: int = 2, rounds: int = 9) -> None:
    dev = read_tsv(task, "dev")
    variants = available(task)
    fp32_steps = [session(p) for p in step_paths(task, "fp32")]
    lengths = [int(m.sum()) for m in tokenize(task, dev)[2]]
    med = int(np.median(lengths))
    one = next(i for i, n in enumerate(lengths) if n == med)
    shapes = {"b1": [dev[one]], "b32": dev[64:96]}
    feeds = {}
    for label, exs in shapes.items():
        ids, types, mask = tokenize(task, exs)
        _, hidden = run_chain(fp32_steps, ids, types, mask, keep_hidden=True)
        feeds[label] = {"hidden": hidden[index - 1], "mask": mask}
    info = {label: list(f["mask"].shape) for label, f in feeds.items()}
    print(task, "shapes", info, "median dev length", med, flush=True)
    kinds = {
        "layer": {v: session(layer_only(task, v, index)) for v in variants},
        "step": {
            v: session(step_paths(task, v)[index] if v != "fp32" else WORK / task / f"fp32_step_{index}.onnx")
            for v in variants
        },
    }
    times = {(k, lab, v): [] for k in kinds for lab in feeds for v in variants}
    for _ in range(rounds):
        for k, ss in kinds.items():
            for lab, f in feeds.items():
                ff = dict(f) if k == "layer" else {**f, "exit_rows": np.zeros(1, np.int64)}
                reps = 60 if lab == "b1" else 6
                for v in variants:
                    s = ss[v]
                    s.run(None, ff)
                    for _ in range(reps):
                        t = time.perf_counter()
                        s.run(None, ff)
                        times[k, lab, v].append(time.perf_counter() - t)
    res = {"shapes": info, "layer_index": index, "ms_median": {}, "ms_p10": {}}
    for (k, lab, v), ts in times.items():
        res["ms_median"][f"{k}/{lab}/{v}"] = 1e3 * float(np.median(ts))
        res["ms_p10"][f"{k}/{lab}/{v}"] = 1e3 * float(np.percentile(ts, 10))
    res["optimized_ops"] = {v: optimized_ops(task, v, index) for v in variants}
    for k in kinds:
        for lab in feeds:
            base = res["ms_median"][f"{k}/{lab}/per_token"]
            print(
                k,
                lab,
                "  ".join(
                    f"{v} {res['ms_median'][f'{k}/{lab}/{v}']:.3f}ms ({res['ms_median'][f'{k}/{lab}/{v}'] / base:.2f}x)"
                    for v in variants
                ),
                flush=True,
            )
    for v, c in res["optimized_ops"].items():
        print(v, c)
    (WORK / f"time_{task}.json").write_text(json.dumps(res, indent=2))


def main() -> None:
    global WORK, GLUE
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=("build", "eval", "time"))
    ap.add_argument("task", help="a GLUE task whose export is given, e.g. SST-2")
    ap.add_argument("--export", action="append", default=[], metavar="TASK=DIR", help="a format-2 export folder")
    ap.add_argument("--work-dir", type=Path, default=WORK, help="quantized steps and results go here")
    ap.add_argument("--glue", type=Path, default=GLUE, help="the GLUE tsv folder (calibration: train; eval: dev)")
    ap.add_argument("--only", help="build: these variants only (comma-separated)")
    args = ap.parse_args()
    for item in args.export:
        task, _, folder = item.partition("=")
        EXPORTS[task] = Path(folder)
    if args.task not in EXPORTS:
        ap.error(f"no --export {args.task}=DIR given")
    WORK, GLUE = args.work_dir, args.glue
    if args.command == "build":
        build(args.task, args.only.split(",") if args.only else None)
    else:
        {"eval": evaluate, "time": timing}[args.command](args.task)


if __name__ == "__main__":
    main()
