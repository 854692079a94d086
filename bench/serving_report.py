"""The markdown of bench/serving.py's results: one table per task (every configuration, every cell), the goals."""

from __future__ import annotations

GOALS = {"b32": 4.0}  # the goal row against its runtime's full model (issue 60), per batch size
WALL_OVER_FLOPS_B1 = 0.85
ENGINE = "ORT int8 EE"  # our per-layer engine: the goal row must never be slower at any batch size


def _cell(row: dict) -> list[str]:
    speed = f"{row['inputs_per_s']:.0f}"
    if "vs_full" in row:
        speed += f" (×{row['vs_full']:.2f})"
    latency = f"{row['p50_ms']:.2f} / {row['p99_ms']:.2f}"
    ratio = f"{row['wall_over_flops']:.2f}" if "wall_over_flops" in row else "–"
    return [speed, latency, ratio]


def _task_lines(task: str, r: dict) -> list[str]:
    keys = list(r["cells"])
    taus = ", ".join(f"{name} τ={value.get('threshold')}" for name, value in r["thresholds"].items())
    head = ["config"] + [
        f"{k.replace('_', ' ')}: {what}" for k in keys for what in ("inputs/s (× full)", "p50 / p99 ms", "wall ÷ FLOPs")
    ]
    lines = [
        f"**{task}** dev ({r['examples']} rows, max length {r['max_length']}; full fp32 accuracy "
        f"{r['full_fp32_accuracy']:.1f}, {r['full_mean_flops'] / 1e6:.0f} MFLOPs per input; EE thresholds: {taus}; "
        "load average per cell: " + ", ".join(f"{k} {r['cells'][k]['load_average']}" for k in keys) + ")",
        "",
        "| " + " | ".join(head) + " | MFLOPs | accuracy |",
        "|---|" + "---|" * (len(head) + 1),
    ]
    for name in r["cells"][keys[0]]["configs"]:
        rows = [r["cells"][k]["configs"][name] for k in keys]
        cells = [c for row in rows for c in _cell(row)]
        accuracy = " / ".join(f"{a:.1f}" for a in sorted({round(row["accuracy"], 1) for row in rows}))
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {rows[0]['mean_flops'] / 1e6:.0f} | {accuracy} |")
    fills = {k: r["cells"][k]["configs"][n].get("fill") for k in keys for n in r["cells"][k]["configs"]}
    if any(v is not None for v in fills.values()):
        lines.append("")
        lines.append(
            "Rows per layer call ÷ B (queued engine), and the steps by length each call ran as on the CPU: "
            + "; ".join(
                f"{k}: "
                + ", ".join(
                    f"{n} {row['fill']:.2f} ({row.get('steps_per_call', 1.0):.1f} steps)"
                    for n, row in r["cells"][k]["configs"].items()
                    if "fill" in row
                )
                for k in keys
            )
        )
    return lines


def _goal_lines(task: str, r: dict, goal: str) -> list[str]:
    out = []
    floor = r["full_fp32_accuracy"] - 1.0
    for key, cell in r["cells"].items():
        row = cell["configs"].get(goal)
        batch = key.split("_")[0]
        if row is None or "vs_full" not in row:
            continue
        wanted = GOALS.get(batch)
        verdict = "" if wanted is None else (" met" if row["vs_full"] >= wanted else " short") + f" (goal ≥ {wanted}×)"
        extra = ""
        if batch == "b1":
            met = row["wall_over_flops"] >= WALL_OVER_FLOPS_B1
            goal_b1 = f"{'met' if met else 'short'}, goal ≥ {WALL_OVER_FLOPS_B1}"
            extra = f"; wall ÷ FLOPs {row['wall_over_flops']:.2f} ({goal_b1})"
            full = cell["configs"].get("ORT int8 full")
            if full is not None:
                verdict_p99 = "met" if row["p99_ms"] <= full["p99_ms"] else "short"
                extra += f"; p99 {row['p99_ms']:.2f} vs full {full['p99_ms']:.2f} ms ({verdict_p99})"
        engine = cell["configs"].get(ENGINE)
        if engine is not None and goal != ENGINE:
            ratio = row["inputs_per_s"] / engine["inputs_per_s"]
            extra += f"; ×{ratio:.2f} our per-layer engine ({'met' if ratio >= 1 else 'short'}, goal ≥ 1)"
        accuracy = "within" if row["accuracy"] >= floor - 1e-9 else "NOT within"
        out.append(
            f"- {task} {key}: {goal} ×{row['vs_full']:.2f} its runtime's full model{verdict}{extra}; accuracy "
            f"{row['accuracy']:.1f}, {accuracy} 1 point of full fp32 ({r['full_fp32_accuracy']:.1f})"
        )
    return out


def section(results: dict, goal: str) -> str:
    lines = []
    for task, r in results["tasks"].items():
        lines += _task_lines(task, r) + [""]
    lines += [f"Goals ({goal} against ORT int8 full, one thread):"]
    for task, r in results["tasks"].items():
        lines += _goal_lines(task, r, goal)
    return "\n".join(lines) + "\n"
