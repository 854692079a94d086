"""bench/serving/serving.py end to end at smoke size on the fixture's saved model: every configuration (the full model
on each runtime, early exit queued on each, per batch, the pipeline) classifies the rows, and the table, the ratios to
each runtime's full model and the goals are written; bench/gpu/queued_gpu.py (gpu_bench's early-exit queues) at toy size
on the CPU."""

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.gpu import queued_gpu  # noqa: E402
from bench.serving import int8_batch_invariance, serving  # noqa: E402


def test_serving_bench_smoke(saved_model, tmp_path):
    argv = ["--model", f"SST-2={saved_model}", "--max-examples", "16", "--rounds", "1", "--threads", "1"]
    argv += ["--batch-sizes", "1", "4", "--grid-points", "3", "--work-dir", str(tmp_path / "work")]
    assert serving.main([*argv, "--output", str(tmp_path / "out")]) == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    task = results["tasks"]["SST-2"]
    assert task["examples"] == 16 and set(task["cells"]) == {"b1_t1", "b4_t1"}
    for key, cell in task["cells"].items():
        assert set(cell["configs"]) == set(serving.CONFIGS)
        for name, row in cell["configs"].items():
            assert row["inputs_per_s"] > 0 and 0 < row["p50_ms"] <= row["p99_ms"], (key, name)
            assert 0 <= row["accuracy"] <= 100, name
            runtime, early = serving.CONFIGS[name]
            assert ("vs_full" in row) == (early and runtime != "pipeline"), name
        # the exported fp32 graph, the model's forward and the pipeline are the same model on the same rows
        same = {cell["configs"][name]["accuracy"] for name in ("pipeline fp32", "ORT fp32 full", "torch fp32 full")}
        assert len(same) == 1, same
        goal = cell["configs"][serving.GOAL]
        flops_speedup = task["full_mean_flops"] / goal["mean_flops"]
        assert abs(goal["wall_over_flops"] - goal["vs_full"] / flops_speedup) < 1e-9
        assert 0 < cell["configs"]["ORT int8 EE"]["fill"] <= 1
    assert task["thresholds"]["ORT int8"]["threshold"] is not None  # the full model itself qualifies at worst
    section = (tmp_path / "out" / "section.md").read_text()
    assert "ORT int8 EE" in section and "Goals" in section and "p50 / p99" in section and "wall ÷ FLOPs" in section
    assert results["onnxruntime"] and results["ort_graph_optimization"] == "ORT_ENABLE_ALL"


def test_queued_gpu_bench_runs_on_the_cpu_at_toy_size():
    rows = queued_gpu.queued_early_exit_ratios("cpu", quick=True)
    assert {r["batch"] for r in rows} == {1, 32}
    for row in rows:
        for name in ("per batch", "queued", "queued + graphs"):
            assert row[name]["wall_speedup"] > 0 and row[name]["flops_speedup"] >= 1.0
        assert row["queued"]["flops_speedup"] == row["queued + graphs"]["flops_speedup"]  # the same exits
    assert any("queued + graphs" in line for line in queued_gpu.report_lines(rows))


def test_int8_batch_invariance_bench_smoke(saved_model, tmp_path):
    """The per-token int8 piece of an export answers an input alone as inside its batch; `quantize_dynamic`'s piece,
    rebuilt beside it, does not (its scale spans the batch); both stay near fp32."""
    from finetune.serve.onnx_export import export_onnx

    export = tmp_path / "export"
    export_onnx(saved_model, export, max_length=128)
    out = tmp_path / "figures.json"
    assert int8_batch_invariance.main(["--export", str(export), "--rounds", "1", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    per_token, per_tensor = figures["int8 per token (export)"], figures[int8_batch_invariance.PER_TENSOR]
    assert per_token["batch_dependence"] <= 1e-5 < per_tensor["batch_dependence"]
    assert figures["fp32"]["error_vs_fp32"] == 0 and 0 < per_token["error_vs_fp32"] < 1.0
    assert all(ms > 0 for row in figures.values() for ms in row["ms"].values())
