"""Fault injection, audit class 7 of issue 38 ("Reliability IV": SIGTERM ended `finetune train` silently, killed by
the signal with no message and nothing saved): the preemption signals at the moments the issue does not name, and a
resume checkpoint that cannot be trusted.

What must hold: any signal of Slurm's (SIGTERM, SIGUSR1) at any moment - during a step, during the dev evaluation,
before the first step, twice while saving, while best/ is written, to one rank of two - leaves either a resume
checkpoint and exit 75 with one line saying where (the rerun ends bit-identical to an uninterrupted run) or, after
the last step, the finished run and exit 0; a damaged checkpoint is refused by name before anything loads (exit 2),
a save that cannot be written is exit 4 with nothing half-written taken for a checkpoint, a kill in the middle of
the save leaves nothing that is resumed; several processes without DeepSpeed are refused up front.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from faults import flip_bytes, small_tmpfs, truncate
from finetune_preemption import STEPS, record_phase_ends, results, signal_after_step, train_argv

from common.dist import free_port
from common.integrity import verify_directory
from finetune.__main__ import main

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted runs (computed once per argument list): results and the weights at each phase's end."""
    runs = {}

    def get(method: str = "jt", *extra: str) -> tuple[dict, list]:
        key = (method, *extra)
        if key not in runs:
            out = tmp_path_factory.mktemp("reference") / "run"
            with pytest.MonkeyPatch.context() as mp:
                ends = record_phase_ends(mp)
                assert main(train_argv(out, method, *extra)) == 0
            runs[key] = (results(out), ends)
        return runs[key]

    return get


def run(monkeypatch, capsys, out: Path, code: int, *extra: str, method: str = "jt", patch=None) -> tuple[str, list]:
    """`finetune train` in-process with `patch(monkeypatch)` applied; asserts the exit code; (stderr, phase ends)."""
    with monkeypatch.context() as mp:
        ends = record_phase_ends(mp)
        if patch is not None:
            patch(mp)
        capsys.readouterr()
        assert main(train_argv(out, method, *extra)) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err, ends


def send_during(target: str, sig: int = signal.SIGTERM, call: int = 1):
    """A patch: `sig` to this process inside the `call`-th call of module attribute `target` ('module:name'),
    before the real function runs."""
    module, name = target.split(":")

    def patch(mp: pytest.MonkeyPatch) -> None:
        import importlib

        mod = importlib.import_module(module)
        real = getattr(mod, name)
        calls = [0]

        def wrapper(*args, **kwargs):
            calls[0] += 1
            if calls[0] == call:
                os.kill(os.getpid(), sig)
            return real(*args, **kwargs)

        mp.setattr(mod, name, wrapper)

    return patch


def preempted_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("finetune: ") and "(exit 75)" in line]
    assert len(lines) == 1, err
    return lines[0]


# ------------------------------------------------------------------------------------------------- the signals
def test_sigusr1_is_a_preemption_like_sigterm(tmp_path, monkeypatch, capsys, reference):
    out = tmp_path / "run"
    err, before = run(monkeypatch, capsys, out, 75, patch=lambda mp: signal_after_step(mp, 3, signal.SIGUSR1))
    assert preempted_line(err).startswith(f"finetune: SIGUSR1 at train step 3 of {STEPS}: saved a resume checkpoint")
    _, after = run(monkeypatch, capsys, out, 0)
    assert (results(out), before + after) == reference()


def test_sigterm_during_the_dev_evaluation(tmp_path, monkeypatch, capsys, reference):
    """The evaluation in progress finishes (its score is part of the run), then the checkpoint is saved."""
    out = tmp_path / "run"
    err, _ = run(monkeypatch, capsys, out, 75, patch=send_during("finetune.train.trainer:predict_exits", call=2))
    assert "SIGTERM at train step 4 of 6: saved a resume checkpoint" in preempted_line(err)
    state = json.loads((out / "resume" / "train-step000004" / "state.json").read_text())
    assert [h["step"] for h in state["history"]] == [2, 4]
    _, after = run(monkeypatch, capsys, out, 0)
    assert (results(out), after) == reference()


def test_sigterm_while_best_is_written_finishes_the_run(tmp_path, monkeypatch, capsys, reference):
    """After the last step, writing the results is less work than a checkpoint: the run completes, says so, exit 0
    (a requeue would only be refused as a finished run)."""
    out = tmp_path / "run"
    err, _ = run(monkeypatch, capsys, out, 0, patch=send_during("finetune.train.trainer:seal"))
    assert "finetune: SIGTERM arrived after the last training step: the run finished writing its results" in err
    assert verify_directory(out / "best") == [] and not (out / "resume").exists()
    assert results(out) == reference()[0]


