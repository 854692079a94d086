"""Shared by every test folder.

- `tests/support` (hub cache, fault injection, requirements) is put on sys.path: tests run with
  --import-mode=importlib; the venv's bin directory goes first on PATH.
- The skip policy (tests/support/requirements.py): outside CI, a test whose machine lacks ../shared/data, Slurm or
  a tool skips with a reason tagged [needs-data] / [needs-slurm] / [needs-tool]; inside CI (`CI=true`) such a skip
  fails the session, so a green CI run has run them all.
"""

import gc
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "support"))
# The venv's tools first (its ninja, not Debian's: the two discard each other's build log, so DeepSpeed's CPU ops
# would be rebuilt whenever a run inside Slurm follows one outside it, or the other way round).
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"

from requirements import ENFORCED_TAGS, in_ci  # noqa: E402

_enforced_skips: list[str] = []


def pytest_collection_finish(session):  # noqa: ANN001, ANN201 - pytest hook
    """Move what the collection imported (torch, transformers, DeepSpeed, ONNX: millions of objects that live to the
    end of the session) out of the garbage collector's sight (`gc.freeze`). Code under test that collects
    (data_prep's `release_freed_memory`, once per unit or band item) then scans only what the tests create: a
    full collection over the session's heap took ~0.2 s, and one dedup test made 149 of them (32 s; 3.8 s alone).
    A command run by users never carries that heap."""
    gc.freeze()


def pytest_runtest_logreport(report):  # noqa: ANN001, ANN201 - pytest hook
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2])
        if any(tag in reason for tag in ENFORCED_TAGS):
            _enforced_skips.append(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session, exitstatus):  # noqa: ANN001, ANN201 - pytest hook
    if in_ci() and _enforced_skips and exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # noqa: ANN001, ANN201 - pytest hook
    if not _enforced_skips:
        return
    if in_ci():
        terminalreporter.section("CI: tests skipped for a missing requirement (this fails the run)", red=True)
    else:
        terminalreporter.section("skipped for a missing requirement (CI runs them all)")
    for line in _enforced_skips:
        terminalreporter.write_line(line)
