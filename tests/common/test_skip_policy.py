"""The skip policy: outside CI a missing requirement skips with a tagged reason; inside CI that skip fails the run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from requirements import GLUE, require_data

HERE = Path(__file__)


def test_probe_needs_the_shared_glue_data():
    """Passes where ../shared/data is (CI); skips with [needs-data] elsewhere. The test below runs it both ways."""
    require_data(GLUE)
    assert (GLUE / "SST-2" / "dev.tsv").is_file()


def run_probe(tmp_path: Path, ci: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CI": ci, "ELASTICBERT_SHARED_DATA": str(tmp_path / "absent")}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            *args,
            f"{HERE}::test_probe_needs_the_shared_glue_data",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=HERE.parents[2],
        timeout=120,
    )


def test_a_needs_data_skip_fails_in_ci_and_only_there(tmp_path):
    outside = run_probe(tmp_path, "")
    assert outside.returncode == 0 and "1 skipped" in outside.stdout, outside.stdout
    assert "[needs-data]" in outside.stdout
    inside = run_probe(tmp_path, "true")
    assert inside.returncode == 1, inside.stdout
    assert "CI: tests skipped for a missing requirement" in inside.stdout
    side_by_side = run_probe(tmp_path, "true", "-n", "1")  # as `make test` runs it: on a pytest-xdist worker
    assert side_by_side.returncode == 1, side_by_side.stdout
    assert "CI: tests skipped for a missing requirement" in side_by_side.stdout