def test_a_second_signal_while_saving_does_not_cut_the_save_short(tmp_path, monkeypatch, capsys, reference):
    out = tmp_path / "run"

    def patch(mp):
        signal_after_step(mp, 3)
        send_during("finetune.train.checkpoint:save_tensors", signal.SIGTERM)(mp)  # a second SIGTERM ...
        send_during("finetune.train.checkpoint:save_torch", signal.SIGUSR1, call=2)(mp)  # ... and a SIGUSR1

    err, before = run(monkeypatch, capsys, out, 75, patch=patch)
    preempted_line(err)
    assert verify_directory(out / "resume" / "train-step000003") == []
    _, after = run(monkeypatch, capsys, out, 0)
    assert (results(out), before + after) == reference()


def test_sigterm_before_the_first_step(tmp_path, monkeypatch, capsys, reference):
    """While the model loads: nothing trained, nothing saved, exit 75; the rerun starts the run. The same on a
    resumed run: its checkpoint stays as it is."""
    out = tmp_path / "run"
    err, _ = run(monkeypatch, capsys, out, 75, patch=send_during("finetune.train.trainer:build_model"))
    line = preempted_line(err)
    assert "SIGTERM at train step 0 of 6: nothing trained yet, nothing saved" in line
    assert not (out / "resume").exists() and not (out / "best").exists()
    run(monkeypatch, capsys, out, 75, patch=lambda mp: signal_after_step(mp, 2))
    saved = {p.name: p.read_bytes() for p in (out / "resume" / "train-step000002").iterdir()}
    err, _ = run(monkeypatch, capsys, out, 75, patch=send_during("finetune.train.trainer:build_model"))
    assert f"the resume checkpoint {out / 'resume' / 'train-step000002'} stays" in preempted_line(err)
    assert {p.name: p.read_bytes() for p in (out / "resume" / "train-step000002").iterdir()} == saved
    _, after = run(monkeypatch, capsys, out, 0)
    assert (results(out), after) == reference()


