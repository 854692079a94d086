"""Shared by every test folder.

- `tests/support` (hub cache, fault injection, requirements) is put on sys.path: tests run with
  --import-mode=importlib; the venv's bin directory goes first on PATH.
- The skip policy (tests/support/requirements.py): outside CI, a test whose machine lacks ../shared/data, Slurm or
  a tool skips with a reason tagged [needs-data] / [needs-slurm] / [needs-tool]; inside CI (`CI=true`) such a skip
  fails the session, so a green CI run has run them all.
- Side by side (`make test` runs pytest-xdist with two workers; `pytest -n 2` does the same): `SuiteScheduling`
  hands a worker whole test files, and every test under tests/slurm as ONE unit (they share the one local Slurm
  cluster, its nodes and its session fixtures: two workers submitting at once would queue each other's jobs past
  their timeouts). Files that hold a `slow` test go first, the Slurm unit first of all, so that the long units
  overlap the many short ones instead of ending the run alone.
"""

import gc
import os
import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "support"))
# On a pytest-xdist worker (`make test`), torch and its subprocesses take one thread each, unless OMP_NUM_THREADS says
# otherwise: two workers of torch's default two OpenMP threads are four threads on two cores, and an op whose thread
# team waits for a descheduled thread stalls (the 30-step fine-tuning run of tests/support/finetune_preemption.py, two
# copies side by side on this loaded box: 43.5 s and 13.7 CPU-s on one thread, 108.8 s and 46.2 CPU-s on two; see
# docs/test_time.md). Set before anything imports torch; every process of a test inherits it, so a reference computed
# in-process and a run in a subprocess still use the same thread count (their sums depend on it).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # An xdist worker ignores SIGINT (execnet), and an ignored signal stays ignored across exec: every command a test
    # starts would then shrug off the Ctrl-C that the interrupt tests send it. Python's own handler is reset at exec.
    signal.signal(signal.SIGINT, signal.default_int_handler)
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


SLURM_UNIT = "tests/slurm/"  # every test under it is one work unit of one worker


def work_unit(nodeid: str) -> str:
    """The unit of work a worker gets for the test `nodeid`: its file, or the whole Slurm folder."""
    path = nodeid.split("::", 1)[0]
    return SLURM_UNIT if path.startswith(SLURM_UNIT) else path


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):  # noqa: ANN001, ANN201 - pytest hook
    """Under xdist: the Slurm unit first, then the files that hold a `slow` test, then the rest (each group in
    collection order; the order only decides which unit a free worker takes next)."""
    if not hasattr(config, "workerinput"):  # not an xdist worker: the order stays as collected
        return
    slow_units = {work_unit(item.nodeid) for item in items if item.get_closest_marker("slow")}

    def rank(item) -> int:  # noqa: ANN001
        unit = work_unit(item.nodeid)
        return 0 if unit == SLURM_UNIT else 1 if unit in slow_units else 2

    items[:] = sorted(items, key=rank)  # stable


try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:  # pytest-xdist not installed: the suite runs in one process
    LoadScopeScheduling = None

if LoadScopeScheduling is not None:

    class SuiteScheduling(LoadScopeScheduling):
        """xdist's per-scope scheduling with `work_unit` as the scope, in collection order (not by test count)."""

        def __init__(self, config, log=None) -> None:  # noqa: ANN001
            super().__init__(config, log)
            config.option.loadscopereorder = False  # the workers' collection order is the schedule

        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    def pytest_xdist_make_scheduler(config, log):  # noqa: ANN001, ANN201 - xdist hook
        """Every load-balancing mode of `-n N` uses `SuiteScheduling` (`--dist each` and `no` stay as they are)."""
        if config.getoption("dist") in ("load", "loadscope", "loadfile", "loadgroup", "worksteal"):
            return SuiteScheduling(config, log)
        return None


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
