"""What a test needs from the machine, and the one way to skip when it is missing.

Outside CI a missing requirement skips the test with a one-line reason that starts with a tag; inside CI
(`CI=true`, as `.ci/run` sets it) tests/conftest.py turns every skip tagged [needs-data], [needs-slurm] or
[needs-tool] into a failure, so CI never passes with the Slurm or real-data tests silently left out.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHARED_DATA = Path(os.environ.get("ELASTICBERT_SHARED_DATA", REPO.parent / "shared" / "data"))
GLUE = SHARED_DATA / "glue"
GUTENBERG = SHARED_DATA / "corpus" / "gutenberg"
ENFORCED_TAGS = ("[needs-data]", "[needs-slurm]", "[needs-tool]")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing_data_reason(*paths: Path) -> str | None:
    """The skip reason when any of `paths` is absent, else None."""
    missing = [str(p) for p in paths if not p.exists()]
    if not missing:
        return None
    return (
        f"[needs-data] {', '.join(missing)} not found: the real-data tests read ../shared/data beside the "
        "checkout (set ELASTICBERT_SHARED_DATA to point elsewhere)"
    )


def require_data(*paths: Path) -> None:
    """Skip the calling test (or fixture) unless every path exists."""
    reason = missing_data_reason(*paths)
    if reason:
        pytest.skip(reason)
