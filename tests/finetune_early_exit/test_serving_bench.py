"""bench/serving.py end to end at smoke size on the fixture's saved model: every configuration (pipeline, ONNX
Runtime fp32/int8, ours full/early exit fp32/int8) classifies the rows, and the table and goals are written."""

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench import int8_batch_invariance, serving  # noqa: E402


def test_serving_bench_smoke(saved_model, tmp_path):
    argv = ["--model", f"SST-2={saved_model}", "--max-examples", "16", "--rounds", "1", "--threads", "1"]
    argv += ["--batch-sizes", "1", "4", "--work-dir", str(tmp_path / "work"), "--output", str(tmp_path / "out")]
    assert serving.main(argv) == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    task = results["tasks"]["SST-2"]
    assert task["examples"] == 16 and set(task["configs"]) == set(serving.CONFIGS)
    assert {"ours-ORT EE fp32", "ours-ORT EE int8"} <= set(task["configs"])
    for name, row in task["configs"].items():
        assert row["inputs_per_s"]["b4_t1"] > 0, name
        assert 0 <= row["accuracy"]["b4_t1"] <= 100, name
    # the exported fp32 graph is the model: the same accuracy as ours and the pipeline on the same rows
    fp32 = {task["configs"][name]["accuracy"]["b4_t1"] for name in ("pipeline fp32", "ORT fp32", "ours full fp32")}
    assert len(fp32) == 1, fp32
    assert task["thresholds"]["fp32"]["threshold"] is not None  # the full model itself qualifies at worst
    section = (tmp_path / "out" / "section.md").read_text()
    assert "ours-ORT EE int8" in section and "Goals" in section and "p99" in section
    latency = task["configs"]["ours-ORT EE int8"]["latency_b1"]["t1"]
    assert 0 < latency["p50_ms"] <= latency["p99_ms"]
    assert results["onnxruntime"] and results["ort_graph_optimization"] == "ORT_ENABLE_ALL"


def test_int8_batch_invariance_bench_smoke(saved_model, tmp_path):
    """The per-token int8 piece of an export answers an input alone as inside its batch; `quantize_dynamic`'s piece,
    rebuilt beside it, does not (its scale spans the batch); both stay near fp32."""
    from finetune.onnx_export import export_onnx

    export = tmp_path / "export"
    export_onnx(saved_model, export, max_length=128)
    out = tmp_path / "figures.json"
    assert int8_batch_invariance.main(["--export", str(export), "--rounds", "1", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    per_token, per_tensor = figures["int8 per token (export)"], figures[int8_batch_invariance.PER_TENSOR]
    assert per_token["batch_dependence"] <= 1e-5 < per_tensor["batch_dependence"]
    assert figures["fp32"]["error_vs_fp32"] == 0 and 0 < per_token["error_vs_fp32"] < 1.0
    assert all(ms > 0 for row in figures.values() for ms in row["ms"].values())
