"""`make demo` at its smallest scale, end to end: every stage runs and the report holds sensible numbers."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_demo_tiny_end_to_end(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "demo", "--scale", "tiny", "--output", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = out / "report"
    for name in ("summary.md", "summary.json", "pretrain_losses.png", "layer_scores.png"):
        assert (report / name).stat().st_size > 0, name
    assert list(report.glob("early_exit_*.png")), "no Pareto plot"
    assert str(report / "summary.md") in proc.stdout.splitlines()[-1]

    summary = json.loads((report / "summary.json").read_text())
    assert summary["pretrain"]["preempted_after_step"] < summary["pretrain"]["steps"]
    records = [json.loads(x) for x in (out / "pretrain" / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("attempt", 1) > 1 for r in records), "no record after the resume"
    assert all(math.isfinite(r["loss"]) for r in records)
    top = max(records[0]["active_exits"])
    top_losses = [r["mlm_loss"][r["active_exits"].index(top)] for r in records]
    assert top_losses[-1] < top_losses[0], top_losses  # the MLM heads (new on MiniLM) learn

    exits = summary["finetune"]["best"]["exits"]
    scores = [v["score"] for v in exits.values()]
    assert all(math.isfinite(s) for s in scores)
    assert max(scores) >= 60.0, exits  # SST-2 dev majority class is 50.9 %
    assert "entropy" in json.dumps(summary["early_exit"]) and "patience" in json.dumps(summary["early_exit"])