@pytest.mark.slow
def test_a_real_sigterm_from_outside(tmp_path, reference):
    """As Slurm sends it: to the `python -m finetune train` process, at whatever moment it is in."""
    out = tmp_path / "run"
    argv = train_argv(out, "jt", "--train-steps", "30", "--eval-every", "10")
    proc = subprocess.Popen([sys.executable, "-m", "finetune", *argv], cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not list((out / "tensorboard").glob("events.*")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 75, err[-3000:]
    line = preempted_line(err)
    assert "SIGTERM at train step" in line and "saved a resume checkpoint in" in line and "Traceback" not in err
    resumed = subprocess.run([sys.executable, "-m", "finetune", *argv], cwd=tmp_path, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming the preempted run from" in resumed.stderr
    assert results(out) == reference("jt", "--train-steps", "30", "--eval-every", "10")[0]


# -------------------------------------------------------------------------------------- a checkpoint not to trust
DAMAGE = {
    "truncated weights": lambda tag: truncate(tag / "model.safetensors"),
    "flipped optimizer bytes": lambda tag: flip_bytes(tag / "trainer.pt"),
    "flipped random states": lambda tag: flip_bytes(tag / "rng_rank0.pt", count=4),
    "no checksums": lambda tag: (tag / "checksums.json").unlink(),
    "garbage state.json": lambda tag: (tag / "state.json").write_text("{not json"),
    "state.json of another shape": lambda tag: (tag / "state.json").write_text('{"format": 1, "step": "3"}'),
    "latest names nothing": lambda tag: (tag.parent / "latest").write_text("train-step000099\n"),
}


@pytest.fixture(scope="module")
def preempted(tmp_path_factory) -> Path:
    """A run stopped by SIGTERM after step 3 (copied by each test that damages it)."""
    out = tmp_path_factory.mktemp("preempted") / "run"
    with pytest.MonkeyPatch.context() as mp:
        signal_after_step(mp, 3)
        assert main(train_argv(out)) == 75
    return out


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_resume_checkpoint_is_refused_by_name(tmp_path, monkeypatch, capsys, preempted, damage):
    out = tmp_path / "run"
    shutil.copytree(preempted, out)
    DAMAGE[damage](out / "resume" / "train-step000003")
    err, ends = run(monkeypatch, capsys, out, 2)
    message = err[err.index("finetune: error: ") :]
    assert str(out / "resume") in message and "--overwrite" in message, message
    assert len(message.strip().splitlines()) == 1, message
    assert ends == [] and not (out / "best").exists()  # refused before training


def test_overwrite_starts_a_damaged_preempted_run_over(tmp_path, monkeypatch, capsys, preempted, reference):
    """--overwrite discards the checkpoint at once: a new run stopped before it saved anything never brings the
    discarded one back."""
    out = tmp_path / "run"
    shutil.copytree(preempted, out)
    flip_bytes(out / "resume" / "train-step000003" / "model.safetensors")
    err, _ = run(monkeypatch, capsys, out, 75, "--overwrite", patch=send_during("finetune.train.trainer:build_model"))
    assert "discarding the preempted run" in err and not (out / "resume").exists()
    err, _ = run(monkeypatch, capsys, out, 0)
    assert "interrupted before it wrote best/; starting over" in err
    assert results(out) == reference()[0]


def test_disk_full_while_the_resume_checkpoint_is_written(tmp_path, monkeypatch, capsys):
    """Exit 4 naming the checkpoint; nothing half-written is left or taken for a checkpoint."""
    with small_tmpfs(tmp_path / "small", "8m") as small:
        out = small / "run"
        err, _ = run(monkeypatch, capsys, out, 4, patch=lambda mp: signal_after_step(mp, 2))
        assert (
            f"finetune: error: the resume checkpoint {out / 'resume' / 'train-step000002'} could not be written" in err
        )
        assert "No space left on device" in err and "stays on (none: a rerun starts over)" in err
        assert list((out / "resume").iterdir()) == []


KILL_WHILE_SAVING = textwrap.dedent(
    """
    import os, signal, sys
    import finetune.train.checkpoint as checkpoint
    sys.path.insert(0, sys.argv[1])
    from finetune_preemption import signal_after_step
    import pytest

    real = checkpoint.save_tensors
    def killed(path, tensors):  # the first file of the checkpoint is written, then Slurm's SIGKILL
        real(path, tensors)
        os.kill(os.getpid(), signal.SIGKILL)
    checkpoint.save_tensors = killed
    signal_after_step(pytest.MonkeyPatch(), 3)
    from finetune.__main__ import main
    sys.exit(main(sys.argv[2:]))
    """
)


def test_a_kill_in_the_middle_of_the_save_is_never_resumed(tmp_path, monkeypatch, capsys, reference):
    """SIGTERM, then SIGKILL before the checkpoint is committed: `latest` never named it; the rerun starts over
    and ends as the uninterrupted run."""
    out = tmp_path / "run"
    support = str(REPO / "tests" / "support")
    killed = subprocess.run(
        [sys.executable, "-c", KILL_WHILE_SAVING, support, *train_argv(out)], cwd=tmp_path, capture_output=True
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-3000:]
    assert (out / "resume" / "train-step000003" / "model.safetensors").is_file()
    assert not (out / "resume" / "latest").exists()
    err, _ = run(monkeypatch, capsys, out, 0)
    assert "interrupted before it wrote best/; starting over" in err and not (out / "resume").exists()
    assert results(out) == reference()[0]


# ------------------------------------------------------------------------------------------ several processes
def test_several_processes_without_deepspeed_are_refused(tmp_path, monkeypatch, capsys):
    for key, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    err, _ = run(monkeypatch, capsys, tmp_path / "run", 2)
    assert "2 processes (torchrun) but no --ds-config" in err and not (tmp_path / "run").exists()


RANK_RUN = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[1])
    from finetune_preemption import signal_after_step
    import pytest
    if int(sys.argv[2]) >= 0:
        signal_after_step(pytest.MonkeyPatch(), int(sys.argv[2]), rank=1)  # Slurm's signal reaching rank 1 only
    from finetune.__main__ import main
    sys.exit(main(sys.argv[3:]))
    """
)


def two_ranks(tmp_path: Path, argv: list[str], signal_at: int) -> list[subprocess.CompletedProcess]:
    """Both ranks of a DeepSpeed run launched as torchrun and srun do (RANK/WORLD_SIZE/MASTER_* per process)."""
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1"}
        env.update({"MASTER_PORT": port, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"})
        env["TORCH_EXTENSIONS_DIR"] = str(tmp_path / "torch_extensions")  # where a JIT build of a DeepSpeed op would go
        cmd = [sys.executable, "-c", RANK_RUN, str(REPO / "tests" / "support"), str(signal_at), *argv]
        procs.append(subprocess.Popen(cmd, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True))
    done = []
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, "", err))
    return done


@pytest.mark.slow
def test_sigterm_to_one_of_two_deepspeed_ranks(tmp_path):
    """Any rank signalled -> all save (one vote per step), each rank its random states, exit 75 on both; the resumed
    2-process run ends bit-identical to an uninterrupted one. No rank built a DeepSpeed op on the way (the CPU shm
    collective: `common.deepspeed_import`)."""
    pytest.importorskip("deepspeed")
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 1}, "steps_per_print": 10**9}))
    reference, out = tmp_path / "reference", tmp_path / "run"
    assert [p.returncode for p in two_ranks(tmp_path, train_argv(reference, "jt", "--ds-config", str(ds)), -1)] == [
        0,
        0,
    ]
    first = two_ranks(tmp_path, train_argv(out, "jt", "--ds-config", str(ds)), 3)
    assert [p.returncode for p in first] == [75, 75], first[0].stderr[-3000:] + first[1].stderr[-3000:]
    assert "a peer rank at train step 3 of 6: saved a resume checkpoint" in preempted_line(first[0].stderr)
    assert "(exit 75)" not in first[1].stderr  # one line for the job, from rank 0
    tag = out / "resume" / "train-step000003"
    assert (tag / "rng_rank0.pt").is_file() and (tag / "rng_rank1.pt").is_file() and verify_directory(tag) == []
    second = two_ranks(tmp_path, train_argv(out, "jt", "--ds-config", str(ds)), -1)
    assert [p.returncode for p in second] == [0, 0], second[0].stderr[-3000:]
    assert results(out) == results(reference)
    assert not (tmp_path / "torch_extensions").exists()
