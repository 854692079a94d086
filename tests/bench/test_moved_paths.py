"""The benches' old flat paths keep working one release (bench/moved.py): every old name maps to a script that
exists, keeps a stub that hands itself to the forwarder, and runs the new script with one note naming it, with the
same arguments and exit code; the flat module names still import, as the moved modules, with a warning."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
sys.path.insert(0, str(REPO))

from bench.moved import MOVED  # noqa: E402

STAGES = {"data", "pretrain", "finetune", "serving", "gpu"}


def test_every_old_name_maps_to_an_existing_script_and_keeps_a_forwarding_stub():
    for old, new in MOVED.items():
        assert (BENCH / new).is_file(), f"bench/{old} -> bench/{new}: no such file"
        assert new.split("/")[0] in STAGES and Path(new).suffix == Path(old).suffix, (old, new)
        stub = (BENCH / old).read_text(encoding="utf-8")
        if old.endswith(".py"):
            assert "forward(__file__, sys.argv[1:])" in stub, f"bench/{old} does not forward"
        else:
            assert 'exec python3 "$(dirname "$0")/moved.py" "$0" "$@"' in stub, f"bench/{old} does not forward"
            assert (BENCH / old).stat().st_mode & 0o111, f"bench/{old} is not executable"
        assert len(stub.splitlines()) <= 8, f"bench/{old}: a stub holds nothing but the hand-over"
    # every script in a stage folder was either moved there (so has an old path) or is new since
    scripts = {str(p.relative_to(BENCH)) for p in BENCH.glob("*/*") if p.suffix in (".py", ".sh")}
    assert set(MOVED.values()) <= scripts
    # and nothing else is left flat in bench/ than the stubs and the shared modules
    flat = {p.name for p in BENCH.iterdir() if p.is_file() and p.suffix in (".py", ".sh")}
    assert flat - set(MOVED) == {"__init__.py", "harness.py", "moved.py"}


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)


def test_an_old_python_path_runs_the_new_script_with_a_note_and_its_exit_code():
    done = run(sys.executable, "bench/dedup_quality.py", "--help")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0].startswith("note: bench/dedup_quality.py moved to bench/data/dedup_quality.py")
    assert "usage: dedup_quality.py" in done.stdout and "--output" in done.stdout  # the new script's own help
    wrong = run(sys.executable, "bench/dedup_quality.py", "--no-such-option")
    assert wrong.returncode == 2 and "unrecognized arguments: --no-such-option" in wrong.stderr


def test_an_old_shell_path_runs_the_new_script_with_a_note_and_its_exit_code():
    done = run("bash", "bench/gpu_check.sh", "/unused", "--fast", "--list")
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == (
        "note: bench/gpu_check.sh moved to bench/gpu/gpu_check.sh; running that (the old path goes in the next release)"
    )
    assert done.stdout.strip() == "gpu_check fast on cuda: corpus tests overhead onnx-cuda report"
    wrong = run(str(BENCH / "gpu_check.sh"), "/unused", "--quick")  # run as a program, from its own #!
    assert wrong.returncode == 2 and "unknown option --quick" in wrong.stderr


def test_an_old_module_path_imports_the_moved_module_with_a_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from bench import dedup_data as old
    import bench.data.dedup_data as new

    assert old is new
    assert any("bench.data.dedup_data" in str(w.message) and w.category is DeprecationWarning for w in caught)
